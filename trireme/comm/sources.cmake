# comm/: bucket assignment (pure).
target_sources(trireme_core PRIVATE trireme/comm/bucket.cpp)
