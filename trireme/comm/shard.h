// Sharding a bucket across the ranks of a data-parallel group (ZeRO), and the ring that
// reduce-scatters it. Pure arithmetic: no libtorch.
//
// Terms:
//   bucket      the gradients of some parameters, concatenated (comm/bucket.h): numel
//               elements, parameter k at element offset o_k
//   chunk       the bucket is cut into d equal chunks of L = ceil(numel / d) elements (the
//               last one padded with zeros); rank r owns chunk r: its optimizer state, its
//               reduced gradient and the update of those parameter elements
//   piece       the part of one parameter that lies in one chunk; a parameter may straddle
//               chunks, so it may have pieces on several ranks
//   stride      in the buffer that travels, each chunk may carry extra elements after its L
//               (DataParallel puts one "had a gradient" flag per parameter there, so that
//               every owner learns them from the same reduce-scatter): chunk c starts at
//               element c * stride
//
// Ring reduce-scatter over d ranks (each holds d chunks; afterwards rank r holds the sum
// over ranks of chunk r). In step s = 0 .. d-2, rank r sends its chunk (r - s - 1) mod d
// to rank r + 1 and receives chunk (r - s - 2) mod d from rank r - 1, adding it into its
// own copy; what it sends in step s is what it received and added in step s - 1. After
// d - 1 steps the last chunk received, (r - d) mod d = r, has every rank's contribution.
// Each rank sends and receives (d - 1) chunks: (d - 1)/d of the buffer, the volume of
// NCCL's reduce-scatter and half that of an all-reduce.
//
// Worked example, d = 3, rank 0: step 0 sends chunk 2 to rank 1 and receives chunk 1 from
// rank 2; step 1 sends chunk 1 (now the sum of ranks 0 and 2) and receives chunk 0 (the
// sum of ranks 1 and 2), which it adds to its own: chunk 0 holds all three.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trireme::comm {

// L: elements per chunk when `numel` elements are cut into `ranks` chunks.
int64_t chunk_length(int64_t numel, int ranks);

// A run of elements [offset, offset + length) of a tensor that lies in chunk `chunk`,
// starting at element `chunk_offset` of that chunk.
struct Segment {
  int64_t offset = 0;  // in the tensor
  int chunk = 0;
  int64_t chunk_offset = 0;
  int64_t length = 0;
};

// Cuts a tensor of `numel` elements that starts at element `begin` of the bucket into its
// runs per chunk (chunks of `chunk` elements). Zero-length tensors give no segments.
std::vector<Segment> split_by_chunks(int64_t begin, int64_t numel, int64_t chunk);

// A parameter's piece owned by one rank.
struct ShardPiece {
  size_t param = 0;          // index into the bucket's parameter list
  int64_t param_offset = 0;  // first element of the piece in the flattened parameter
  int64_t chunk_offset = 0;  // where the piece sits in the owner's chunk
  int64_t length = 0;
};

// The pieces of a bucket (parameters of `numels` elements, in bucket order) that `rank`
// of `ranks` owns, in chunk order.
std::vector<ShardPiece> owned_pieces(const std::vector<int64_t>& numels, int ranks, int rank);

// One step of the ring reduce-scatter for `rank`: send chunk `send_chunk` to `to`, receive
// chunk `recv_chunk` from `from` and add it in.
struct RingStep {
  int send_chunk = 0, recv_chunk = 0, to = 0, from = 0;
};
std::vector<RingStep> ring_reduce_scatter_steps(int ranks, int rank);

}  // namespace trireme::comm
