// Bucket assignment; see comm/bucket.h for the rules.
#include "trireme/comm/bucket.h"

#include <algorithm>
#include <map>

#include "trireme/common/error.h"

namespace trireme::comm {

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                const std::vector<size_t>& order,
                                                const BucketOptions& options) {
  TRIREME_CHECK(order.size() == params.size(), "bucket order lists ", order.size(),
                " parameters, expected ", params.size());
  std::vector<bool> seen(params.size(), false);
  for (size_t index : order) {
    TRIREME_CHECK(index < params.size() && !seen[index], "bucket order is not a permutation (",
                  index, ")");
    seen[index] = true;
  }

  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
  };
  std::map<int64_t, Open> open;  // one open bucket per key
  std::vector<std::vector<size_t>> out;
  auto cap = [&] { return out.empty() ? options.first_cap_bytes : options.cap_bytes; };

  for (size_t index : order) {
    Open& bucket = open[params[index].key];
    bucket.members.push_back(index);
    bucket.bytes += params[index].bytes;
    if (bucket.bytes >= cap()) {  // reached the cap: close it now
      out.push_back(std::move(bucket.members));
      bucket = Open{};
    }
  }
  // Remaining open buckets close in the order their first member appeared in `order`.
  std::vector<std::pair<size_t, std::vector<size_t>>> rest;
  std::vector<size_t> position(params.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  for (auto& [key, bucket] : open)
    if (!bucket.members.empty())
      rest.emplace_back(position[bucket.members.front()], std::move(bucket.members));
  std::sort(rest.begin(), rest.end());
  for (auto& entry : rest) out.push_back(std::move(entry.second));
  return out;
}

}  // namespace trireme::comm
