# dist/: rank arithmetic and environment parsing are pure; the store, groups and backends
# face libtorch's c10d. The NCCL backend is a separate plugin (dist/nccl/plugin.cmake).
target_sources(trireme_core PRIVATE
  trireme/dist/mesh.cpp
  trireme/dist/world_env.cpp)
target_sources(trireme PRIVATE
  trireme/dist/backend.cpp
  trireme/dist/world.cpp
  trireme/dist/gloo/backend.cpp)
# c10d's Gloo declarations are only visible with USE_C10D_GLOO (libtorch_cpu has Gloo).
set_source_files_properties(trireme/dist/gloo/backend.cpp PROPERTIES
  COMPILE_DEFINITIONS USE_C10D_GLOO SKIP_PRECOMPILE_HEADERS ON)
