// CRC-32 of checkpoint slices (ft/checksum.h): the standard check value and zlib's, and the
// copy that checksums as it goes.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "trireme/ft/checksum.h"

TEST(Checksum, Crc32CheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(trireme::ft::crc32(text.data(), text.size()), 0xCBF43926u);  // CRC-32/ISO-HDLC
  EXPECT_EQ(trireme::ft::crc32(text.data(), 0), 0u);
  std::string flipped = text;
  flipped[4] ^= 0x10;
  EXPECT_NE(trireme::ft::crc32(flipped.data(), flipped.size()), 0xCBF43926u);
}

TEST(Checksum, CopyWithCrc32CopiesAndAgreesWithCrc32) {
  // Sizes around the 64 KiB chunk and the 64-byte stores, and none; destinations and
  // sources at every offset from a 16-byte boundary (the streamed stores need one).
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64} << 10, (size_t{64} << 10) + 7, size_t{1} << 20,
                       (size_t{1} << 20) + 100}) {
    for (size_t to_offset : {0, 1, 8, 15, 16, 33}) {
      const size_t from_offset = (to_offset * 7) % 17;
      std::vector<unsigned char> from(bytes + from_offset), to(bytes + to_offset + 1, 0xAB);
      for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<unsigned char>(i * 131 + (i >> 9));
      const uint32_t crc = trireme::ft::copy_with_crc32(to.data() + to_offset, from.data() + from_offset, bytes);
      EXPECT_EQ(crc, trireme::ft::crc32(from.data() + from_offset, bytes)) << bytes << " at " << to_offset;
      EXPECT_TRUE(std::equal(from.begin() + from_offset, from.end(), to.begin() + to_offset))
          << bytes << " at " << to_offset;
      EXPECT_TRUE(std::all_of(to.begin(), to.begin() + to_offset, [](unsigned char c) { return c == 0xAB; }))
          << "wrote before the start at " << bytes << " at " << to_offset;
      EXPECT_EQ(to[bytes + to_offset], 0xAB) << "wrote past the end at " << bytes << " at " << to_offset;
    }
  }
}
