// The agents' side of erasure-coded snapshots (issue 6): after a snapshot, the machines of
// a job exchange blocks over a group of their own (one rank per machine, rank = machine
// index; not the training groups) so that each keeps the parity blocks ft/redundancy.h
// assigns it; after machines are lost, the survivors send what they hold of the affected
// codewords to one of them, which rebuilds the lost machines' snapshot bytes. The rebuild
// runs over whatever group the survivors have (typically one of their own, the lost
// machines gone from it), so it takes the group rank of each machine index.
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
// return an empty map). Machines are the plan's (the exchange's) indices throughout;
// rank_of_machine[machine] is that machine's rank in `agents` (-1 where it has none, as a
// lost machine), one entry per machine of the plan. Throws InvalidArgument when `lost` is
// beyond the plan's redundancy or a surviving machine has no rank.
std::map<int, std::vector<uint8_t>> rebuild_lost(const RedundancyPlan& plan, int machine,
                                                 const std::vector<int>& lost, const uint8_t* bytes,
                                                 const ParityHeld& held, const dist::Group& agents,
                                                 const std::vector<int>& rank_of_machine);

// rank_of_machine for a group of every machine of the plan, as exchange_parity's: the
// identity, 0..machines-1.
std::vector<int> machines_as_ranks(int machines);

}  // namespace trireme::ft
