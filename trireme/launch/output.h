// Forwarding worker output: LinePrefixer cuts one worker stream into lines and prefixes
// each with the worker's rank ("[3] "), so lines of different workers never interleave
// mid-line. '\n' and '\r' both end a line; a line ended by '\r' keeps its '\r', so a
// worker's live progress line (redrawn with '\r') stays live through the launcher. A '\n'
// right after a '\r' (CRLF) is passed on alone rather than starting an empty line.
//
// OutputWriter writes the agent's own output (forwarded lines and its messages) on a
// thread of its own, so that a reader that does not keep up (a terminal paused with
// Ctrl-S, `trireme run ... | less` left unscrolled, a stalled ssh) costs output rather
// than the agent's supervision: its heartbeat, signals and failure checks go on.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

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

// Writes text to file descriptors (blocking or not), in the order given, on one thread of
// its own: one thread, so that stdout and stderr on one pipe (`2>&1 | tee`) interleave
// only at whole writes, in order, never inside a line. At most `capacity` bytes wait for
// the reader; text beyond that is dropped and counted, and the count is written to its
// descriptor ("trireme run: N bytes of output dropped ...") once the reader has caught
// up. A reader that went away (EPIPE, with SIGPIPE blocked on the thread) drops
// everything after it, silently.
class OutputWriter {
 public:
  explicit OutputWriter(std::size_t capacity = std::size_t{8} << 20);
  // Writes what waits (blocking: the job is over, nothing else needs the agent), then ends.
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  // Never blocks on the reader.
  void write(int fd, std::string text);

 private:
  struct Item {
    int fd;
    std::string text;
  };
  void run();

  const std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Item> queue_;
  std::size_t queued_bytes_ = 0;
  std::deque<std::pair<int, std::size_t>> dropped_;  // bytes dropped, by descriptor
  bool closing_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

// One descriptor of an OutputWriter: the agent's stdout or stderr.
class OutputStream {
 public:
  OutputStream(OutputWriter& writer, int fd) : writer_(writer), fd_(fd) {}
  void write(std::string text) { writer_.write(fd_, std::move(text)); }

 private:
  OutputWriter& writer_;
  int fd_;
};

}  // namespace trireme::launch
