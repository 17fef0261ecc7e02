// Rank arithmetic of dist/mesh.h; see the formula and worked example there.
#include "trireme/dist/mesh.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::dist {

Mesh::Mesh(std::vector<Axis> axes) : axes_(std::move(axes)) {
  TRIREME_CHECK(!axes_.empty(), "a mesh needs at least one axis");
  for (size_t i = 0; i < axes_.size(); ++i) {
    TRIREME_CHECK(!axes_[i].name.empty(), "mesh axis ", i, " has no name");
    TRIREME_CHECK(axes_[i].size >= 1, "mesh axis ", axes_[i].name, " has size ",
                  axes_[i].size, "; sizes must be at least 1");
    for (size_t j = 0; j < i; ++j)
      TRIREME_CHECK(axes_[j].name != axes_[i].name, "mesh axis ", axes_[i].name,
                    " appears twice");
    strides_.push_back(world_size_);
    TRIREME_CHECK(int64_t{world_size_} * axes_[i].size <= std::numeric_limits<int>::max(), "a mesh of ",
                  int64_t{world_size_} * axes_[i].size, "+ ranks (axis ", axes_[i].name,
                  " of size ", axes_[i].size, ") is more than this build counts; choose smaller sizes");
    world_size_ *= axes_[i].size;
  }
}

Mesh Mesh::from_sizes(int dp, int tp, int pp, const std::string& order) {
  std::vector<std::string> names;
  std::stringstream in(order);
  for (std::string name; std::getline(in, name, '-');) names.push_back(name);
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  TRIREME_CHECK(sorted == std::vector<std::string>({"dp", "pp", "tp"}), "mesh order '", order,
                "' must name dp, tp and pp once each, innermost first, e.g. tp-dp-pp");
  std::vector<Axis> axes;
  for (const auto& name : names)
    axes.push_back({name, name == "dp" ? dp : name == "tp" ? tp : pp});
  return Mesh(std::move(axes));
}

int Mesh::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == axis) return static_cast<int>(i);
  TRIREME_THROW(InvalidArgument, "mesh ", describe(), " has no axis '", axis, "'");
}

bool Mesh::has_axis(const std::string& axis) const {
  return std::any_of(axes_.begin(), axes_.end(), [&](const Axis& a) { return a.name == axis; });
}

int Mesh::size(const std::string& axis) const { return axes_[axis_index(axis)].size; }

void Mesh::check_rank(int rank) const {
  TRIREME_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is outside mesh ",
                describe());
}

std::vector<int> Mesh::coords(int rank) const {
  check_rank(rank);
  std::vector<int> out(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) out[i] = (rank / strides_[i]) % axes_[i].size;
  return out;
}

int Mesh::coord(int rank, const std::string& axis) const {
  check_rank(rank);
  const int i = axis_index(axis);
  return (rank / strides_[i]) % axes_[i].size;
}

int Mesh::rank_of(const std::vector<int>& coords) const {
  TRIREME_CHECK(coords.size() == axes_.size(), "expected ", axes_.size(),
                " mesh coordinates, got ", coords.size());
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    TRIREME_CHECK(coords[i] >= 0 && coords[i] < axes_[i].size, "coordinate ", coords[i],
                  " is outside axis ", axes_[i].name, " of size ", axes_[i].size);
    rank += coords[i] * strides_[i];
  }
  return rank;
}

std::vector<int> Mesh::group(int rank, const std::string& axis) const {
  const int i = axis_index(axis);
  std::vector<int> c = coords(rank);
  std::vector<int> members;
  for (int k = 0; k < axes_[i].size; ++k) {
    c[i] = k;
    members.push_back(rank_of(c));
  }
  return members;
}

std::vector<std::vector<int>> Mesh::groups(const std::string& axis) const {
  const int i = axis_index(axis);
  std::vector<std::vector<int>> out;
  for (int rank = 0; rank < world_size_; ++rank)
    if (coords(rank)[i] == 0) out.push_back(group(rank, axis));
  return out;  // ranks ascend, so groups come in order of their smallest member
}

std::string Mesh::describe() const {
  std::ostringstream out;
  std::string order;
  for (size_t i = 0; i < axes_.size(); ++i) {
    out << (i ? " x " : "") << axes_[i].name << "=" << axes_[i].size;
    order += (i ? "-" : "") + axes_[i].name;
  }
  out << " (" << order << ")";
  return out.str();
}

std::string group_key_name(const std::vector<int>& ranks) {
  std::string members;
  for (size_t i = 0; i < ranks.size(); ++i) members += (i ? "," : "") + std::to_string(ranks[i]);
  if (members.size() <= 64) return members;
  uint64_t hash = 14695981039346656037ull;
  for (const char c : members) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char text[48];
  std::snprintf(text, sizeof(text), "%zu#%016llx", ranks.size(), static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace trireme::dist
