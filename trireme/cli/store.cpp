// `trireme store --port P`: the rendezvous store on its own, for jobs whose machines may
// all come and go (spot instances): run it on a host that stays (a small on-demand
// instance, the login node) and start every agent with --rdzv HOST:P --rdzv-external.
// Without it node 0's agent hosts the store, and losing node 0 ends the job (the others
// see the store gone and stop). Serves until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
#include <poll.h>

#include <csignal>
#include <cstdio>
#include <memory>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/common/error.h"
#include "trireme/launch/exit_status.h"
#include "trireme/launch/process.h"
#include "trireme/launch/tcp_store_channel.h"

namespace trireme::cli {

int store_main(const std::vector<std::string>& args) {
  FlagParser parser("trireme store");
  int port = 0;
  parser.add("port", &port, "port to listen on (all interfaces); 0: an ephemeral one, printed");
  const std::vector<std::string> stray = parser.parse(args);
  if (parser.help_requested()) {
    std::printf("usage: trireme store --port P\n%s", parser.usage().c_str());
    return 0;
  }
  TRIREME_CHECK(stray.empty(), "unexpected argument '", stray.empty() ? "" : stray.front(),
                "'; usage: trireme store --port P");
  TRIREME_CHECK(port >= 0 && port <= 65535, "--port must be 0..65535, got ", port);
  launch::SignalPipe signals;  // any signal but SIGCHLD ends the wait below
  std::unique_ptr<launch::TcpStoreChannel> store;
  try {
    store = launch::TcpStoreChannel::host(port, std::chrono::seconds(30));
  } catch (const InvalidArgument&) {  // (host's one refusal, which names trireme run's --rdzv)
    TRIREME_THROW(InvalidArgument, "--port ", port, " is already in use on this machine; pick a free port, or 0 for "
                  "an ephemeral one");
  }
  std::printf("trireme store: listening on port %d; start the agents with --rdzv HOST:%d --rdzv-external\n",
              store->port(), store->port());
  std::fflush(stdout);
  while (true) {
    pollfd p{signals.fd(), POLLIN, 0};
    if (::poll(&p, 1, -1) > 0)
      for (int sig : signals.drain())
        if (sig != SIGCHLD) {
          std::printf("trireme store: stopped by %s\n", launch::signal_name(sig).c_str());
          return 0;
        }
  }
}

}  // namespace trireme::cli
