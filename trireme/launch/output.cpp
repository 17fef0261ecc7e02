// LinePrefixer: see output.h.
#include "trireme/launch/output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

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

OutputWriter::OutputWriter(int fd, std::size_t capacity)
    : fd_(fd), capacity_(capacity), thread_([this] { run(); }) {}

OutputWriter::~OutputWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void OutputWriter::write(std::string text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queued_bytes_ + text.size() > capacity_) {
      dropped_bytes_ += text.size();
    } else {
      queued_bytes_ += text.size();
      queue_.push_back(std::move(text));
    }
  }
  wake_.notify_one();
}

void OutputWriter::run() {
  bool reader_gone = false;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return closing_ || !queue_.empty() || (dropped_bytes_ > 0 && !reader_gone); });
    if (queue_.empty() && dropped_bytes_ > 0 && !reader_gone) {  // caught up: say what was lost
      queue_.push_back("trireme run: " + std::to_string(dropped_bytes_) +
                       " bytes of output dropped: its reader did not keep up\n");
      queued_bytes_ += queue_.back().size();
      dropped_bytes_ = 0;
    }
    if (queue_.empty()) return;  // closing, and everything written
    std::string text = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    for (std::size_t done = 0; done < text.size() && !reader_gone;) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EAGAIN) {  // a non-blocking descriptor: wait for room
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, -1);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        reader_gone = true;  // EPIPE, or closed: drop the output, keep supervising
      }
    }
    lock.lock();
    queued_bytes_ -= text.size();
  }
}

}  // namespace trireme::launch
