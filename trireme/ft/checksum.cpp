// CRC-32 through ISA-L; see checksum.h.
#include "trireme/ft/checksum.h"

#include <isa-l/crc.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
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

namespace {

// Copies n bytes with non-temporal stores where `to` is 16-byte aligned (SSE2, which every
// x86-64 has), else memcpy.
void stream_copy(unsigned char* to, const unsigned char* from, size_t n) {
#if defined(__SSE2__)
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(to) % 16) % 16);
  std::memcpy(to, from, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + i + 48), d);
  }
  std::memcpy(to + i, from + i, n - i);
#else
  std::memcpy(to, from, n);
#endif
}

}  // namespace

uint32_t copy_with_crc32(void* to, const void* from, size_t bytes) {
  constexpr size_t kChunk = size_t{64} << 10;  // well inside L2
  uint32_t crc = 0;
  auto* out = static_cast<unsigned char*>(to);
  const auto* in = static_cast<const unsigned char*>(from);
  for (size_t done = 0; done < bytes; done += kChunk) {
    const size_t n = std::min(kChunk, bytes - done);
    crc = crc32_gzip_refl(crc, in + done, n);
    stream_copy(out + done, in + done, n);
  }
#if defined(__SSE2__)
  _mm_sfence();  // the streamed stores are visible before whatever the caller publishes next
#endif
  return crc;
}

}  // namespace trireme::ft
