// Reading the launcher's environment; see dist/world_env.h for the variables.
#include "trireme/dist/world_env.h"

#include <algorithm>
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
  // Digits only: strtol alone would take " 4", "+4" and "4abc" (its prefix).
  const bool digits = std::strspn(text, "0123456789") == std::strlen(text);
  errno = 0;
  const long value = digits ? std::strtol(text, nullptr, 10) : -1;
  TRIREME_CHECK(digits && errno == 0 && value <= 1 << 30, "environment variable ", name, "='", text,
                "' is not an integer in 0..", 1 << 30, "; fix what the launcher exports");
  return static_cast<int>(value);
}

// Tasks on node `node` from Slurm's SLURM_TASKS_PER_NODE, a list of counts in node order
// where "N(xK)" stands for K nodes of N tasks each: "2(x3),1" is 2,2,2,1. 0 when the text
// does not parse or has no such node.
int slurm_tasks_on_node(const std::string& text, int node) {
  size_t at = 0;
  while (at < text.size()) {
    char* end = nullptr;
    const long tasks = std::strtol(text.c_str() + at, &end, 10);
    if (end == text.c_str() + at || tasks < 1 || tasks > 1 << 30) return 0;
    at = end - text.c_str();
    long repeat = 1;
    if (text.compare(at, 2, "(x") == 0) {
      repeat = std::strtol(text.c_str() + at + 2, &end, 10);
      if (end == text.c_str() + at + 2 || *end != ')' || repeat < 1) return 0;
      at = end - text.c_str() + 1;
    }
    if (node < repeat) return static_cast<int>(tasks);
    node -= static_cast<int>(repeat);
    if (at == text.size() || text[at] != ',') return 0;
    ++at;
  }
  return 0;
}

std::string read_string(const EnvLookup& lookup, const char* name, const std::string& fallback) {
  const char* text = lookup(name);
  return text && *text ? std::string(text) : fallback;
}

// `addr_required`: Slurm and Open MPI do not export MASTER_ADDR, and 127.0.0.1 would send
// every machine's ranks to a store on their own machine (on one machine it is right);
// torchrun and trireme run always export it.
void read_master(const EnvLookup& lookup, WorldInfo* info, bool addr_required) {
  TRIREME_CHECK(!addr_required || !info->spans_machines() || read_string(lookup, "MASTER_ADDR", "") != "",
                "MASTER_ADDR is not set for a ", info->source, " job of ", info->world_size, " ranks on ",
                "several machines; export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) to every rank");
  info->master_addr = read_string(lookup, "MASTER_ADDR", "127.0.0.1");
  info->master_port = read_int(lookup, "MASTER_PORT", 0, info->world_size > 1);
  TRIREME_CHECK(info->master_port <= 65535, "MASTER_PORT=", info->master_port,
                " is not a valid port");
  // Rank 0 would host the store on a port of its own choosing, which no other rank knows.
  TRIREME_CHECK(info->world_size <= 1 || info->master_port >= 1, "MASTER_PORT=0 with ", info->world_size,
                " ranks: the other ranks cannot find the store; export the port rank 0 listens on (1-65535)");
}

// The variables each launcher gives its place in, for messages.
struct SourceVariables {
  const char *rank, *world_size, *local_rank, *local_world_size;
};

SourceVariables variables_of(const std::string& source) {
  if (source == "slurm")
    return {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE/SLURM_NTASKS_PER_NODE"};
  if (source == "openmpi")
    return {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE"};
  return {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
}

void check_consistent(const WorldInfo& info) {
  const SourceVariables vars = variables_of(info.source);
  TRIREME_CHECK(info.world_size >= 1, vars.world_size, "=", info.world_size, ": the world size must be at least 1 (",
                info.source, " environment); fix what the launcher exports");
  TRIREME_CHECK(info.rank < info.world_size, vars.rank, "=", info.rank, " is not below ", vars.world_size, "=",
                info.world_size, " (", info.source, " environment); fix what the launcher exports");
  TRIREME_CHECK(info.local_rank < info.local_world_size, vars.local_rank, "=", info.local_rank, " is not below ",
                vars.local_world_size, "=", info.local_world_size, " (", info.source,
                " environment); fix what the launcher exports");
  // A machine cannot hold more ranks than the job; taken as given, a job on several
  // machines would be thought to fit on one.
  TRIREME_CHECK(info.local_world_size <= info.world_size, vars.local_world_size, "=", info.local_world_size,
                " is above ", vars.world_size, "=", info.world_size, " (", info.source,
                " environment); fix what the launcher exports");
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
    read_master(lookup, &info, false);
  } else if (lookup("SLURM_PROCID") && lookup("SLURM_NTASKS")) {
    info.source = "slurm";
    info.rank = read_int(lookup, "SLURM_PROCID", 0, true);
    info.world_size = read_int(lookup, "SLURM_NTASKS", 1, true);
    info.local_rank = read_int(lookup, "SLURM_LOCALID", 0, false);
    info.node_rank = read_int(lookup, "SLURM_NODEID", 0, false);
    // Tasks on this node: this node's entry of SLURM_TASKS_PER_NODE ("2(x3),1", set by
    // srun: the counts it placed), else SLURM_NTASKS_PER_NODE ("4", set only under
    // --ntasks-per-node, and only a maximum when -n is given too: -N2 -n4
    // --ntasks-per-node=4 places 2 and 2), else an even split over SLURM_NNODES.
    if (const int tasks = slurm_tasks_on_node(read_string(lookup, "SLURM_TASKS_PER_NODE", ""), info.node_rank);
        tasks > 0) {
      info.local_world_size = tasks;
    } else if (const int per_node = read_int(lookup, "SLURM_NTASKS_PER_NODE", 0, false); per_node > 0) {
      info.local_world_size = per_node;
    } else {
      const int nodes = std::max(1, read_int(lookup, "SLURM_NNODES", 1, false));
      info.local_world_size = std::max((info.world_size + nodes - 1) / nodes, info.local_rank + 1);
    }
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
