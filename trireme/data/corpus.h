// A training corpus: the raw bytes of one UTF-8 text file, held in memory.
//
// Loading checks what a user can get wrong (missing or unreadable file, a directory,
// device or pipe instead of a regular file, empty file, bytes that are not UTF-8) and throws InvalidArgument with one line naming the file and the
// fix. Whether the text is long enough depends on the model's sequence length, so that is
// a separate check (require_length). Pure C++: no libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trireme::data {

class Corpus {
 public:
  // Reads and validates `path`. Errors name the file as "--data <path>".
  static Corpus load(const std::string& path);
  // The same checks on bytes already in memory; `name` stands in for the path in errors.
  static Corpus from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");

  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  const std::string& path() const { return path_; }

  // Throws InvalidArgument unless the corpus holds at least seq_len + 1 bytes (one input
  // window plus its shifted target).
  void require_length(int64_t seq_len) const;

 private:
  Corpus(std::vector<uint8_t> bytes, std::string path)
      : bytes_(std::move(bytes)), path_(std::move(path)) {}

  std::vector<uint8_t> bytes_;
  std::string path_;
};

// Byte offset of the first invalid UTF-8 sequence in [data, data + size), or -1 when it is
// all valid (rejects overlong forms, surrogates and code points above U+10FFFF).
int64_t first_invalid_utf8(const uint8_t* data, size_t size);

// The bundled corpus (King James Bible, see assets/corpus/SOURCE.md). Search order:
//   1. $TRIREME_CORPUS, if set (returned as is);
//   2. <prefix>/share/trireme/corpus/kjv.txt, where the running executable is
//      <prefix>/bin/<exe> (an installed trireme);
//   3. <source tree>/assets/corpus/kjv.txt (a build tree).
// Returns the last candidate when none exists, so loading it gives the usual error.
std::string default_corpus_path();

}  // namespace trireme::data
