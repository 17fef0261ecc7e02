// Pipeline schedules as data: for a schedule, p stages, m micro-batches and v model chunks
// per stage, the list of instructions each stage executes, grouped into steps.
//
// Terms:
//   stage          a pipeline rank, 0..p-1 (its coordinate on the mesh's pp axis)
//   chunk          one of the v contiguous model parts a stage holds (v > 1 only for the
//                  interleaved schedule); virtual stage = chunk * p + stage, 0..p*v-1, and
//                  activations flow virtual stage 0 -> 1 -> ... -> p*v-1
//   F / B / W      forward; backward for the input gradient; backward for the weight
//                  gradient. Schedules that do not split backward emit B with
//                  `with_weights` set: one full backward, no W
//   step           a time slot. Within a step a stage first sends what it produced in the
//                  previous step (non-blocking), then receives what its neighbours produced
//                  in the previous step, then runs at most one F, B or W.
//
// Contract: every receive in step k is matched by a send of the neighbour in the same step
// k, in the same order on each (source, destination) pair, and sends never block. Hence a
// barrier may be placed between any two steps without deadlock; tests/unit/test_schedule.cpp
// checks it by simulating all stages together.
//
// Schedules (step counts when F, B and W each take one step):
//   gpipe        all forwards, then all backwards                  2(m+p-1) steps
//   1f1b         p-s-1 warm-up forwards, then one forward one backward, then cool-down;
//                at most p-s micro-batches live on stage s         2(m+p-1) steps
//   interleaved  1F1B over v chunks per stage (Megatron); m must be a multiple of p;
//                the bubble shrinks by v                           2(mv+p-1) steps
//   zb-h1        1F1B with backward split into B and W; stage s defers up to s W's to fill
//                the cool-down bubble (zero-bubble paper's ZB-H1); peak live activations
//                equal 1F1B's                                      3m+p-1 steps (m >= p)
// Pure: no libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace trireme::pipeline {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZbH1 };

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;         // p
  int micro_batches = 1;  // m
  int chunks = 1;         // v (interleaved only)
};

// "gpipe" | "1f1b" | "interleaved" | "zb-h1"; throws InvalidArgument listing the names.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind kind);
// The most compute instructions a schedule may have, counted as 3 per micro-batch, chunk
// and stage (F, B, W): p*m*v*3 <= 10^6. It keeps build_schedule's memory and time small
// (a few hundred MB at the bound) and m*v far from int overflow; real pipelines have
// p*v <= layers and m in the hundreds, far below it.
constexpr int64_t kMaxScheduleOperations = 1'000'000;

// Throws InvalidArgument with one line naming the flag: p, m, v < 1; chunks > 1 for a
// schedule other than interleaved; m not a multiple of p for interleaved; p*m*v*3 above
// kMaxScheduleOperations.
void validate(const ScheduleSpec& spec);

// Instructions. `micro` is the micro-batch, `chunk` the model chunk on this stage.
struct LoadMicroBatch { int micro; };                      // inputs (first virtual stage) or targets (last)
struct Forward { int micro; int chunk; };
struct BackwardInput { int micro; int chunk; bool with_weights; };
struct BackwardWeight { int micro; int chunk; };
struct SendActivation { int micro; int chunk; int to_stage; };  // chunk: the sender's
struct RecvActivation { int micro; int chunk; int from_stage; };  // chunk: the receiver's
struct SendGradient { int micro; int chunk; int to_stage; };
struct RecvGradient { int micro; int chunk; int from_stage; };
struct ReduceGradients {};  // data-parallel all-reduce of this stage's gradients
struct OptimizerStep {};

using Instruction = std::variant<LoadMicroBatch, Forward, BackwardInput, BackwardWeight,
                                 SendActivation, RecvActivation, SendGradient, RecvGradient,
                                 ReduceGradients, OptimizerStep>;
using Step = std::vector<Instruction>;

// One line per instruction, e.g. "F m3 c0", "send-act m3 c0 -> 1".
std::string to_string(const Instruction& instruction);
// "F3" (forward of micro-batch 3), "B3" (full backward), "b3" (input-gradient backward),
// "W3" (weight-gradient backward), with ".c" for chunk c when chunks > 1; "" for others.
std::string compact_name(const Instruction& instruction, int chunks);
// F, B or W.
bool is_compute(const Instruction& instruction);
// A send or receive of an activation or gradient.
bool is_communication(const Instruction& instruction);
// The micro-batch and chunk an instruction is about; {-1, -1} for those about none.
std::pair<int, int> micro_and_chunk(const Instruction& instruction);

// The order in which a stage runs its F/B/W instructions (no communication).
std::vector<Instruction> compute_order(const ScheduleSpec& spec, int stage);

// Every stage's steps (index = stage); all stages have the same number of steps.
std::vector<std::vector<Step>> build_schedule(const ScheduleSpec& spec);

// Closed-form step count for unit-time F, B and W (see the table above).
int expected_steps(const ScheduleSpec& spec);

}  // namespace trireme::pipeline
