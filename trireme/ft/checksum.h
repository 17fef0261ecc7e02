// CRC-32 (the gzip/zlib polynomial, reflected) of checkpoint and snapshot slices, computed
// with Intel ISA-L (Debian's libisal), whose carry-less-multiply kernels run an order of
// magnitude faster than a table-driven CRC: a snapshot checksums every tensor it copies.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trireme::ft {

uint32_t crc32(const void* data, size_t bytes);

// Copies `bytes` bytes from `from` to `to` (not overlapping) and returns their crc32(), in
// one pass: a chunk small enough to stay in cache is copied, then checksummed from the
// copy. Measured on 38 MiB: 6.5 ms, against 6.0 ms for the copy and 3.7 ms for a CRC pass
// over memory after it (ft/snapshot.h copies host state with it, off the training thread).
uint32_t copy_with_crc32(void* to, const void* from, size_t bytes);

}  // namespace trireme::ft
