// Forwarding worker output: LinePrefixer cuts one worker stream into lines and prefixes
// each with the worker's rank ("[3] "), so lines of different workers never interleave
// mid-line. '\n' and '\r' both end a line; a line ended by '\r' keeps its '\r', so a
// worker's live progress line (redrawn with '\r') stays live through the launcher. A '\n'
// right after a '\r' (CRLF) is passed on alone rather than starting an empty line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace trireme::launch {

// "[<rank>] "
std::string rank_prefix(int rank);

class LinePrefixer {
 public:
  // Lines longer than max_line bytes are cut there, so a stream without newlines cannot
  // grow the buffer without bound.
  explicit LinePrefixer(std::string prefix, std::size_t max_line = 64 * 1024);

  // Takes the next bytes of the stream; returns the complete, prefixed lines (maybe "").
  std::string feed(std::string_view data);
  // End of stream: the unterminated remainder, prefixed and ended with '\n' (or "").
  std::string finish();

 private:
  std::string prefix_;
  std::size_t max_line_;
  std::string pending_;
  bool after_cr_ = false;  // the last terminator passed on was '\r'
};

}  // namespace trireme::launch
