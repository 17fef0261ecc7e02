// Which address a Gloo group binds (dist::gloo_bind_address), from the environment a
// launcher gives its workers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

namespace {

// Sets variables for one scope and puts back what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_)
      old ? ::setenv(name.c_str(), old->c_str(), 1) : ::unsetenv(name.c_str());
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST(GlooAddress, LoopbackRendezvousBindsLoopback) {
  ScopedEnv env({{"MASTER_ADDR", "localhost"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(trireme::dist::gloo_bind_address(), "127.0.0.1");
}

TEST(GlooAddress, AHostNameOnLoopbackStaysThereForOneMachine) {
  // What Debian's /etc/hosts makes of the host's own name.
  ScopedEnv env({{"MASTER_ADDR", "127.0.1.1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(trireme::dist::gloo_bind_address().rfind("127.", 0), 0u);
}

TEST(GlooAddress, AHostNameOnLoopbackIsNotBoundWhenTheJobSpansMachines) {
  // The other machines could not reach a loopback address: an interface that is up
  // instead, or a refusal naming the fix (a machine with loopback only).
  ScopedEnv env({{"MASTER_ADDR", "127.0.1.1"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}});
  try {
    const std::string address = trireme::dist::gloo_bind_address();
    EXPECT_FALSE(address.empty());
    EXPECT_NE(address.rfind("127.", 0), 0u) << address;
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TRIREME_GLOO_IFACE"), std::string::npos) << e.what();
  }
}
