// LinePrefixer: see output.h.
#include "trireme/launch/output.h"

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <vector>

namespace trireme::launch {

std::string rank_prefix(int rank) { return "[" + std::to_string(rank) + "] "; }

LinePrefixer::LinePrefixer(std::string prefix, std::size_t max_line)
    : prefix_(std::move(prefix)), max_line_(max_line == 0 ? 1 : max_line) {}

std::string LinePrefixer::feed(std::string_view data) {
  std::string out;
  for (const char c : data) {
    if (c == '\n' && after_cr_ && pending_.empty()) {
      out += '\n';  // the second half of a CRLF
      after_cr_ = false;
      continue;
    }
    if (c == '\n' || c == '\r') {
      out += prefix_;
      out += pending_;
      out += c;
      pending_.clear();
      after_cr_ = (c == '\r');
      continue;
    }
    pending_ += c;
    after_cr_ = false;
    if (pending_.size() >= max_line_) {
      out += prefix_;
      out += pending_;
      out += '\n';
      pending_.clear();
    }
  }
  return out;
}

std::string LinePrefixer::finish() {
  if (pending_.empty()) return "";
  std::string out = prefix_ + pending_ + "\n";
  pending_.clear();
  after_cr_ = false;
  return out;
}

OutputWriter::OutputWriter(std::size_t capacity) : capacity_(capacity), thread_([this] { run(); }) {}

OutputWriter::~OutputWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void OutputWriter::write(int fd, std::string text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queued_bytes_ + text.size() > capacity_) {
      auto it = std::find_if(dropped_.begin(), dropped_.end(), [fd](const auto& d) { return d.first == fd; });
      if (it == dropped_.end()) it = dropped_.insert(dropped_.end(), {fd, 0});
      it->second += text.size();
    } else {
      queued_bytes_ += text.size();
      queue_.push_back({fd, std::move(text)});
    }
  }
  wake_.notify_one();
}

void OutputWriter::run() {
  // A reader that went away makes write() fail with EPIPE here rather than end the agent
  // (whose own SIGPIPE setting may be the default again as it exits).
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  std::vector<int> gone;  // descriptors whose reader went away
  const auto is_gone = [&](int fd) { return std::find(gone.begin(), gone.end(), fd) != gone.end(); };
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return closing_ || !queue_.empty() || !dropped_.empty(); });
    if (queue_.empty() && !dropped_.empty()) {  // caught up: say what was lost
      const auto [fd, bytes] = dropped_.front();
      dropped_.pop_front();
      if (is_gone(fd)) continue;
      queue_.push_back({fd, "trireme run: " + std::to_string(bytes) + " bytes of output dropped: its reader did "
                                                                         "not keep up\n"});
      queued_bytes_ += queue_.back().text.size();
    }
    if (queue_.empty()) return;  // closing, and everything written
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    for (std::size_t done = 0; done < item.text.size() && !is_gone(item.fd);) {
      const ssize_t n = ::write(item.fd, item.text.data() + done, item.text.size() - done);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EAGAIN) {  // a non-blocking descriptor: wait for room
        pollfd p{item.fd, POLLOUT, 0};
        ::poll(&p, 1, -1);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        gone.push_back(item.fd);  // EPIPE, or closed: drop its output, keep supervising
      }
    }
    lock.lock();
    queued_bytes_ -= item.text.size();
  }
}

}  // namespace trireme::launch
