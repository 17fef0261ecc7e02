// LinePrefixer: see output.h.
#include "trireme/launch/output.h"

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

}  // namespace trireme::launch
