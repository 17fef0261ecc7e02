// Reed–Solomon through ISA-L; see erasure.h.
#include "trireme/ft/erasure.h"

#include <isa-l/erasure_code.h>

#include <algorithm>

#include "trireme/common/error.h"

namespace trireme::ft {
namespace {

// ISA-L takes a block's length as an int: longer blocks (2 GiB and up: a machine's coded
// share of a large sharded model) go through in runs of kRun bytes, every pointer moved on
// by the run each time. (Cast whole, the length wrapped: no parity, and no error.)
constexpr size_t kRun = size_t{1} << 30;

void encode_in_runs(size_t bytes, int k, int rows, unsigned char* tables, const std::vector<unsigned char*>& in,
                    const std::vector<unsigned char*>& out) {
  std::vector<unsigned char*> from(in), to(out);
  for (size_t at = 0; at < bytes; at += kRun) {
    const size_t n = std::min(kRun, bytes - at);
    for (size_t i = 0; i < in.size(); ++i) from[i] = in[i] + at;
    for (size_t i = 0; i < out.size(); ++i) to[i] = out[i] + at;
    ec_encode_data(static_cast<int>(n), k, rows, tables, from.data(), to.data());
  }
}

}  // namespace

ErasureCode::ErasureCode(int k, int m) : k_(k), m_(m) {
  TRIREME_CHECK(k >= 1 && m >= 0 && k + m <= 255, "erasure code ", k, "+", m,
                    ": need at least 1 data block, no negative parity and at most 255 blocks in all");
  matrix_.resize(static_cast<size_t>((k + m) * k));
  gf_gen_cauchy1_matrix(matrix_.data(), k + m, k);
  tables_.resize(static_cast<size_t>(32 * k * std::max(m, 1)));
  if (m > 0) ec_init_tables(k, m, matrix_.data() + k * k, tables_.data());
}

void ErasureCode::encode(const std::vector<const uint8_t*>& data, const std::vector<uint8_t*>& parity,
                         size_t bytes) const {
  TRIREME_CHECK(static_cast<int>(data.size()) == k_ && static_cast<int>(parity.size()) == m_, "erasure code ",
                    k_, "+", m_, ": got ", data.size(), " data and ", parity.size(), " parity blocks");
  if (m_ == 0 || bytes == 0) return;
  std::vector<unsigned char*> in(data.size());
  for (size_t i = 0; i < data.size(); ++i) in[i] = const_cast<unsigned char*>(data[i]);  // ISA-L only reads them
  std::vector<unsigned char*> out(parity.begin(), parity.end());
  encode_in_runs(bytes, k_, m_, const_cast<unsigned char*>(tables_.data()), in, out);
}

void ErasureCode::encode_one(const std::vector<const uint8_t*>& data, int index, uint8_t* parity,
                             size_t bytes) const {
  TRIREME_CHECK(static_cast<int>(data.size()) == k_ && index >= 0 && index < m_, "erasure code ", k_, "+", m_,
                ": got ", data.size(), " data blocks for parity block ", index);
  if (bytes == 0) return;
  std::vector<unsigned char*> in(data.size());
  for (size_t i = 0; i < data.size(); ++i) in[i] = const_cast<unsigned char*>(data[i]);  // ISA-L only reads them
  // The expanded tables hold one 32 x k run per parity row, in order.
  auto* row = const_cast<unsigned char*>(tables_.data()) + static_cast<size_t>(32 * k_ * index);
  encode_in_runs(bytes, k_, 1, row, in, {parity});
}

void ErasureCode::reconstruct(const std::vector<uint8_t*>& blocks, const std::vector<int>& lost, size_t bytes) const {
  const int n = k_ + m_;
  TRIREME_CHECK(static_cast<int>(blocks.size()) == n, "erasure code ", k_, "+", m_, ": got ", blocks.size(),
                    " blocks, expected ", n);
  std::vector<bool> missing(static_cast<size_t>(n), false);
  for (int i : lost) {
    TRIREME_CHECK(i >= 0 && i < n, "erasure code ", k_, "+", m_, ": lost block ", i, " is not one of 0..", n - 1);
    missing[static_cast<size_t>(i)] = true;
  }
  const int nlost = static_cast<int>(std::count(missing.begin(), missing.end(), true));
  TRIREME_CHECK(nlost <= m_, "erasure code ", k_, "+", m_, ": ", nlost, " blocks lost, at most ", m_,
                    " can be rebuilt");
  if (nlost == 0 || bytes == 0) return;
  // The first k surviving blocks and their generator rows.
  std::vector<int> survivors;
  for (int i = 0; i < n && static_cast<int>(survivors.size()) < k_; ++i)
    if (!missing[static_cast<size_t>(i)]) survivors.push_back(i);
  std::vector<uint8_t> rows(static_cast<size_t>(k_ * k_)), inverse(static_cast<size_t>(k_ * k_));
  for (int r = 0; r < k_; ++r)
    std::copy_n(matrix_.begin() + survivors[r] * k_, k_, rows.begin() + r * k_);
  if (gf_invert_matrix(rows.data(), inverse.data(), k_) != 0)
    TRIREME_THROW(Error, "erasure code ", k_, "+", m_, ": singular survivor matrix (a Trireme bug)");
  // Each lost block is (its generator row) x inverse x (survivors): one decode row each.
  std::vector<uint8_t> decode;
  std::vector<unsigned char*> outputs;
  for (int i = 0; i < n; ++i) {
    if (!missing[static_cast<size_t>(i)]) continue;
    for (int c = 0; c < k_; ++c) {
      uint8_t sum = 0;
      for (int j = 0; j < k_; ++j)
        sum ^= gf_mul(matrix_[static_cast<size_t>(i * k_ + j)], inverse[static_cast<size_t>(j * k_ + c)]);
      decode.push_back(sum);
    }
    outputs.push_back(blocks[static_cast<size_t>(i)]);
  }
  std::vector<uint8_t> tables(static_cast<size_t>(32 * k_ * nlost));
  ec_init_tables(k_, nlost, decode.data(), tables.data());
  std::vector<unsigned char*> inputs;
  for (int s : survivors) inputs.push_back(blocks[static_cast<size_t>(s)]);
  encode_in_runs(bytes, k_, nlost, tables.data(), inputs, outputs);
}

Stripe Stripe::of(size_t total, int k) {
  TRIREME_CHECK(k >= 1, "stripe over ", k, " blocks: need at least 1");
  const size_t per = (total + static_cast<size_t>(k) - 1) / static_cast<size_t>(k);
  return {(per + 63) / 64 * 64};
}

}  // namespace trireme::ft
