// Reed–Solomon erasure coding of snapshot shards across machines (issue 6), over GF(2^8)
// with Intel ISA-L (Debian's libisal): k data blocks and m parity blocks of equal length;
// any k of the k+m rebuild the rest, so a redundancy group survives the loss of any m of
// its machines. The code is systematic (the data blocks are stored as they are) with a
// Cauchy generator matrix, whose every k x k submatrix is invertible.
//
// Pure: no libtorch. Blocks are caller-owned byte buffers; stripe() says how a byte string
// is cut into k blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trireme::ft {

class ErasureCode {
 public:
  // Throws InvalidArgument unless 1 <= k, 0 <= m and k + m <= 255.
  ErasureCode(int k, int m);

  int k() const { return k_; }
  int m() const { return m_; }

  // Writes the m parity blocks from the k data blocks, each `bytes` long.
  void encode(const std::vector<const uint8_t*>& data, const std::vector<uint8_t*>& parity, size_t bytes) const;
  // Only parity block `index` (0..m-1): what a machine that keeps that one block computes.
  void encode_one(const std::vector<const uint8_t*>& data, int index, uint8_t* parity, size_t bytes) const;

  // blocks: all k + m blocks in order (data, then parity), each `bytes` long; the ones
  // whose indices are in `lost` are overwritten with their rebuilt contents from the
  // others. Throws InvalidArgument when more than m are lost or an index is out of range.
  void reconstruct(const std::vector<uint8_t*>& blocks, const std::vector<int>& lost, size_t bytes) const;

 private:
  int k_, m_;
  std::vector<uint8_t> matrix_;  // (k + m) x k generator, row-major; the top k x k is I
  std::vector<uint8_t> tables_;  // ISA-L's expanded tables of the parity rows
};

// How `total` bytes are cut into k data blocks: each `block` bytes (the last one padded
// with zeros), block a multiple of 64 so that every block stays aligned for ISA-L's
// vector kernels.
struct Stripe {
  size_t block = 0;
  static Stripe of(size_t total, int k);
};

}  // namespace trireme::ft
