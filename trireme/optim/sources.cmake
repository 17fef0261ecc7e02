# optim/: learning-rate schedule (pure) and global gradient-norm clipping (libtorch).
target_sources(trireme_core PRIVATE trireme/optim/lr_schedule.cpp)
target_sources(trireme PRIVATE trireme/optim/clip.cpp)
