# ft/: checkpoint boxes and Reed–Solomon erasure coding (pure); the layout-independent
# on-disk checkpoint; in-memory snapshots (CUDA state copied to the host on a side
# stream); the agents' parity exchange and rebuild, and the keeper that runs them in the
# background (ParityKeeper), which leaves replicated slices out of the coding.
target_sources(trireme_core PRIVATE trireme/ft/box.cpp trireme/ft/erasure.cpp
  trireme/ft/redundancy.cpp)
target_sources(trireme PRIVATE trireme/ft/checkpoint.cpp trireme/ft/checksum.cpp trireme/ft/host_copy.cpp
  trireme/ft/parity_exchange.cpp trireme/ft/parity_keeper.cpp trireme/ft/protected_blob.cpp
  trireme/ft/resume.cpp trireme/ft/snapshot.cpp)
