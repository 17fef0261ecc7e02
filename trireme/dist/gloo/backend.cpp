// The Gloo backend: c10d's ProcessGroupGloo over TCP. This is the only translation unit
// that includes Gloo's headers (from Debian's libgloo-dev; the Gloo code itself is the copy
// compiled into libtorch_cpu).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <unistd.h>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

namespace trireme::dist {
namespace {

// Gloo must bind an address its peers can reach: the loopback device when every rank is on
// this machine's loopback rendezvous, otherwise the interface of this host's name.
std::shared_ptr<::gloo::transport::Device> make_device() {
  const char* iface = std::getenv("TRIREME_GLOO_IFACE");
  if (iface && *iface) return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string master = addr ? addr : "127.0.0.1";
  if (master == "127.0.0.1" || master == "localhost")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

Group create_gloo_group(const Store& store, int rank, int size, const GroupOptions& options) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create();
  gloo_options->timeout = options.timeout;
  gloo_options->devices.push_back(make_device());
  // Two worker threads, as PyTorch's default: lets one bucket's all-reduce proceed while the
  // next is queued, without oversubscribing one core per rank.
  gloo_options->threads = 2;
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "cannot connect Gloo group (rank ", rank, " of ", size,
                  "): ", error_text(e));
  }
}

}  // namespace trireme::dist
