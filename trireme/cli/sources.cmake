# The CLI: flag parsing is pure (in trireme_core so unit tests reach it); the subcommands
# link the library.
target_sources(trireme_core PRIVATE trireme/cli/flags.cpp trireme/cli/train_options.cpp)
target_sources(trireme_cli PRIVATE
  trireme/cli/main.cpp
  trireme/cli/run.cpp
  trireme/cli/checkpoint.cpp
  trireme/cli/schedule.cpp
  trireme/cli/store.cpp
  trireme/cli/report.cpp
  trireme/cli/launch_flags.cpp
  trireme/cli/plan.cpp
  trireme/cli/plan_trials.cpp
  trireme/cli/profile.cpp
  trireme/cli/profile_source.cpp
  trireme/cli/simulate.cpp
  trireme/cli/train_data_parallel.cpp
  trireme/cli/train_engine.cpp
  trireme/cli/train_gpt.cpp
  trireme/cli/train_pipeline.cpp
  trireme/cli/train_worker.cpp)
