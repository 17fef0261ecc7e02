// The agents' side of erasure-coded snapshots (issue 6): after a snapshot, the machines of
// a job exchange blocks over a group of their own (one rank per machine, rank = machine
// index; not the training groups) so that each keeps the parity blocks ft/redundancy.h
// assigns it; after machines are lost, the survivors send what they hold of the affected
// codewords to one of them, which rebuilds the lost machines' snapshot bytes.
//
// Both are collectives over that group (every machine calls them, with the same plan).
// Transfers are point to point and asynchronous: every receive is posted, then every
// send, then all are awaited, so no order between machines can deadlock.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "trireme/dist/backend.h"
#include "trireme/ft/redundancy.h"

namespace trireme::ft {

// What one machine keeps after a round.
struct ParityHeld {
  uint64_t block = 0;                               // bytes per block in its group
  std::map<int, uint64_t> sizes;                    // snapshot bytes of each machine of its group
  std::map<std::pair<int, int>, std::vector<uint8_t>> parity;  // (codeword, parity index) -> block
};

// Every machine passes its snapshot bytes; returns what this machine must keep.
ParityHeld exchange_parity(const RedundancyPlan& plan, int machine, const uint8_t* bytes, uint64_t size,
                           const dist::Group& agents);

// After the machines in `lost` lost their memory: every other machine passes its snapshot
// bytes and what it kept from the last exchange_parity; the lowest surviving machine of
// each affected group returns the rebuilt bytes of that group's lost machines (the others
// return an empty map). Throws InvalidArgument when `lost` is beyond the plan's redundancy.
std::map<int, std::vector<uint8_t>> rebuild_lost(const RedundancyPlan& plan, int machine,
                                                 const std::vector<int>& lost, const uint8_t* bytes,
                                                 const ParityHeld& held, const dist::Group& agents);

}  // namespace trireme::ft
