// CRC-32 through ISA-L; see checksum.h.
#include "trireme/ft/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

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

uint32_t copy_with_crc32(void* to, const void* from, size_t bytes) {
  constexpr size_t kChunk = size_t{256} << 10;  // well inside L2
  uint32_t crc = 0;
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
  for (size_t done = 0; done < bytes; done += kChunk) {
    const size_t n = std::min(kChunk, bytes - done);
    std::memcpy(out + done, in + done, n);
    crc = crc32_gzip_refl(crc, out + done, n);
  }
  return crc;
}

}  // namespace trireme::ft
