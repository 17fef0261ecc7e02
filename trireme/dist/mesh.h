// Mesh: pure rank arithmetic over named parallel axes (dp, tp, pp, ...).
//
// A mesh is an ordered list of axes, innermost (fastest-varying) first. With axes
// a_0, a_1, ..., a_{n-1} of sizes s_0 ... s_{n-1} and coordinates c_i in [0, s_i):
//
//     global_rank = c_0 + c_1*s_0 + c_2*s_0*s_1 + ... + c_{n-1}*s_0*...*s_{n-2}
//
// Megatron's default order is tp innermost, then dp, then pp ("tp-dp-pp"), which keeps a
// tensor-parallel group on consecutive ranks (one machine) and a pipeline's stages far
// apart. Worked example, order tp-dp-pp with tp=2, dp=2, pp=2 (8 ranks):
//
//     rank  tp dp pp        tp groups: {0,1} {2,3} {4,5} {6,7}
//       0    0  0  0        dp groups: {0,2} {1,3} {4,6} {5,7}
//       1    1  0  0        pp groups: {0,4} {1,5} {2,6} {3,7}
//       2    0  1  0
//       3    1  1  0        rank 6 = tp 0 + dp 1*2 + pp 1*(2*2)
//       4    0  0  1
//       5    1  0  1
//       6    0  1  1
//       7    1  1  1
//
// The group of rank r along axis a holds the ranks that share every coordinate of r except
// a, ordered by their coordinate on a (so a rank's index in its group is its coordinate).
// Groups of one axis are listed in order of their smallest member.
//
// Pure: no process groups here (dist/world.h builds those from a Mesh).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace trireme::dist {

struct Axis {
  std::string name;
  int size = 1;
};

class Mesh {
 public:
  // Axes innermost first. Names must be unique and non-empty, sizes >= 1.
  explicit Mesh(std::vector<Axis> axes);

  // Builds the (dp, tp, pp) mesh from an order string such as "tp-dp-pp" (innermost
  // first; any permutation of the three names). Throws InvalidArgument on a bad order.
  static Mesh from_sizes(int dp, int tp, int pp, const std::string& order = "tp-dp-pp");

  int world_size() const { return world_size_; }
  const std::vector<Axis>& axes() const { return axes_; }
  bool has_axis(const std::string& axis) const;
  int size(const std::string& axis) const;

  // Coordinates of rank, one per axis in axis order.
  std::vector<int> coords(int rank) const;
  int coord(int rank, const std::string& axis) const;
  int rank_of(const std::vector<int>& coords) const;

  // Ranks of the group of `rank` along `axis`, ordered by coordinate on that axis.
  std::vector<int> group(int rank, const std::string& axis) const;
  // Every group along `axis`, in order of smallest member.
  std::vector<std::vector<int>> groups(const std::string& axis) const;

  // "tp=2 x dp=2 x pp=2 (tp-dp-pp)"
  std::string describe() const;

 private:
  int axis_index(const std::string& axis) const;
  void check_rank(int rank) const;

  std::vector<Axis> axes_;
  std::vector<int> strides_;  // strides_[i] = product of sizes of axes before i
  int world_size_ = 1;
};

// A group's members as a name for its store keys: "0,2,4" while the list is at most 64
// characters, else "N#H", the member count and a 64-bit FNV-1a hash of the list (every key
// of a group's setup carries the name; a group of 8192 ranks would put 45 kB on each).
std::string group_key_name(const std::vector<int>& ranks);

}  // namespace trireme::dist
