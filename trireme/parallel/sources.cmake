# parallel/: data/ (DataParallel, ZeRO), pipeline/, tensor/.
target_sources(trireme PRIVATE trireme/parallel/data/data_parallel.cpp trireme/parallel/data/zero.cpp)
# pipeline/: schedules as data (pure).
target_sources(trireme_core PRIVATE
  trireme/parallel/pipeline/partition.cpp
  trireme/parallel/pipeline/picture.cpp
  trireme/parallel/pipeline/schedule.cpp)
target_sources(trireme PRIVATE
  trireme/parallel/pipeline/deferred_linear.cpp
  trireme/parallel/pipeline/executor.cpp
  trireme/parallel/pipeline/stage.cpp)
# tensor/: Megatron-style tensor-parallel operators and layers.
target_sources(trireme PRIVATE trireme/parallel/tensor/tensor_parallel.cpp)
