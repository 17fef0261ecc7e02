// The flags of `trireme train gpt`, read once into a struct. Shared by the command that
// validates and launches (train_gpt.cpp) and by each launched rank (train_worker.cpp),
// which parse the same argument list.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "trireme/cli/flags.h"
#include "trireme/models/gpt_config.h"
#include "trireme/plan/plan.h"

namespace trireme::cli {

struct TrainOptions {
  models::GptConfig model;
  int64_t steps = 200;
  int64_t batch = 16;        // global batch in sequences
  int64_t micro_batches = 1; // micro-batches per rank: accumulation (pp 1) or pipeline m
  double lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup = -1;       // -1: a tenth of --steps
  double weight_decay = 0.1;
  double clip = 1.0;
  int64_t seed = 1234;
  std::string data;          // empty: the bundled corpus
  std::string out = "runs/gpt";
  int dp = 0;                // 0: every rank data-parallel
  std::string replica_batches;  // "12,4": sequences of each data-parallel replica; "": even
  std::vector<int64_t> replica_batch_sizes;  // parsed from it by validate_train_options
  int tp = 1;
  int pp = 1;
  std::string mesh_order = "tp-dp-pp";
  std::string schedule;      // pipeline schedule; empty: 1f1b when --pp > 1
  int chunks = 1;            // model chunks per pipeline stage (interleaved)
  std::string pp_split;      // explicit layer ranges per virtual stage, "0:3,3:6"
  std::string pp_balance = "time";  // partition by measured layer time or by "params"
  int zero = 0;              // ZeRO stage on the dp axis: 0 off, 1, 2
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  int64_t trace_steps = 3;   // steps recorded in trace.json (after the first)
  int64_t sample_tokens = 200;
  int64_t log_every = 10;    // non-terminal progress: a line every N steps
  std::string dump_params;   // write the final parameters to this file (rank 0)
  int64_t checkpoint_every = 0;  // write a checkpoint every N steps (0: never)
  std::string checkpoint_dir;    // empty: OUT/checkpoints
  int64_t keep_checkpoints = 3;  // the newest N are kept
  bool resume = false;           // continue from the newest good checkpoint, if any
  int64_t snapshot_every = -1;   // in-memory snapshot every N steps; -1: 1 when restarts are allowed
  double snapshot_overhead = 0.03;  // double the interval while snapshots stall more than this
  int64_t snapshot_share = -1;  // 1: a data-parallel group shares each snapshot; -1: when it can
  std::string device = "cpu";  // cpu (Gloo) or cuda (NCCL, one GPU per local rank)
  std::string plan;            // a plan from `trireme plan`: sets the layout, batch and model
  std::string emulate_slowdown;  // "RANK:FACTOR,...": compute of those ranks slowed (emulation)
  double predicted_step_s = 0;   // from --plan: printed next to the measured step time
  bool quiet = false;
  // The flags given on the command line (FlagParser::record_given): a flag given at its
  // default value counts, where a --plan sets it or where it would be ignored.
  std::set<std::string> given;
};

// The slice of the global batch that data-parallel replica `replica` takes each step:
// --batch / dp sequences each, or under --replica-batches its own count (a replica on a
// slower device takes fewer). Its micro-batches are count / micro_batches sequences.
struct ReplicaShare {
  int64_t begin = 0, count = 0;
  // dp * count / batch: the replica's mean loss is weighted by it before backward, so
  // that DataParallel's average of the replicas' gradients is the global batch's mean
  // (exactly 1 when the shares are even).
  double loss_weight = 1;
};
ReplicaShare replica_share(const TrainOptions& options, int replica);

// Registers the model-shape flags --layers --dim --heads --seq (shared by train, profile
// and plan).
void add_model_flags(FlagParser& parser, models::GptConfig* model);

// Registers every training flag on `parser`, bound to `options`.
void add_train_flags(FlagParser& parser, TrainOptions* options);

// The layout, global batch and model shape of a plan (and its emulated slowdowns unless
// --emulate-slowdown is given); `origin` names the plan in errors. A layout or model flag
// given (options->given, or set apart from its default) with another value than the
// plan's is refused.
void apply_plan(const plan::Plan& plan, const std::string& origin, TrainOptions* options);

// Parses and checks --replica-batches against --batch, --dp and --micro-batches, filling
// replica_batch_sizes (empty when not given). Throws InvalidArgument naming the flag.
// `batch_flag` names the global batch in the messages (trireme plan's is --global-batch).
void validate_replica_batches(TrainOptions* options, const char* batch_flag = "--batch");

// An elastic job's generation of `world_size` ranks: per-replica batch sizes belong to the
// devices they were chosen for, so when they name another number of replicas than the
// generation has, they give way to an even split of --batch. Returns whether they did.
bool drop_replica_batches_for(TrainOptions* options, int world_size);

// Checks everything that can be checked before starting processes, given the world size
// the launch will produce. Throws InvalidArgument with one line naming the flag.
void validate_train_options(TrainOptions* options, int world_size);

}  // namespace trireme::cli
