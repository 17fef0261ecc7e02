// A machine's protected snapshot copies as one byte string: what ft/parity_exchange.h
// codes across machines (issue 6), and what a rebuild turns back into files.
//
// The copies are one-rank snapshots (ft/snapshot.h) under ROOT/<top>/ (a top directory
// per local rank). The blob lists their files, each with its relative path and bytes, in
// the order given (a snapshot's manifest after its data, so a rebuild cut short never
// leaves a manifest over missing data).
//
// Replicas are left out. Under data parallelism every replica's snapshot holds the same
// parameters and optimizer state, bit for bit, so a slice that every machine of a
// redundancy group holds survives any loss that the group's parity does, and coding it
// protects nothing. A slice is named by its key: tensor name, dtype, box, length and
// CRC-32 from its manifest. The slices whose keys are in `left_out` become holes in the
// blob (offset, length and key; no bytes), and the rebuild fills each hole from a slice
// with the same key in the rebuilder's own copy, then verifies every CRC. Two different
// slices that share a key would need two replicas that disagree (which data parallelism
// does not produce) and a CRC-32 collision between them.
//
// Format (native byte order: the machines of a job share one):
//   "TRIREME-PROTECTED 2\n", u32 file count, then per file:
//     u32 path bytes, path, u64 file bytes, u32 hole count,
//     per hole: u64 offset, u64 bytes, u32 key bytes, key;
//     then the file's bytes outside its holes, in order
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "trireme/ft/checkpoint.h"

namespace trireme::ft {

// "NAME|DTYPE|BOX|BYTES|CRC".
std::string slice_key(const Checkpoint::SliceRecord& slice);

// The keys of every slice of the snapshots under ROOT/<top>/ for the top directories of
// `paths` (from their manifests; no data read). Throws CheckpointCorrupt when a manifest
// does not open or lists overlapping slices.
std::set<std::string> slice_keys(const std::string& root, const std::vector<std::string>& paths);

// The blob of the files `paths` under `root`, each slice whose key is in `left_out` a hole.
// *hole_bytes (when given) is set to the bytes the holes stand for.
std::vector<uint8_t> serialize_blob(const std::string& root, const std::vector<std::string>& paths,
                                    const std::set<std::string>& left_out, uint64_t* hole_bytes = nullptr);

// Fills `bytes` bytes at `out` with the slice of key `key`; false when it has none.
using HoleFill = std::function<bool(const std::string& key, uint8_t* out, uint64_t bytes)>;

// A HoleFill that reads the slices of the snapshots under ROOT/<top>/ (tops as for
// slice_keys).
HoleFill fill_from(const std::string& root, const std::vector<std::string>& paths);

// Writes a blob's files under `root`, each top directory replaced whole, its holes filled
// by `fill`; returns the top directories in order. Throws CheckpointCorrupt when the blob
// is malformed or a hole cannot be filled.
std::vector<std::string> write_blob(const std::vector<uint8_t>& blob, const std::string& root, const HoleFill& fill);

}  // namespace trireme::ft
