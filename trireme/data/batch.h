// Turning sampler offsets into training tensors for a byte-level language model.
//
// A window at offset o gives inputs = bytes[o, o+T) and targets = bytes[o+1, o+T+1): the
// target at each position is the next byte.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "trireme/data/corpus.h"

namespace trireme::data {

struct Batch {
  at::Tensor inputs;   // (B,T) int64
  at::Tensor targets;  // (B,T) int64
};

// Throws InvalidArgument when seq_len < 1 or a window runs past the end of the corpus.
// Empty `offsets` give (0,T) tensors.
Batch make_batch(const Corpus& corpus, const std::vector<uint64_t>& offsets, int64_t seq_len);

}  // namespace trireme::data
