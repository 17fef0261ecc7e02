// BatchSampler: counter-based offsets; see sampler.h.
#include "trireme/data/sampler.h"

#include "trireme/common/error.h"

namespace trireme::data {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

BatchSampler::BatchSampler(uint64_t corpus_size, int64_t seq_len, int64_t global_batch,
                           uint64_t seed)
    : corpus_size_(corpus_size), seq_len_(seq_len), global_batch_(global_batch), seed_(seed) {
  TRIREME_CHECK(seq_len >= 1, "--seq must be positive, got ", seq_len);
  TRIREME_CHECK(global_batch >= 1, "--batch must be positive, got ", global_batch);
  TRIREME_CHECK(corpus_size >= static_cast<uint64_t>(seq_len) + 1, "the corpus has ",
                corpus_size, " bytes, too short for --seq ", seq_len,
                "; give a text of at least ", static_cast<uint64_t>(seq_len) + 1, " bytes or lower --seq");
  num_starts_ = corpus_size - static_cast<uint64_t>(seq_len);
}

uint64_t BatchSampler::offset(int64_t step, int64_t index) const {
  TRIREME_CHECK(step >= 0, "sampler step must be non-negative, got ", step);
  TRIREME_CHECK(index >= 0 && index < global_batch_, "sampler index ", index,
                " is outside the global batch of ", global_batch_);
  uint64_t h = splitmix64(seed_);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  h = splitmix64(h ^ static_cast<uint64_t>(index));
  // Map onto [0, num_starts_) with a multiply-high (Lemire); bias is < num_starts_ / 2^64.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * num_starts_) >> 64);
}

std::vector<uint64_t> BatchSampler::global_offsets(int64_t step) const {
  std::vector<uint64_t> out;
  out.reserve(static_cast<size_t>(global_batch_));
  for (int64_t i = 0; i < global_batch_; ++i) out.push_back(offset(step, i));
  return out;
}

std::vector<uint64_t> BatchSampler::shard(int64_t step, int64_t rank, int64_t world) const {
  TRIREME_CHECK(world >= 1, "data-parallel size must be positive, got ", world);
  TRIREME_CHECK(rank >= 0 && rank < world, "data-parallel rank ", rank,
                " is outside 0..", world - 1);
  TRIREME_CHECK(global_batch_ % world == 0, "--batch ", global_batch_,
                " is not divisible by ", world, " data-parallel ranks; choose a multiple of ",
                world);
  const int64_t per_rank = global_batch_ / world;
  return slice(step, rank * per_rank, per_rank);
}

std::vector<uint64_t> BatchSampler::slice(int64_t step, int64_t begin, int64_t count) const {
  TRIREME_CHECK(count >= 1 && begin >= 0 && begin <= global_batch_ && count <= global_batch_ - begin,
                "sequences [", begin, ", +", count, ") are not a slice of the global batch of ", global_batch_);
  std::vector<uint64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = begin; i < begin + count; ++i) out.push_back(offset(step, i));
  return out;
}

}  // namespace trireme::data
