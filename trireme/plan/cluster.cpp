#include "trireme/plan/cluster.h"

#include <unistd.h>

#include <filesystem>
#include <limits>

#include "trireme/common/error.h"
#include "trireme/plan/json_reader.h"

namespace trireme::plan {

extern const char* const kDevicesJson;  // generated from devices.json

double MachineGroup::speed(const Profile& profile) const {
  return relative_speed > 0 ? relative_speed : tflops / profile.reference_tflops;
}

int Cluster::devices() const {
  int n = 0;
  for (const MachineGroup& g : groups) n += g.devices();
  return n;
}

int Cluster::machines() const {
  int n = 0;
  for (const MachineGroup& g : groups) n += g.machines;
  return n;
}

const std::vector<DeviceSpec>& device_catalog() {
  static const std::vector<DeviceSpec> catalog = [] {
    const nlohmann::json doc = Field::parse(kDevicesJson, "devices.json");
    std::vector<DeviceSpec> out;
    for (const Field& f : Field(doc, "", "devices.json").at("devices").items()) {
      DeviceSpec d;
      d.name = f.at("name").str();
      d.tflops = f.at("tflops").positive();
      d.memory_gib = f.at("memory_gib").positive();
      d.intra = Link{f.at("intra_latency_us").non_negative() * 1e-6,
                     f.at("intra_bandwidth_GBps").positive() * 1e9};
      d.source = f.at("source").str();
      out.push_back(d);
    }
    return out;
  }();
  return catalog;
}

const DeviceSpec& find_device(const std::string& name) {
  std::string known;
  for (const DeviceSpec& d : device_catalog()) {
    if (d.name == name) return d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  TRIREME_THROW(InvalidArgument, "unknown device '", name, "'; known devices: ", known,
                " (or give tflops and memory_gib)");
}

namespace {

MachineGroup read_group(const Field& f) {
  f.only({"name", "device", "machines", "devices_per_machine", "tflops", "relative_speed",
          "memory_gib", "intra_bandwidth_GBps", "intra_latency_us", "inter_bandwidth_gbps",
          "inter_latency_us", "price_per_hour", "spot", "preemptions_per_hour", "trace"});
  MachineGroup g;
  g.device = f.at("device").str();
  g.name = f.str_or("name", g.device);
  g.machines = f.at("machines").bounded(1);
  g.devices_per_machine = f.bounded_or("devices_per_machine", 1, 1);
  const DeviceSpec* known = nullptr;
  for (const DeviceSpec& d : device_catalog())
    if (d.name == g.device) known = &d;
  if (f.has("tflops") && f.has("relative_speed"))
    f.at("relative_speed").fail("and tflops both given; give one of them");
  g.relative_speed = f.positive_or("relative_speed", 0);
  g.tflops = f.positive_or("tflops", known ? known->tflops : 0);
  if (g.relative_speed > 0) g.tflops = 0;
  const double memory_gib = f.positive_or("memory_gib", known ? known->memory_gib : 0);
  if (!known && (g.tflops == 0 && g.relative_speed == 0))
    f.at("device").fail("'" + g.device + "' is not in the device catalog (" +
                        [] {
                          std::string names;
                          for (const DeviceSpec& d : device_catalog())
                            names += (names.empty() ? "" : ", ") + d.name;
                          return names;
                        }() +
                        "); give tflops (or relative_speed) and memory_gib for it");
  if (memory_gib == 0) f.at("memory_gib").fail("is needed for a device not in the catalog");
  g.memory_bytes = memory_gib * 1024.0 * 1024.0 * 1024.0;
  g.intra = known ? known->intra : Link{};
  if (f.has("intra_bandwidth_GBps")) g.intra.bandwidth_Bps = f.at("intra_bandwidth_GBps").positive() * 1e9;
  if (f.has("intra_latency_us")) g.intra.latency_s = f.at("intra_latency_us").non_negative() * 1e-6;
  if (f.has("inter_bandwidth_gbps"))
    g.inter.bandwidth_Bps = f.at("inter_bandwidth_gbps").positive() * 1e9 / 8;
  g.inter.latency_s = f.non_negative_or("inter_latency_us", 5) * 1e-6;
  if (f.has("inter_latency_us") && !f.has("inter_bandwidth_gbps"))
    f.at("inter_latency_us").fail("is given without inter_bandwidth_gbps; give both");
  g.price_per_hour = f.non_negative_or("price_per_hour", 0);
  g.spot = f.boolean_or("spot", false);
  g.preemptions_per_hour = f.non_negative_or("preemptions_per_hour", 0);
  g.trace = f.str_or("trace", "");
  if (!g.spot && (f.has("preemptions_per_hour") || f.has("trace")))
    f.at("spot").fail("is false but preemptions are given; set \"spot\": true or drop them");
  return g;
}

}  // namespace

Cluster parse_cluster(const std::string& text, const std::string& origin) {
  const nlohmann::json doc = Field::parse(text, origin);
  const Field root(doc, "", origin);
  root.only({"name", "groups", "about"});
  Cluster c;
  c.name = root.str_or("name", origin);
  // Device counts are ints (ranks): the cluster's total must be one.
  int64_t devices = 0;
  for (const Field& g : root.at("groups").items()) {
    c.groups.push_back(read_group(g));
    devices += int64_t{c.groups.back().machines} * c.groups.back().devices_per_machine;
    if (devices > std::numeric_limits<int>::max())
      g.at("machines").fail("x devices_per_machine takes the cluster past " +
                            std::to_string(std::numeric_limits<int>::max()) + " devices");
  }
  if (c.groups.empty()) root.at("groups").fail("is empty; describe at least one group of machines");
  // Traffic between machines of accelerators needs the network's figures: without them the
  // profile's own (this machine's loopback) link would stand in for it. Only "cpu" groups,
  // this machine's ranks, may go without, or a cluster of one machine. (Until 2026-12-07 a
  // device given by its figures needed them only when its own group had several machines:
  // one such machine beside an A100 group talked to it at the loopback's speed.)
  const std::vector<Field> groups = root.at("groups").items();
  for (size_t i = 0; i < c.groups.size(); ++i) {
    const MachineGroup& g = c.groups[i];
    if (g.inter.bandwidth_Bps > 0) continue;
    const bool catalog = g.intra.bandwidth_Bps > 0;
    if (catalog && c.machines() > 1)
      groups[i].at("inter_bandwidth_gbps").fail("is needed: the cluster has several machines");
    if (!catalog && g.device != "cpu" && c.machines() > 1)
      TRIREME_THROW(InvalidArgument, origin, ": ", groups[i].path(), ".inter_bandwidth_gbps is missing: group '",
                    g.name, "' of device '", g.device, "' is in a cluster of ", c.machines(), " machines, whose "
                    "network this machine's measured link cannot stand in for; give the network's Gb/s (and "
                    "inter_latency_us)");
  }
  for (size_t i = 0; i < c.groups.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (c.groups[i].name == c.groups[j].name)
        root.at("groups").items()[i].at("name").fail("'" + c.groups[i].name +
                                                      "' is used by two groups; names must differ");
  return c;
}

Cluster read_cluster(const std::string& path) {
  Cluster cluster = parse_cluster(read_text_file(path), path);
  // A relative trace path names a file beside the cluster file (so the file works from any
  // working directory); when nothing is there, the working directory's is kept.
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  for (MachineGroup& g : cluster.groups) {
    if (g.trace.empty() || std::filesystem::path(g.trace).is_absolute()) continue;
    const std::filesystem::path beside = folder / g.trace;
    if (std::filesystem::exists(beside)) g.trace = beside.lexically_normal().string();
  }
  return cluster;
}

Cluster local_cluster(int devices) {
  TRIREME_CHECK(devices >= 1, "a local cluster needs at least one rank");
  MachineGroup g;
  g.name = "local";
  g.device = "cpu";
  g.devices_per_machine = devices;
  g.relative_speed = 1;
  // The ranks share the host's memory.
  const double host = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  g.memory_bytes = (host > 0 ? host : 16.0 * 1024 * 1024 * 1024) / devices;
  Cluster c;
  c.name = "this machine";
  c.groups.push_back(g);
  return c;
}

}  // namespace trireme::plan
