// Deterministic, resumable batch sampler for language-model training.
//
// Terms: the *global batch* of a step is `global_batch` window start offsets into the
// corpus; each window covers bytes [o, o + seq_len] (inputs plus the shifted target), so
// every offset lies in [0, corpus_size - seq_len - 1]. Offset i of step s is
//
//     offset(s, i) = range(mix(mix(mix(seed) ^ s) ^ i))     mix = splitmix64 finaliser
//
// (range maps 64 bits onto [0, corpus_size - seq_len) by a 128-bit multiply). It is a pure
// function of (seed, step, index): no state advances, so resuming at step s needs only s,
// and the global batch is the same whatever the number of ranks. Data-parallel rank r of
// W takes the contiguous slice [r*B/W, (r+1)*B/W) of the global batch, so concatenating
// the shards of ranks 0..W-1 gives the global batch back. Replicas of unequal batch sizes
// (a replica on a slower device takes fewer sequences) take contiguous slices of their
// own lengths, in replica order: slice(). Pure C++: no libtorch.
#pragma once

#include <cstdint>
#include <vector>

namespace trireme::data {

class BatchSampler {
 public:
  // Throws InvalidArgument for seq_len < 1, global_batch < 1, or a corpus shorter than
  // seq_len + 1 bytes.
  BatchSampler(uint64_t corpus_size, int64_t seq_len, int64_t global_batch, uint64_t seed);

  // The global_batch start offsets of `step` (step >= 0).
  std::vector<uint64_t> global_offsets(int64_t step) const;

  // Rank `rank`'s contiguous slice of global_offsets(step). Throws InvalidArgument when
  // world < 1, rank is outside [0, world) or global_batch % world != 0.
  std::vector<uint64_t> shard(int64_t step, int64_t rank, int64_t world) const;

  // Offsets [begin, begin + count) of global_offsets(step). Throws InvalidArgument when
  // the range is empty or leaves the global batch.
  std::vector<uint64_t> slice(int64_t step, int64_t begin, int64_t count) const;

  // One offset, for callers that want a single window: index in [0, global_batch).
  uint64_t offset(int64_t step, int64_t index) const;

  uint64_t corpus_size() const { return corpus_size_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t global_batch() const { return global_batch_; }
  uint64_t seed() const { return seed_; }

 private:
  uint64_t corpus_size_;
  int64_t seq_len_;
  int64_t global_batch_;
  uint64_t seed_;
  uint64_t num_starts_;  // corpus_size - seq_len: the number of valid window starts
};

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
uint64_t splitmix64(uint64_t x);

}  // namespace trireme::data
