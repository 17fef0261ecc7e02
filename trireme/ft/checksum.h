// CRC-32 (the gzip/zlib polynomial, reflected) of checkpoint and snapshot slices, computed
// with Intel ISA-L (Debian's libisal), whose carry-less-multiply kernels run an order of
// magnitude faster than a table-driven CRC: a snapshot checksums every tensor it copies,
// on a thread that runs in the idle moments of a step.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trireme::ft {

uint32_t crc32(const void* data, size_t bytes);

}  // namespace trireme::ft
