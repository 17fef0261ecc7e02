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
  // Sizes around the 256 KiB chunk, and none.
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{256} << 10, (size_t{256} << 10) + 7, size_t{3} << 20}) {
    std::vector<unsigned char> from(bytes), to(bytes + 1, 0xAB);
    for (size_t i = 0; i < bytes; ++i) from[i] = static_cast<unsigned char>(i * 131 + (i >> 9));
    const uint32_t crc = trireme::ft::copy_with_crc32(to.data(), from.data(), bytes);
    EXPECT_EQ(crc, trireme::ft::crc32(from.data(), bytes)) << bytes;
    EXPECT_TRUE(std::equal(from.begin(), from.end(), to.begin())) << bytes;
    EXPECT_EQ(to[bytes], 0xAB) << "wrote past the end at " << bytes;
  }
}
