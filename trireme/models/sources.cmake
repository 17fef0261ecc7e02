# models/: reference workloads. The GPT's config (checks, closed-form size) is pure; the
# module itself is torch.
target_sources(trireme_core PRIVATE trireme/models/gpt_config.cpp)
target_sources(trireme PRIVATE trireme/models/gpt.cpp)
