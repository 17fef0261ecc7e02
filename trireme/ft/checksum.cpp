// CRC-32 through ISA-L; see checksum.h.
#include "trireme/ft/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace trireme::ft {

uint32_t crc32(const void* data, size_t bytes) {
  uint32_t crc = 0;
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {  // ISA-L takes 64-bit lengths, but keep each call bounded
    const size_t n = std::min<size_t>(bytes, size_t{1} << 30);
    crc = crc32_gzip_refl(crc, p, n);
    p += n;
    bytes -= n;
  }
  return crc;
}

}  // namespace trireme::ft
