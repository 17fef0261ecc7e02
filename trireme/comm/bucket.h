// Gradient bucket assignment: which parameters' gradients travel together in one
// all-reduce. Pure function of sizes and an order; DataParallel calls it twice: first with
// the reverse of the registration order (gradients of the last layers are ready first in
// backward), then once more with the order in which gradients were actually observed to
// become ready in the first step.
//
// Terms:
//   bucket      a list of parameter indices whose gradients are flattened into one buffer
//   cap         parameters are added to the open bucket until its size reaches the cap,
//               then it closes (so a bucket overshoots its cap by less than one parameter;
//               PyTorch's compute_bucket_assignment_by_size fills buckets the same way,
//               which keeps the benchmark's buckets equal to the peer's)
//   first cap   the first bucket closed gets a smaller cap (default 1 MiB), so that the
//               first all-reduce starts early in backward (PyTorch DDP does the same)
//   key         gradients of different dtypes or devices never share a bucket; each key
//               fills its own open bucket, and buckets are emitted in the order they close
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trireme::comm {

// 25 MiB: PyTorch DDP's default bucket_cap_mb, large enough to amortise the per-collective
// latency, small enough to start communicating long before backward ends.
constexpr size_t kDefaultBucketCapBytes = 25u << 20;
// 1 MiB: PyTorch DDP's first-bucket size.
constexpr size_t kDefaultFirstBucketCapBytes = 1u << 20;

struct BucketParam {
  size_t bytes = 0;
  int64_t key = 0;  // dtype/device class; equal keys may share a bucket
};

struct BucketOptions {
  size_t cap_bytes = kDefaultBucketCapBytes;
  size_t first_cap_bytes = kDefaultFirstBucketCapBytes;
};

// Returns buckets of indices into params. `order` lists each index exactly once: the order
// in which gradients are expected to become ready. Throws InvalidArgument if `order` is not
// a permutation of 0..params.size()-1.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params,
                                                const std::vector<size_t>& order,
                                                const BucketOptions& options = {});

// 0..n-1 reversed: the default order before any backward has been observed.
std::vector<size_t> reverse_order(size_t n);

}  // namespace trireme::comm
