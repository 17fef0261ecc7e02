// Corpus loading and validation; see corpus.h.
#include "trireme/data/corpus.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "trireme/common/error.h"

#ifndef TRIREME_SOURCE_DIR
#define TRIREME_SOURCE_DIR "."
#endif

namespace trireme::data {
namespace {

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void check_content(const std::vector<uint8_t>& bytes, const std::string& name) {
  TRIREME_CHECK(!bytes.empty(), "--data ", name,
                ": file is empty; give a non-empty UTF-8 text file");
  const int64_t bad = first_invalid_utf8(bytes.data(), bytes.size());
  TRIREME_CHECK(bad < 0, "--data ", name, ": not valid UTF-8 (bad byte 0x", std::hex,
                static_cast<int>(bytes[bad < 0 ? 0 : bad]), std::dec, " at byte offset ",
                bad, "); give a UTF-8 text file");
}

}  // namespace

int64_t first_invalid_utf8(const uint8_t* data, size_t size) {
  size_t i = 0;
  while (i < size) {
    const uint8_t c = data[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    uint32_t min_cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return static_cast<int64_t>(i);  // stray continuation byte or 0xF8..0xFF
    }
    if (i + len > size) return static_cast<int64_t>(i);  // truncated sequence
    for (size_t k = 1; k < len; ++k) {
      if ((data[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (data[i + k] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

Corpus Corpus::load(const std::string& path) {
  TRIREME_CHECK(!path.empty(), "--data is empty; give a readable UTF-8 text file");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    TRIREME_THROW(InvalidArgument, "--data ", path, ": cannot read (", std::strerror(errno),
                  "); give a readable UTF-8 text file");
  }
  TRIREME_CHECK(!S_ISDIR(st.st_mode), "--data ", path,
                ": is a directory; give a readable UTF-8 text file");
  // A device such as /dev/zero reports size 0 and never ends; opening a pipe waits for a
  // writer. Only a regular file has a size to read and an end.
  TRIREME_CHECK(S_ISREG(st.st_mode), "--data ", path,
                ": is not a regular file (a device, pipe or socket); save the text to a file "
                "and give its path");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TRIREME_THROW(InvalidArgument, "--data ", path, ": cannot read (", std::strerror(errno),
                  "); give a readable UTF-8 text file");
  }
  // One read of the size stat() gave, then whatever a growing file added: a byte-wise
  // stream iterator took 8 ms for the 2 MB default corpus, on every worker start.
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<size_t>(in.gcount()));
  if (in) bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  TRIREME_CHECK(!in.bad(), "--data ", path,
                ": read failed part-way; give a readable UTF-8 text file");
  check_content(bytes, path);
  return Corpus(std::move(bytes), path);
}

Corpus Corpus::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  check_content(bytes, name);
  return Corpus(std::move(bytes), std::move(name));
}

void Corpus::require_length(int64_t seq_len) const {
  TRIREME_CHECK(seq_len > 0, "--seq must be positive, got ", seq_len);
  const uint64_t need = static_cast<uint64_t>(seq_len) + 1;
  TRIREME_CHECK(bytes_.size() >= need, "--data ", path_, ": ", bytes_.size(),
                " bytes is too short for --seq ", seq_len, "; give a text of at least ",
                need, " bytes or lower --seq");
}

std::string default_corpus_path() {
  if (const char* env = std::getenv("TRIREME_CORPUS"); env && *env) return env;

  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    // <prefix>/bin/<exe> -> <prefix>
    for (int up = 0; up < 2; ++up) {
      const size_t slash = dir.rfind('/');
      dir = slash == std::string::npos ? std::string() : dir.substr(0, slash);
    }
    const std::string installed = dir + "/share/trireme/corpus/kjv.txt";
    if (!dir.empty() && is_regular_file(installed)) return installed;
  }
  return std::string(TRIREME_SOURCE_DIR) + "/assets/corpus/kjv.txt";
}

}  // namespace trireme::data
