// File writes that checkpoints (ft/checkpoint.cpp) and a run's text files (obs/plot.h)
// share: a buffer written whole, across short writes and EINTR, and a folder's entries (a
// rename in it) flushed to the disk. Header only, as the rest of common/.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace trireme {

// Writes the buffers, in order, to `fd`: 0, or the errno of the write that failed.
inline int write_all(int fd, const std::vector<std::pair<const char*, size_t>>& buffers) {
  for (const auto& [data, size] : buffers)
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? errno : EIO;
      done += static_cast<size_t>(n);
    }
  return 0;
}

// Flushes the entries of folder `dir` (a file renamed into it) to the disk. Best effort:
// some file systems refuse a folder's fsync.
inline void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace trireme
