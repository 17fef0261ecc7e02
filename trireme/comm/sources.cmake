# comm/: bucket assignment and ZeRO sharding (pure); the ring reduce-scatter.
target_sources(trireme_core PRIVATE trireme/comm/bucket.cpp trireme/comm/shard.cpp)
target_sources(trireme PRIVATE trireme/comm/reduce_scatter.cpp)
