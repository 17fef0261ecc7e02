// Box arithmetic for checkpoints; see box.h.
#include "trireme/ft/box.h"

#include <algorithm>

#include "trireme/common/error.h"

namespace trireme::ft {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : size) n *= s;
  return n;
}

Box whole(const std::vector<int64_t>& shape) { return {std::vector<int64_t>(shape.size(), 0), shape}; }

std::vector<Box> shard_boxes(const std::vector<int64_t>& shape, int64_t dim, int64_t blocks, int rank,
                             int ranks) {
  if (dim < 0 || ranks == 1) return {whole(shape)};
  TRIREME_CHECK(dim < static_cast<int64_t>(shape.size()), "shard_boxes: dim ", dim, " of a ",
                shape.size(), "-d tensor");
  TRIREME_CHECK(blocks >= 1 && shape[dim] % (blocks * ranks) == 0, "shard_boxes: size ", shape[dim],
                " along dim ", dim, " is not divisible by ", blocks, " blocks x ", ranks, " ranks");
  const int64_t block = shape[dim] / blocks, piece = block / ranks;
  std::vector<Box> out;
  for (int64_t k = 0; k < blocks; ++k) {
    Box box = whole(shape);
    box.start[dim] = k * block + rank * piece;
    box.size[dim] = piece;
    out.push_back(box);
  }
  return out;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  TRIREME_CHECK(a.start.size() == b.start.size(), "intersect: boxes of ", a.start.size(), " and ",
                b.start.size(), " dimensions");
  Box out;
  for (size_t d = 0; d < a.start.size(); ++d) {
    const int64_t lo = std::max(a.start[d], b.start[d]);
    const int64_t hi = std::min(a.start[d] + a.size[d], b.start[d] + b.size[d]);
    if (hi <= lo) return std::nullopt;
    out.start.push_back(lo);
    out.size.push_back(hi - lo);
  }
  return out;
}

std::string describe(const Box& box) {
  std::string text = "[";
  for (size_t d = 0; d < box.start.size(); ++d)
    text += (d ? ", " : "") + std::to_string(box.start[d]) + ":" + std::to_string(box.start[d] + box.size[d]);
  return text + "]";
}

}  // namespace trireme::ft
