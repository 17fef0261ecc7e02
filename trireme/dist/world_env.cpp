// Reading the launcher's environment; see dist/world_env.h for the variables.
#include "trireme/dist/world_env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "trireme/common/error.h"

namespace trireme::dist {
namespace {

int read_int(const EnvLookup& lookup, const char* name, int fallback, bool required) {
  const char* text = lookup(name);
  if (!text || !*text) {
    TRIREME_CHECK(!required, "environment variable ", name,
                  " is not set; start workers with 'trireme run' or torchrun");
    return fallback;
  }
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TRIREME_CHECK(*end == '\0' && errno == 0 && value >= 0 && value <= 1 << 30,
                "environment variable ", name, "='", text, "' is not a non-negative integer");
  return static_cast<int>(value);
}

std::string read_string(const EnvLookup& lookup, const char* name, const std::string& fallback) {
  const char* text = lookup(name);
  return text && *text ? std::string(text) : fallback;
}

void read_master(const EnvLookup& lookup, WorldInfo* info, bool required) {
  info->master_addr = read_string(lookup, "MASTER_ADDR", "127.0.0.1");
  info->master_port = read_int(lookup, "MASTER_PORT", 0, required && info->world_size > 1);
  TRIREME_CHECK(info->master_port <= 65535, "MASTER_PORT=", info->master_port,
                " is not a valid port");
  // Rank 0 would host the store on a port of its own choosing, which no other rank knows.
  TRIREME_CHECK(info->world_size <= 1 || info->master_port >= 1, "MASTER_PORT=0 with ", info->world_size,
                " ranks: the other ranks cannot find the store; export the port rank 0 listens on (1-65535)");
}

void check_consistent(const WorldInfo& info) {
  TRIREME_CHECK(info.world_size >= 1, "world size must be at least 1, got ", info.world_size, " (", info.source,
                " environment: WORLD_SIZE, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE)");
  TRIREME_CHECK(info.rank < info.world_size, "rank ", info.rank, " is not below world size ",
                info.world_size, " (", info.source, " environment)");
  TRIREME_CHECK(info.local_rank < info.local_world_size, "local rank ", info.local_rank,
                " is not below local world size ", info.local_world_size);
}

}  // namespace

WorldInfo world_info_from_env(const EnvLookup& lookup) {
  WorldInfo info;
  // Half of torchrun's pair is a launcher's mistake, not a single process: every process
  // would train alone as rank 0 and write the same outputs.
  TRIREME_CHECK(!lookup("RANK") == !lookup("WORLD_SIZE"), lookup("RANK") ? "RANK" : "WORLD_SIZE",
                " is set but ", lookup("RANK") ? "WORLD_SIZE" : "RANK",
                " is not; export both (torchrun's variables) or start the job with 'trireme run'");
  if (lookup("RANK") && lookup("WORLD_SIZE")) {
    info.source = "torchrun";
    info.rank = read_int(lookup, "RANK", 0, true);
    info.world_size = read_int(lookup, "WORLD_SIZE", 1, true);
    info.local_rank = read_int(lookup, "LOCAL_RANK", info.rank, false);
    info.local_world_size = read_int(lookup, "LOCAL_WORLD_SIZE", info.world_size, false);
    info.node_rank = read_int(lookup, "GROUP_RANK", 0, false);
    info.restart_count = read_int(lookup, "TORCHELASTIC_RESTART_COUNT", 0, false);
    const std::string agent = read_string(lookup, "TORCHELASTIC_USE_AGENT_STORE", "");
    info.agent_hosts_store = agent == "True" || agent == "true" || agent == "1";
    read_master(lookup, &info, true);
  } else if (lookup("SLURM_PROCID") && lookup("SLURM_NTASKS")) {
    info.source = "slurm";
    info.rank = read_int(lookup, "SLURM_PROCID", 0, true);
    info.world_size = read_int(lookup, "SLURM_NTASKS", 1, true);
    info.local_rank = read_int(lookup, "SLURM_LOCALID", 0, false);
    // SLURM_NTASKS_PER_NODE may read "4" or "4(x2)"; strtol's prefix is what we want, so
    // take the leading digits only.
    std::string per_node = read_string(lookup, "SLURM_NTASKS_PER_NODE", "");
    per_node = per_node.substr(0, per_node.find_first_not_of("0123456789"));
    info.local_world_size = per_node.empty() ? info.world_size : std::atoi(per_node.c_str());
    info.node_rank = read_int(lookup, "SLURM_NODEID", 0, false);
    read_master(lookup, &info, true);
  } else if (lookup("OMPI_COMM_WORLD_RANK") && lookup("OMPI_COMM_WORLD_SIZE")) {
    info.source = "openmpi";
    info.rank = read_int(lookup, "OMPI_COMM_WORLD_RANK", 0, true);
    info.world_size = read_int(lookup, "OMPI_COMM_WORLD_SIZE", 1, true);
    info.local_rank = read_int(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", 0, false);
    info.local_world_size = read_int(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", info.world_size, false);
    info.node_rank = read_int(lookup, "OMPI_COMM_WORLD_NODE_RANK", 0, false);
    read_master(lookup, &info, true);
  }
  check_consistent(info);
  return info;
}

WorldInfo world_info_from_env() {
  return world_info_from_env([](const char* name) { return std::getenv(name); });
}

}  // namespace trireme::dist
