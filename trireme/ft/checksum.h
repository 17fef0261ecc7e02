// CRC-32 (the gzip/zlib polynomial, reflected) of checkpoint and snapshot slices, computed
// with Intel ISA-L (Debian's libisal), whose carry-less-multiply kernels run an order of
// magnitude faster than a table-driven CRC: a snapshot checksums every tensor it copies,
// on the training thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trireme::ft {

uint32_t crc32(const void* data, size_t bytes);

// Copies `bytes` from `src` to `dst` and returns the CRC-32 of them, in blocks small enough
// that each is checksummed while it is still in cache: close to the cost of the copy
// alone, instead of copy plus a second pass over memory.
uint32_t copy_with_crc32(void* dst, const void* src, size_t bytes);

}  // namespace trireme::ft
