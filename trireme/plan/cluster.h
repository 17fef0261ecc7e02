// A cluster description: groups of equal machines, what their devices can do, how they are
// connected, what they cost, and how often spot machines are taken away.
//
//   {
//     "name": "a100+v100",
//     "groups": [
//       {"name": "fast", "device": "A100", "machines": 2, "devices_per_machine": 8,
//        "inter_bandwidth_gbps": 200, "inter_latency_us": 5,
//        "price_per_hour": 32.8, "spot": true, "preemptions_per_hour": 0.05},
//       {"name": "slow", "device": "V100", "machines": 2, "devices_per_machine": 8,
//        "inter_bandwidth_gbps": 100, "price_per_hour": 24.5, "spot": false}
//     ]
//   }
//
// Per group (units are in the names):
//   device                a name from the catalog (trireme/plan/devices.json: A100, H100,
//                         H800, H20, V100, T4, L4, ...), or any name when tflops and
//                         memory_gib are given
//   machines, devices_per_machine
//   tflops, memory_gib    override the catalog's peak throughput and device memory
//   relative_speed        instead of tflops: speed relative to the device that made the
//                         profile (1 = as fast; 0.5 = takes twice as long). This is how a
//                         cluster of this machine's CPU ranks, one of them emulated slow,
//                         is described
//   intra_bandwidth_GBps, intra_latency_us   device to device inside a machine (catalog)
//   inter_bandwidth_gbps, inter_latency_us   each machine's network, Gb/s
//   price_per_hour        per machine; spot true|false; for spot, preemptions_per_hour
//                         (per machine) or trace (a file, see plan/trace.h; a relative
//                         path is taken from the cluster file's folder by read_cluster,
//                         or from the working directory when no such file is there)
// Links a file does not give and the catalog does not know (a CPU "device") are the
// profile's measured ones: `Link::bandwidth_Bps == 0` means "use the profile". Between
// machines that would be this machine's loopback, so inter_bandwidth_gbps is required for
// every device but "cpu" in a cluster of several machines.
// Errors name the file and the JSON path: "c.json: groups[1].inter_bandwidth_gbps must be
// a positive number (got -5)". Pure: no libtorch.
#pragma once

#include <string>
#include <vector>

#include "trireme/plan/profile.h"

namespace trireme::plan {

struct DeviceSpec {
  std::string name;
  double tflops = 0;
  double memory_gib = 0;
  Link intra;  // inside a machine; bandwidth 0: unknown
  std::string source;
};

struct MachineGroup {
  std::string name;
  std::string device;
  int machines = 1;
  int devices_per_machine = 1;
  double tflops = 0;           // 0 when relative_speed is given instead
  double relative_speed = 0;   // 0 when tflops is given
  double memory_bytes = 0;
  Link intra;                  // bandwidth 0: the profile's measured link
  Link inter;                  // bandwidth 0: the profile's measured link
  double price_per_hour = 0;   // per machine
  bool spot = false;
  double preemptions_per_hour = 0;  // per machine
  std::string trace;

  int devices() const { return machines * devices_per_machine; }
  // How much faster than the profiling device: relative_speed, or tflops over the
  // profile's reference_tflops.
  double speed(const Profile& profile) const;
};

struct Cluster {
  std::string name;
  std::vector<MachineGroup> groups;
  int devices() const;
  int machines() const;
};

// The device catalog compiled from trireme/plan/devices.json.
const std::vector<DeviceSpec>& device_catalog();
// Throws InvalidArgument naming the known devices.
const DeviceSpec& find_device(const std::string& name);

Cluster parse_cluster(const std::string& text, const std::string& origin);
Cluster read_cluster(const std::string& path);

// A one-group cluster of `devices` equal ranks on one machine, measured links, the host's
// memory shared among them: what `trireme plan --local N` plans for.
Cluster local_cluster(int devices);

}  // namespace trireme::plan
