# launch/: the node agent behind `trireme run`. Everything is pure except the TCPStore
# channel and launch(), which opens it.
target_sources(trireme_core PRIVATE
  trireme/launch/agent.cpp
  trireme/launch/exit_status.cpp
  trireme/launch/group_guard.cpp
  trireme/launch/membership.cpp
  trireme/launch/options.cpp
  trireme/launch/output.cpp
  trireme/launch/process.cpp
  trireme/launch/restart_clock.cpp
  trireme/launch/standby.cpp
  trireme/launch/worker_env.cpp)
target_sources(trireme PRIVATE
  trireme/launch/launch.cpp
  trireme/launch/tcp_store_channel.cpp)
