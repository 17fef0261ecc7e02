# obs/: metrics lines, timelines and the progress line (all pure).
target_sources(trireme_core PRIVATE
  trireme/obs/json.cpp
  trireme/obs/metrics.cpp
  trireme/obs/plot.cpp
  trireme/obs/progress.cpp
  trireme/obs/timeline.cpp)
