// The Gloo backend: c10d's ProcessGroupGloo over TCP. This is the only translation unit
// that includes Gloo's headers (from Debian's libgloo-dev; the Gloo code itself is the copy
// compiled into libtorch_cpu).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
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

// This host's first IPv4 address on an interface that is up and not loopback ("" if none).
std::string first_external_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string address;
  for (const ifaddrs* i = list; i != nullptr && address.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {0};
    if (::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text)))
      address = text;
  }
  ::freeifaddrs(list);
  return address;
}

std::shared_ptr<::gloo::transport::Device> make_device(const GroupOptions& options) {
  if (const char* iface = std::getenv("TRIREME_GLOO_IFACE"); iface && *iface) {
    try {
      return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
    } catch (const std::exception& e) {
      TRIREME_THROW(InvalidArgument, "TRIREME_GLOO_IFACE=", iface, " cannot be used (", error_text(e),
                    "); set it to a network interface of this machine that is up (see 'ip -brief addr'), or "
                    "unset it");
    }
  }
  std::string master = options.master_addr;
  if (master.empty()) {
    const char* addr = std::getenv("MASTER_ADDR");
    master = addr && *addr ? addr : "127.0.0.1";
  }
  const std::string address = gloo_bind_address(master, options.spans_machines);
  try {
    if (!address.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(address);
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "cannot open a Gloo device on ", address.empty() ? "the default interface" : address,
                  " (", error_text(e), "); set TRIREME_GLOO_IFACE to the network interface to use");
  }
}

}  // namespace

std::string gloo_bind_address(const std::string& master, bool spans_machines) {
  if (master == "127.0.0.1" || master == "localhost") return "127.0.0.1";
  std::string local = local_address_toward(master);
  // The rendezvous host's name can resolve to loopback on that host itself (Debian maps
  // the host's own name to 127.0.1.1): right for a job on one machine, unreachable from
  // the others when the job spans machines.
  if (local.rfind("127.", 0) == 0 && spans_machines) {
    local = first_external_address();
    TRIREME_CHECK(!local.empty(), "MASTER_ADDR ", master,
                  " leads to loopback on this machine and it has no other IPv4 interface up, but the job spans "
                  "machines; give the rendezvous host's reachable address, or set TRIREME_GLOO_IFACE");
  }
  // No IPv4 route to it (an IPv6 address, a name this machine cannot resolve): Gloo's
  // default device would bind the host name's address, which may be loopback (127.0.1.1)
  // that the other machines cannot reach.
  if (local.empty() && spans_machines) {
    local = first_external_address();
    TRIREME_CHECK(!local.empty(), "MASTER_ADDR ", master,
                  " has no IPv4 route from this machine and it has no IPv4 interface up, but the job spans "
                  "machines; give the rendezvous host's IPv4 address, or set TRIREME_GLOO_IFACE");
  }
  return local;
}

Group create_gloo_group(const Store& store, int rank, int size, const GroupOptions& options) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create();
  gloo_options->timeout = options.timeout;
  gloo_options->devices.push_back(make_device(options));
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
