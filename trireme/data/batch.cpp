// make_batch: copies corpus windows into int64 tensors; see batch.h.
#include "trireme/data/batch.h"

#include "trireme/common/error.h"

namespace trireme::data {

Batch make_batch(const Corpus& corpus, const std::vector<uint64_t>& offsets, int64_t seq_len) {
  TRIREME_CHECK(seq_len >= 1, "--seq must be positive, got ", seq_len);
  const auto batch = static_cast<int64_t>(offsets.size());
  const auto T = static_cast<uint64_t>(seq_len);
  const std::vector<uint8_t>& bytes = corpus.bytes();
  Batch out{at::empty({batch, seq_len}, at::kLong), at::empty({batch, seq_len}, at::kLong)};
  int64_t* in = out.inputs.data_ptr<int64_t>();
  int64_t* tg = out.targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const uint64_t o = offsets[static_cast<size_t>(b)];
    TRIREME_CHECK(o <= bytes.size() && bytes.size() - o >= T + 1, "batch window at offset ", o,
                  " with --seq ", seq_len, " runs past the end of the ", bytes.size(),
                  "-byte corpus");
    for (uint64_t t = 0; t < T; ++t) {
      in[b * seq_len + static_cast<int64_t>(t)] = bytes[o + t];
      tg[b * seq_len + static_cast<int64_t>(t)] = bytes[o + t + 1];
    }
  }
  return out;
}

}  // namespace trireme::data
