// Byte-level tokenizer: every byte of the text is one token (0..255), so any file is
// encodable and decoding is exact. The reference GPT uses it with vocab = 256.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trireme/common/error.h"

namespace trireme::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;

  static int64_t vocab_size() { return kVocabSize; }

  static std::vector<int64_t> encode(const std::string& text) {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(static_cast<int64_t>(c));
    return ids;
  }

  // Throws InvalidArgument for an id outside 0..255.
  static std::string decode(const std::vector<int64_t>& ids) {
    std::string text;
    text.reserve(ids.size());
    for (int64_t id : ids) {
      TRIREME_CHECK(id >= 0 && id < kVocabSize, "token id ", id,
                    " is outside the byte vocabulary 0..255");
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    }
    return text;
  }
};

}  // namespace trireme::data
