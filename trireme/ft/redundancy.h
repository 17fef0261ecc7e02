// Where erasure-coded snapshot blocks live across machines (issue 6): the pure plan that
// the agents follow. Pure: no libtorch, no I/O.
//
// The machines of a job are split into redundancy groups of about k + m consecutive
// machines (`--redundancy k+m`); a group of n machines codes with k' = n - m data blocks,
// so a job whose size is not a multiple of k + m still protects every machine against any
// m losses in its group. Within a group, every machine's snapshot is cut into k' blocks
// (ft/erasure.h, Stripe) and the group forms n codewords by rotation:
//   codeword j, data position p (0..k'-1):  block p of machine (j + p) mod n
//   codeword j, parity r (0..m-1):          kept by machine (j + k' + r) mod n
// Each codeword's n blocks sit on n different machines, so losing any m machines loses at
// most m blocks of each codeword, which ft::ErasureCode rebuilds. Each machine's k' blocks
// are each in one codeword, and it keeps m parity blocks: memory overhead m / k' of a
// snapshot, and it sends m blocks' worth per block of its own (m x its snapshot) per round.
#pragma once

#include <string>
#include <vector>

namespace trireme::ft {

struct BlockRef {
  int machine = 0;      // job-wide machine (node) index
  bool parity = false;  // a parity block (kept by `machine`) or a data block (of `machine`)
  int index = 0;        // data: which of the machine's k' blocks; parity: which of m
};

struct RedundancyGroup {
  std::vector<int> machines;  // job-wide indices, consecutive
  int k = 0, m = 0;           // k: data blocks per codeword (= machines.size() - m)

  int size() const { return static_cast<int>(machines.size()); }
  // Codeword j (0..size-1): k data refs, then m parity refs.
  std::vector<BlockRef> codeword(int j) const;
  // The codewords (j, position) in which `machine` keeps a parity block, by parity index.
  std::vector<std::pair<int, int>> parity_kept_by(int machine) const;
  // Whether the snapshots of every machine survive the loss of `lost` (job-wide indices).
  bool recoverable(const std::vector<int>& lost) const;
};

struct RedundancyPlan {
  std::vector<RedundancyGroup> groups;

  // Throws InvalidArgument (naming --redundancy) unless k >= 1, m >= 0 and there are at
  // least k + m machines.
  static RedundancyPlan make(int machines, int k, int m);
  // Parses "K+M" (e.g. "2+1"); throws InvalidArgument naming the flag.
  static std::pair<int, int> parse(const std::string& spec);
  const RedundancyGroup& group_of(int machine) const;
  bool recoverable(const std::vector<int>& lost) const;
};

}  // namespace trireme::ft
