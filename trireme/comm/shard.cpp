// Chunks, pieces and ring steps of ZeRO sharding; see shard.h.
#include "trireme/comm/shard.h"

#include <algorithm>

#include "trireme/common/error.h"

namespace trireme::comm {

int64_t chunk_length(int64_t numel, int ranks) {
  TRIREME_CHECK(ranks >= 1, "chunk_length: ranks must be >= 1, got ", ranks);
  TRIREME_CHECK(numel >= 0, "chunk_length: numel must be >= 0, got ", numel);
  return (numel + ranks - 1) / ranks;
}

std::vector<Segment> split_by_chunks(int64_t begin, int64_t numel, int64_t chunk) {
  TRIREME_CHECK(chunk > 0 || numel == 0, "split_by_chunks: chunk length must be > 0");
  std::vector<Segment> out;
  int64_t done = 0;
  while (done < numel) {
    const int64_t at = begin + done;
    const int64_t in_chunk = at % chunk;
    const int64_t length = std::min(numel - done, chunk - in_chunk);
    out.push_back({done, static_cast<int>(at / chunk), in_chunk, length});
    done += length;
  }
  return out;
}

std::vector<ShardPiece> owned_pieces(const std::vector<int64_t>& numels, int ranks, int rank) {
  TRIREME_CHECK(rank >= 0 && rank < ranks, "owned_pieces: rank ", rank, " outside 0..", ranks - 1);
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  const int64_t chunk = chunk_length(total, ranks);
  std::vector<ShardPiece> out;
  int64_t begin = 0;
  for (size_t k = 0; k < numels.size(); ++k) {
    for (const Segment& s : split_by_chunks(begin, numels[k], chunk))
      if (s.chunk == rank) out.push_back({k, s.offset, s.chunk_offset, s.length});
    begin += numels[k];
  }
  return out;
}

std::vector<RingStep> ring_reduce_scatter_steps(int ranks, int rank) {
  TRIREME_CHECK(rank >= 0 && rank < ranks, "ring_reduce_scatter_steps: rank ", rank, " outside 0..",
                ranks - 1);
  std::vector<RingStep> steps;
  const auto mod = [ranks](int x) { return ((x % ranks) + ranks) % ranks; };
  for (int s = 0; s + 1 < ranks; ++s)
    steps.push_back({mod(rank - s - 1), mod(rank - s - 2), mod(rank + 1), mod(rank - 1)});
  return steps;
}

}  // namespace trireme::comm
