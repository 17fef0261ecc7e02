// Which address a Gloo group binds (dist::gloo_bind_address), from what the launcher's
// environment said (WorldInfo: the rendezvous host, whether the job spans machines).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <string>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

using trireme::dist::gloo_bind_address;

TEST(GlooAddress, LoopbackRendezvousBindsLoopback) {
  EXPECT_EQ(gloo_bind_address("localhost", /*spans_machines=*/false), "127.0.0.1");
}

TEST(GlooAddress, AHostNameOnLoopbackStaysThereForOneMachine) {
  // What Debian's /etc/hosts makes of the host's own name.
  EXPECT_EQ(gloo_bind_address("127.0.1.1", /*spans_machines=*/false).rfind("127.", 0), 0u);
}

TEST(GlooAddress, AHostNameOnLoopbackIsNotBoundWhenTheJobSpansMachines) {
  // The other machines could not reach a loopback address: an interface that is up
  // instead, or a refusal naming the fix (a machine with loopback only). Decided from
  // what the caller passes (Slurm and mpirun set no WORLD_SIZE), not from torchrun's
  // variables.
  try {
    const std::string address = gloo_bind_address("127.0.1.1", /*spans_machines=*/true);
    EXPECT_FALSE(address.empty());
    EXPECT_NE(address.rfind("127.", 0), 0u) << address;
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TRIREME_GLOO_IFACE"), std::string::npos) << e.what();
  }
}

TEST(GlooAddress, ARendezvousHostWithoutAnIpv4RouteDoesNotLeaveTheBindToGloosDefault) {
  // An IPv6 address (no IPv4 route, and no name lookup): on one machine Gloo's default
  // device serves (""); across machines an interface that is up, or a refusal naming the
  // fix. (Before, the default device bound the host name's address, maybe 127.0.1.1.)
  EXPECT_EQ(gloo_bind_address("fd00::1", /*spans_machines=*/false), "");
  try {
    const std::string address = gloo_bind_address("fd00::1", /*spans_machines=*/true);
    EXPECT_FALSE(address.empty());
    EXPECT_NE(address.rfind("127.", 0), 0u) << address;
    // The same interface as for a rendezvous host on loopback.
    EXPECT_EQ(address, gloo_bind_address("127.0.1.1", /*spans_machines=*/true));
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TRIREME_GLOO_IFACE"), std::string::npos) << e.what();
  }
}

TEST(GlooAddress, AnUnknownInterfaceIsRefusedNamingTheVariable) {
  const char* old = std::getenv("TRIREME_GLOO_IFACE");
  const std::string saved = old ? old : "";
  ::setenv("TRIREME_GLOO_IFACE", "no-such-iface0", 1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    trireme::dist::create_gloo_group(store, 0, 1, {});
    ADD_FAILURE() << "an unknown interface was accepted";
  } catch (const trireme::InvalidArgument& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("TRIREME_GLOO_IFACE=no-such-iface0"), std::string::npos) << text;
    EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  }
  old ? ::setenv("TRIREME_GLOO_IFACE", saved.c_str(), 1) : ::unsetenv("TRIREME_GLOO_IFACE");
}
