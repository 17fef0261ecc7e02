// CRC-32 of checkpoint slices (ft/checksum.h): the standard check value and zlib's.
#include <gtest/gtest.h>

#include <string>

#include "trireme/ft/checksum.h"

TEST(Checksum, Crc32CheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(trireme::ft::crc32(text.data(), text.size()), 0xCBF43926u);  // CRC-32/ISO-HDLC
  EXPECT_EQ(trireme::ft::crc32(text.data(), 0), 0u);
  std::string flipped = text;
  flipped[4] ^= 0x10;
  EXPECT_NE(trireme::ft::crc32(flipped.data(), flipped.size()), 0xCBF43926u);
}

TEST(Checksum, CopyWithCrc32MatchesCopyThenCrc) {
  // Longer than one block, and not a multiple of it.
  std::string source(700 * 1024 + 13, '\0');
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::string copy(source.size(), '\0');
  const uint32_t crc = trireme::ft::copy_with_crc32(copy.data(), source.data(), source.size());
  EXPECT_EQ(copy, source);
  EXPECT_EQ(crc, trireme::ft::crc32(source.data(), source.size()));
}
