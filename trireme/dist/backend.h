// The seam between Trireme and a c10d communication backend.
//
// A Group is a c10d Backend (a process group for one transport): Gloo for CPU tensors,
// NCCL for CUDA tensors. Everything above dist/ talks to Groups only, so the same code
// path runs over either. Each backend lives in a subfolder with the same file name:
//   dist/gloo/backend.cpp   compiled into libtrireme (Gloo is inside libtorch_cpu)
//   dist/nccl/backend.cpp   the optional plugin libtrireme_nccl.so, loaded with dlopen
//                           the first time a NCCL group is requested, so CPU-only
//                           programs never load CUDA libraries
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <string>

namespace trireme::dist {

using Group = c10::intrusive_ptr<c10d::Backend>;
using Store = c10::intrusive_ptr<c10d::Store>;

enum class BackendKind { kGloo, kNccl };

// "gloo" / "nccl" -> kind; throws InvalidArgument naming the accepted values.
BackendKind parse_backend(const std::string& name);
const char* backend_name(BackendKind kind);

struct GroupOptions {
  BackendKind backend = BackendKind::kGloo;
  // Every collective and point-to-point operation fails with CommError after this long
  // instead of hanging: 5 minutes leaves room for slow first steps on small machines.
  // On NCCL (without TORCH_NCCL_BLOCKING_WAIT=1, which would make every wait hold the
  // CPU until the GPU is done) NCCL's watchdog instead ends the process on a failure or
  // time-out: a worker failure to the agent, which restarts the job as for any other.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // NCCL only: the GPU this process drives. The plugin makes it the current device and
  // binds the group to it, so that a barrier or a first collective with no tensor to go
  // by (a subgroup's, before any all-reduce) uses it, not c10d's guess of rank % GPUs,
  // which in a subgroup names another process's GPU. -1 leaves both to c10d; World
  // (dist/world.h) makes it the process's local rank. Taken modulo the GPUs this process
  // sees (one each: device 0).
  int cuda_device = -1;
  // Gloo only: where the job's rendezvous store is and whether the job spans machines, as
  // the launcher's environment said (WorldInfo; World sets both). Gloo binds this host's
  // address on the route to master_addr. Empty master_addr: MASTER_ADDR from the process
  // environment, else 127.0.0.1.
  std::string master_addr;
  bool spans_machines = false;
};

// Creates a group of `size` ranks in which this process is `rank`; all members call it
// with stores that share a prefix unique to the group.
Group create_group(const Store& store, int rank, int size, const GroupOptions& options);

// Per-backend factories (dist/<backend>/backend.cpp).
Group create_gloo_group(const Store& store, int rank, int size, const GroupOptions& options);
// The address a Gloo group binds unless TRIREME_GLOO_IFACE names an interface: loopback
// when `master_addr` is (one machine); else this host's address on the route to it (not
// the host name, which Debian maps to 127.0.1.1); and when that route is loopback while
// the job spans machines (`master_addr` names this very host), or there is no IPv4 route
// to it (an IPv6 address, a name this host cannot resolve), the first IPv4 address of an
// interface that is up. "" on one machine when none is found (Gloo's default then).
// Throws InvalidArgument when a job across machines has no such address.
std::string gloo_bind_address(const std::string& master_addr, bool spans_machines);
Group create_nccl_group(const Store& store, int rank, int size, const GroupOptions& options);

// The message of an exception fit for one line: c10 errors without their C++ backtrace.
std::string error_text(const std::exception& error);

// Issues a collective (or point-to-point operation) and waits for it. A failure while
// issuing or while waiting becomes a CommError naming `what`.
void run_collective(const char* what,
                    const std::function<c10::intrusive_ptr<c10d::Work>()>& issue);
// Waits for an operation already issued; failures become CommError naming `what`.
void wait_work(const c10::intrusive_ptr<c10d::Work>& work, const char* what);
// `values` reduced element-wise by `op` over `group` (a collective), on `device`, the
// group's: in place when `values` is already there, else in a copy. Failures become
// CommError naming `what`.
at::Tensor all_reduce(const Group& group, const at::Tensor& values, c10d::ReduceOp::RedOpType op,
                      at::Device device, const char* what);

// Throws InvalidArgument unless `count` CUDA devices are usable: loads the NCCL plugin
// (which brings libtorch's CUDA part) and asks CUDA how many devices it sees.
void require_cuda_devices(int count);

// Signature of the factory the NCCL plugin exports as "trireme_create_nccl_group".
using NcclFactory = Group (*)(const Store&, int, int, const GroupOptions&);

}  // namespace trireme::dist
