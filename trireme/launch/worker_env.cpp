// Worker environment: see worker_env.h.
#include "trireme/launch/worker_env.h"

namespace trireme::launch {
namespace {

std::string key_of(const std::string& entry) { return entry.substr(0, entry.find('=')); }

bool has_key(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& entry : env)
    if (key_of(entry) == key) return true;
  return false;
}

}  // namespace

EnvVars host_allocator_variables() {
  return {{"MALLOC_MMAP_THRESHOLD_", "33554432"},   // 32 MiB (glibc's own dynamic maximum)
          {"MALLOC_TRIM_THRESHOLD_", "1073741824"},  // 1 GiB
          {"MALLOC_TOP_PAD_", "67108864"}};          // grow the heap 64 MiB at a time
}

EnvVars torchrun_variables(const LaunchOptions& options, int local_rank, const JobInfo& job) {
  const int position = job.node_position >= 0 ? job.node_position : options.node_rank;
  const int nodes = job.nodes >= 0 ? job.nodes : options.nnodes;
  const int world_size = nodes * options.nproc_per_node;
  const int rank = position * options.nproc_per_node + local_rank;
  EnvVars vars = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(position)},
      {"GROUP_WORLD_SIZE", std::to_string(nodes)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", job.master_addr},
      {"MASTER_PORT", std::to_string(job.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(job.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {"TORCHELASTIC_RUN_ID", job.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
  };
  if (job.tty) vars.emplace_back("TRIREME_TTY", "1");
  if (elastic(options)) vars.emplace_back("TRIREME_ELASTIC", "1");
  vars.emplace_back("TRIREME_NODE_RANK", std::to_string(options.node_rank));  // the agent's --node-rank
  if (!job.snapshot_dir.empty()) vars.emplace_back("TRIREME_SNAPSHOT_DIR", job.snapshot_dir);
  return vars;
}

std::vector<std::string> merge_environment(const std::vector<std::string>& base,
                                           const EnvVars& vars) {
  std::vector<std::string> env = base;
  for (const auto& [key, value] : vars) {
    const std::string entry = key + "=" + value;
    bool replaced = false;
    for (auto& existing : env) {
      if (key_of(existing) == key) {
        existing = entry;
        replaced = true;
      }
    }
    if (!replaced) env.push_back(entry);
  }
  return env;
}

std::vector<std::string> worker_environment(const std::vector<std::string>& base,
                                            const LaunchOptions& options, int local_rank,
                                            const JobInfo& job) {
  EnvVars vars = torchrun_variables(options, local_rank, job);
  if (!has_key(base, "OMP_NUM_THREADS")) vars.emplace_back("OMP_NUM_THREADS", "1");
  // glibc malloc kept from giving memory back: a training step frees and allocates the
  // same tens of MiB of tensors every step, and each one glibc mmaps afresh (or trims from
  // the heap) comes back as page faults, zeroed by the kernel on first touch (about 11,000
  // faults per rank per step for the reference GPT pipeline at p=2, whose tokens/s rose by
  // 5-15% without them: docs/design-notes.md "Worker processes"). Left alone
  // when the caller tuned malloc itself (any of these, GLIBC_TUNABLES or an LD_PRELOADed
  // allocator).
  if (!has_key(base, "GLIBC_TUNABLES") && !has_key(base, "LD_PRELOAD")) {
    for (const auto& [key, value] : host_allocator_variables())
      if (!has_key(base, key)) vars.emplace_back(key, value);
  }
  vars.insert(vars.end(), options.extra_env.begin(), options.extra_env.end());
  return merge_environment(base, vars);
}

}  // namespace trireme::launch
