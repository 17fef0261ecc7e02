# obs/: metrics lines, timelines and the progress line (all pure).
target_sources(trireme_core PRIVATE
  trireme/obs/json.cpp
  trireme/obs/metrics.cpp
  trireme/obs/plot.cpp
  trireme/obs/progress.cpp
  trireme/obs/timeline.cpp)
# The parameter dump handles tensors, so it lives in the libtorch-facing library.
target_sources(trireme PRIVATE trireme/obs/param_dump.cpp)
# The CPU memory counter wraps libtorch's CPU allocator.
target_sources(trireme PRIVATE trireme/obs/memory.cpp)
