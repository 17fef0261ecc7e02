// TcpStoreChannel over c10d::TCPStore: see tcp_store_channel.h. The only launch file that
// includes libtorch. c10 errors are translated: a port in use becomes InvalidArgument,
// anything else the store reports becomes CommError.
#include "trireme/launch/tcp_store_channel.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <thread>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"

namespace trireme::launch {
namespace {

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

// While alive, c10's own log lines below FATAL are not printed: a store that cannot be
// reached logs an [E] and a [W] line per attempt, which the one-line error made from the
// exception already says.
class QuietC10Log {
 public:
  QuietC10Log() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }  // FATAL
  ~QuietC10Log() { FLAGS_caffe2_log_level = saved_; }
  QuietC10Log(const QuietC10Log&) = delete;
  QuietC10Log& operator=(const QuietC10Log&) = delete;

 private:
  int saved_;
};

bool mentions_address_in_use(const std::string& text) {
  return text.find("EADDRINUSE") != std::string::npos ||
         text.find("ddress already in use") != std::string::npos;
}

// Runs a store call, turning c10's errors into CommError.
template <typename Fn>
auto guarded(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    TRIREME_THROW(CommError, "rendezvous store ", what, " failed: ", one_line(dist::error_text(e)));
  } catch (const std::system_error& e) {
    TRIREME_THROW(CommError, "rendezvous store ", what, " failed: ", one_line(dist::error_text(e)));
  }
}

}  // namespace

struct TcpStoreChannel::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

TcpStoreChannel::TcpStoreChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreChannel::~TcpStoreChannel() = default;

std::unique_ptr<TcpStoreChannel> TcpStoreChannel::host(int port,
                                                       std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.numWorkers = std::nullopt;
  opts.timeout = timeout;
  auto impl = std::make_unique<Impl>();
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  } catch (const std::exception& e) {
    const std::string text = one_line(dist::error_text(e));
    TRIREME_CHECK(!mentions_address_in_use(text), "--rdzv port ", port,
                  " is already in use on this machine; pick a free port");
    TRIREME_THROW(CommError, "cannot start the rendezvous store on port ", port, ": ", text);
  }
  return std::unique_ptr<TcpStoreChannel>(new TcpStoreChannel(std::move(impl)));
}

std::unique_ptr<TcpStoreChannel> TcpStoreChannel::connect(const std::string& host, int port,
                                                          std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  auto impl = std::make_unique<Impl>();
  try {
    const QuietC10Log quiet;
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "could not reach the rendezvous store at ", host, ":", port,
                  " within ", timeout.count() / 1000,
                  " s; start node 0's 'trireme run' with the same --rdzv first, or raise "
                  "--join-timeout (",
                  one_line(dist::error_text(e)), ")");
  }
  return std::unique_ptr<TcpStoreChannel>(new TcpStoreChannel(std::move(impl)));
}

int TcpStoreChannel::port() const { return impl_->store->getPort(); }

void TcpStoreChannel::set(const std::string& key, const std::string& value) {
  guarded("set", [&] {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

std::optional<std::string> TcpStoreChannel::try_get(const std::string& key) {
  return guarded("get", [&]() -> std::optional<std::string> {
    if (!impl_->store->check({key})) return std::nullopt;
    const std::vector<uint8_t> value = impl_->store->get(key);
    return std::string(value.begin(), value.end());
  });
}

int64_t TcpStoreChannel::add(const std::string& key, int64_t delta) {
  return guarded("add", [&] { return impl_->store->add(key, delta); });
}

std::string TcpStoreChannel::compare_set(const std::string& key, const std::string& expected,
                                         const std::string& desired) {
  return guarded("compare-and-set", [&] {
    const std::vector<uint8_t> now = impl_->store->compareSet(key, std::vector<uint8_t>(expected.begin(), expected.end()),
                                                              std::vector<uint8_t>(desired.begin(), desired.end()));
    return std::string(now.begin(), now.end());
  });
}

// TCPStore::wait() logs a warning on every timeout, and agents wait in short slices, so
// this looks at the key every kCheckInterval instead (a bounded store check, not a sleep
// standing in for synchronisation).
bool TcpStoreChannel::wait_for(const std::string& key, std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kCheckInterval{50};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (guarded("check", [&] { return impl_->store->check({key}); })) return true;
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(left, kCheckInterval));
  }
}

}  // namespace trireme::launch
