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
