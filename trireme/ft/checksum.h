// CRC-32 (the gzip/zlib polynomial, reflected) of checkpoint and snapshot slices, computed
// with Intel ISA-L (Debian's libisal), whose carry-less-multiply kernels run an order of
// magnitude faster than a table-driven CRC: a snapshot checksums every tensor it copies.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trireme::ft {

uint32_t crc32(const void* data, size_t bytes);

// Copies `bytes` bytes from `from` to `to` (not overlapping) and returns their crc32(), in
// one pass over the source: a 64 KiB chunk is checksummed (which brings it into the
// cache) and then stored to `to` with non-temporal stores, which neither read the
// destination's lines first nor evict the training thread's data from the caches (a
// snapshot's slot is not read again until a restore). `from` must not change meanwhile.
// 19 MiB from cold caches, this machine: 2.9 ms, against 3.9 ms for a memcpy of each
// chunk checksummed from the copy (ft/snapshot.h copies host state with it, off the
// training thread).
uint32_t copy_with_crc32(void* to, const void* from, size_t bytes);

}  // namespace trireme::ft
