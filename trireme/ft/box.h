// Boxes: the part of a whole-model tensor that a checkpoint slice holds or that a rank
// needs. Pure arithmetic, no libtorch.
//
// A box is a hyper-rectangle of a tensor: per dimension a start and a size. A
// tensor-parallel shard (parallel/tensor/tensor_parallel.h: split along `dim` into
// `blocks` blocks, each cut `ranks` ways, rank r keeping piece r of every block) is one box
// per block; the rank's local tensor is those boxes concatenated along `dim`, in order.
// Checkpoints store boxes and are read back by boxes, so a checkpoint written under one
// layout can be read under any other: a reader asks for the boxes it needs and copies
// the intersections with the stored ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trireme::ft {

struct Box {
  std::vector<int64_t> start, size;
  int64_t numel() const;
  bool operator==(const Box& other) const { return start == other.start && size == other.size; }
};

// The whole tensor of `shape`.
Box whole(const std::vector<int64_t>& shape);

// The boxes of `shape` that tensor-parallel rank `rank` of `ranks` holds when the tensor
// is split along `dim` (-1: not split; one whole box) into `blocks` blocks. Throws
// InvalidArgument when shape[dim] is not divisible by blocks * ranks.
std::vector<Box> shard_boxes(const std::vector<int64_t>& shape, int64_t dim, int64_t blocks, int rank,
                             int ranks);

// The common part of two boxes of the same tensor, if any.
std::optional<Box> intersect(const Box& a, const Box& b);

// "[0:4, 8:16]" (start:end per dimension).
std::string describe(const Box& box);

}  // namespace trireme::ft
