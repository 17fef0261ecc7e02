// TcpStoreChannel: AgentChannel over libtorch's c10d TCPStore. Node 0 hosts the store
// (server and client in one object); the other agents and the workers are clients.
// The header hides the TCPStore so that callers include no libtorch header.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "trireme/launch/agent_channel.h"

namespace trireme::launch {

class TcpStoreChannel final : public AgentChannel {
 public:
  // Starts the store on port (0: an ephemeral one) on all interfaces. Throws
  // InvalidArgument when the port is in use, CommError on other failures.
  static std::unique_ptr<TcpStoreChannel> host(int port, std::chrono::milliseconds timeout);
  // Connects to a store, retrying until timeout. Throws CommError when it cannot.
  static std::unique_ptr<TcpStoreChannel> connect(const std::string& host, int port,
                                                  std::chrono::milliseconds timeout);
  ~TcpStoreChannel() override;

  int port() const;

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool wait_for(const std::string& key, std::chrono::milliseconds timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;

 private:
  struct Impl;
  explicit TcpStoreChannel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trireme::launch
