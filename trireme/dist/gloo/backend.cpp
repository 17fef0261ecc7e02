// The Gloo backend: c10d's ProcessGroupGloo over TCP. This is the only translation unit
// that includes Gloo's headers (from Debian's libgloo-dev; the Gloo code itself is the copy
// compiled into libtorch_cpu).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

namespace trireme::dist {
namespace {

// This host's address on the route to `peer` (IPv4): the source address the kernel would
// pick for a datagram to it. Empty when it cannot be found. Nothing is sent.
std::string local_address_toward(const std::string& peer) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(peer.c_str(), "9", &hints, &found) != 0 || !found) return "";
  std::string address;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)))
      address = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return address;
}

// Gloo must bind an address its peers can reach. In order: the interface named by
// TRIREME_GLOO_IFACE; loopback when the rendezvous is on loopback (one machine); the
// address on the route to the rendezvous host (not the host name, which Debian maps to
// 127.0.1.1, unreachable from other machines); Gloo's default as a last resort.
std::shared_ptr<::gloo::transport::Device> make_device() {
  const char* iface = std::getenv("TRIREME_GLOO_IFACE");
  if (iface && *iface) return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string master = addr ? addr : "127.0.0.1";
  if (master == "127.0.0.1" || master == "localhost")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  const std::string local = local_address_toward(master);
  if (!local.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(local);
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
