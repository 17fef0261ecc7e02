// Exchanging and rebuilding erasure-coded snapshot blocks between machines; see
// parity_exchange.h.
#include "trireme/ft/parity_exchange.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>

#include "trireme/common/error.h"
#include "trireme/ft/erasure.h"

namespace trireme::ft {
namespace {

// Block p of a machine's snapshot, zero-padded to `block` bytes.
std::vector<uint8_t> block_of(const uint8_t* bytes, uint64_t size, uint64_t block, int p) {
  std::vector<uint8_t> out(block, 0);
  const uint64_t start = block * static_cast<uint64_t>(p);
  if (start < size) std::memcpy(out.data(), bytes + start, std::min(block, size - start));
  return out;
}

at::Tensor view(std::vector<uint8_t>& buffer) {
  return at::from_blob(buffer.data(), {static_cast<int64_t>(buffer.size())}, at::kByte);
}

// Posted point-to-point operations, awaited together.
struct Transfers {
  const dist::Group& group;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::vector<at::Tensor>> tensors;  // kept alive until waited
  void recv(std::vector<uint8_t>& buffer, int from, int tag) {
    tensors.push_back({view(buffer)});
    works.push_back(group->recv(tensors.back(), from, tag));
  }
  void send(std::vector<uint8_t>& buffer, int to, int tag) {
    tensors.push_back({view(buffer)});
    works.push_back(group->send(tensors.back(), to, tag));
  }
  void wait(const char* what) {
    for (auto& w : works) dist::wait_work(w, what);
  }
};

// Every machine's snapshot size (an all-gather over the agents).
std::vector<uint64_t> all_sizes(uint64_t size, const dist::Group& agents) {
  std::vector<at::Tensor> mine{at::full({1}, static_cast<int64_t>(size), at::kLong)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < agents->getSize(); ++r) all[0].push_back(at::empty({1}, at::kLong));
  dist::run_collective("snapshot sizes all-gather", [&] { return agents->allgather(all, mine); });
  std::vector<uint64_t> sizes;
  for (const at::Tensor& t : all[0]) sizes.push_back(static_cast<uint64_t>(t.item<int64_t>()));
  return sizes;
}

int tag_of(const RedundancyGroup& g, int codeword, int position) { return codeword * (g.k + g.m) + position; }

}  // namespace

ParityHeld exchange_parity(const RedundancyPlan& plan, int machine, const uint8_t* bytes, uint64_t size,
                           const dist::Group& agents) {
  const std::vector<uint64_t> sizes = all_sizes(size, agents);
  const RedundancyGroup& g = plan.group_of(machine);
  ParityHeld held;
  uint64_t largest = 0;
  for (int id : g.machines) {
    held.sizes[id] = sizes.at(static_cast<size_t>(id));
    largest = std::max(largest, held.sizes[id]);
  }
  held.block = Stripe::of(largest, g.k).block;
  if (g.m == 0 || held.block == 0) return held;

  Transfers transfers{agents, {}, {}};
  // The buffers the transfers read and write. If one fails, others may still be in flight
  // (Gloo's I/O threads write a receive as it arrives): the buffers are then leaked rather
  // than freed under them, once, on a path that ends the round.
  struct Buffers {
    std::map<int, std::vector<std::vector<uint8_t>>> incoming;
    std::vector<std::vector<uint8_t>> outgoing;
  };
  auto buffers = std::make_unique<Buffers>();
  // Codewords whose parity this machine keeps: receive their k data blocks.
  auto& incoming = buffers->incoming;
  std::map<int, std::vector<int>> kept_parity;  // codeword -> parity indices kept here
  for (const auto& [j, pos] : g.parity_kept_by(machine)) kept_parity[j].push_back(pos - g.k);
  auto& outgoing = buffers->outgoing;
  for (auto& [j, indices] : kept_parity) {  // (allocated before any transfer is posted)
    incoming[j].assign(static_cast<size_t>(g.k), std::vector<uint8_t>(held.block));
  }
  outgoing.reserve(static_cast<size_t>(g.size() * g.k));
  try {
    for (auto& [j, indices] : kept_parity) {
      auto& blocks = incoming[j];
      const std::vector<BlockRef> refs = g.codeword(j);
      for (int p = 0; p < g.k; ++p)
        transfers.recv(blocks[static_cast<size_t>(p)], refs[static_cast<size_t>(p)].machine, tag_of(g, j, p));
    }
    // This machine's data blocks, each cut once, to every parity keeper of its codeword.
    for (int j = 0; j < g.size(); ++j) {
      const std::vector<BlockRef> refs = g.codeword(j);
      for (int p = 0; p < g.k; ++p) {
        if (refs[static_cast<size_t>(p)].machine != machine) continue;
        outgoing.push_back(block_of(bytes, size, held.block, refs[static_cast<size_t>(p)].index));
        for (int r = 0; r < g.m; ++r)
          transfers.send(outgoing.back(), refs[static_cast<size_t>(g.k + r)].machine, tag_of(g, j, p));
      }
    }
    transfers.wait("parity exchange");
  } catch (...) {
    (void)buffers.release();  // see Buffers
    throw;
  }
  const ErasureCode code(g.k, g.m);
  for (auto& [j, indices] : kept_parity) {
    std::vector<const uint8_t*> data;
    for (auto& b : incoming[j]) data.push_back(b.data());
    for (int r : indices) {  // only the parity blocks kept here
      std::vector<uint8_t>& parity = held.parity[{j, r}];
      parity.resize(held.block);
      code.encode_one(data, r, parity.data(), held.block);
    }
  }
  return held;
}

std::map<int, std::vector<uint8_t>> rebuild_lost(const RedundancyPlan& plan, int machine,
                                                 const std::vector<int>& lost, const uint8_t* bytes,
                                                 const ParityHeld& held, const dist::Group& agents,
                                                 const std::vector<int>& rank_of_machine) {
  TRIREME_CHECK(plan.recoverable(lost), "the lost machines exceed the redundancy of their groups: their "
                                        "snapshots cannot be rebuilt from memory; resume from a disk checkpoint");
  std::map<int, std::vector<uint8_t>> rebuilt;
  const RedundancyGroup& g = plan.group_of(machine);
  const auto is_lost = [&](int id) { return std::find(lost.begin(), lost.end(), id) != lost.end(); };
  if (is_lost(machine)) return rebuilt;  // a lost machine has nothing to give
  // Every surviving machine of this group sends to or receives from the rebuilder.
  for (int id : g.machines) {
    if (is_lost(id)) continue;
    TRIREME_CHECK(id < static_cast<int>(rank_of_machine.size()) && rank_of_machine[static_cast<size_t>(id)] >= 0,
                  "surviving machine ", id, " has no rank in the rebuild's group");
  }
  TRIREME_ENFORCE_EQ(rank_of_machine[static_cast<size_t>(machine)], agents->getRank(), "(this machine's rank)");
  const auto rank = [&](int id) { return rank_of_machine[static_cast<size_t>(id)]; };
  std::vector<int> lost_here;
  for (int id : g.machines)
    if (is_lost(id)) lost_here.push_back(id);
  if (lost_here.empty() || held.block == 0) return rebuilt;
  int rebuilder = -1;
  for (int id : g.machines)
    if (!is_lost(id)) {
      rebuilder = id;
      break;
    }

  Transfers transfers{agents, {}, {}};
  struct Buffers {  // leaked, not freed, when a transfer fails (see exchange_parity)
    std::map<int, std::vector<std::vector<uint8_t>>> codewords;  // at the rebuilder: j -> its blocks
    std::vector<std::vector<uint8_t>> outgoing;
  };
  auto buffers = std::make_unique<Buffers>();
  auto& codewords = buffers->codewords;
  auto& outgoing = buffers->outgoing;
  outgoing.reserve(static_cast<size_t>(g.size() * (g.k + g.m)));
  try {
    for (int j = 0; j < g.size(); ++j) {
      const std::vector<BlockRef> refs = g.codeword(j);
      const bool affected =
          std::any_of(refs.begin(), refs.begin() + g.k, [&](const BlockRef& r) { return is_lost(r.machine); });
      if (!affected) continue;
      if (machine == rebuilder) codewords[j].assign(refs.size(), std::vector<uint8_t>(held.block));
      for (size_t pos = 0; pos < refs.size(); ++pos) {
        const BlockRef& ref = refs[pos];
        if (is_lost(ref.machine)) continue;
        if (ref.machine == machine) {
          std::vector<uint8_t> mine = ref.parity ? held.parity.at({j, ref.index})
                                                 : block_of(bytes, held.sizes.at(machine), held.block, ref.index);
          if (machine == rebuilder) {
            codewords[j][pos] = std::move(mine);
          } else {
            outgoing.push_back(std::move(mine));
            transfers.send(outgoing.back(), rank(rebuilder), tag_of(g, j, static_cast<int>(pos)));
          }
        } else if (machine == rebuilder) {
          transfers.recv(codewords[j][pos], rank(ref.machine), tag_of(g, j, static_cast<int>(pos)));
        }
      }
    }
    transfers.wait("snapshot rebuild");
  } catch (...) {
    (void)buffers.release();
    throw;
  }
  if (machine != rebuilder) return rebuilt;
  const ErasureCode code(g.k, g.m);
  for (int id : lost_here) rebuilt[id].assign(static_cast<size_t>(g.k) * held.block, 0);
  for (auto& [j, blocks] : codewords) {
    const std::vector<BlockRef> refs = g.codeword(j);
    std::vector<int> missing;
    for (size_t pos = 0; pos < refs.size(); ++pos)
      if (is_lost(refs[pos].machine)) missing.push_back(static_cast<int>(pos));
    std::vector<uint8_t*> pointers;
    for (auto& b : blocks) pointers.push_back(b.data());
    code.reconstruct(pointers, missing, held.block);
    for (int pos : missing) {
      const BlockRef& ref = refs[static_cast<size_t>(pos)];
      if (!ref.parity)
        std::memcpy(rebuilt[ref.machine].data() + static_cast<uint64_t>(ref.index) * held.block,
                    blocks[static_cast<size_t>(pos)].data(), held.block);
    }
  }
  for (int id : lost_here) rebuilt[id].resize(held.sizes.at(id));
  return rebuilt;
}

std::vector<int> machines_as_ranks(int machines) {
  std::vector<int> ranks(static_cast<size_t>(machines));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

}  // namespace trireme::ft
