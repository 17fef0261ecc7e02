#include "trireme/cli/train_options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/dist/mesh.h"
#include "trireme/optim/lr_schedule.h"
#include "trireme/parallel/pipeline/partition.h"
#include "trireme/parallel/pipeline/schedule.h"
#include "trireme/plan/plan.h"

namespace trireme::cli {

void add_model_flags(FlagParser& p, models::GptConfig* model) {
  p.add("layers", &model->layers, "transformer blocks");
  p.add("dim", &model->dim, "model width");
  p.add("heads", &model->heads, "attention heads (must divide --dim)");
  p.add("seq", &model->seq_len, "sequence length in tokens");
}

void add_train_flags(FlagParser& p, TrainOptions* o) {
  p.record_given(&o->given);
  add_model_flags(p, &o->model);
  p.add("steps", &o->steps, "optimizer steps");
  p.add("batch", &o->batch, "global batch in sequences, split across data-parallel ranks");
  p.add("micro-batches", &o->micro_batches,
        "micro-batches per rank: gradient accumulation, or the pipeline's m with --pp");
  p.add("lr", &o->lr, "peak learning rate (AdamW)");
  p.add("min-lr", &o->min_lr, "final learning rate of the cosine decay");
  p.add("warmup", &o->warmup, "linear warm-up steps (-1: a tenth of --steps)");
  p.add("weight-decay", &o->weight_decay, "AdamW weight decay");
  p.add("clip", &o->clip, "clip gradients to this global L2 norm (0: off)");
  p.add("seed", &o->seed, "seed of the model initialisation and data order");
  p.add("dropout", &o->model.dropout, "dropout probability on attention and residual branches (0: off)");
  p.add("data", &o->data, "UTF-8 text file to train on (default: the bundled KJV corpus)");
  p.add("out", &o->out, "run directory for metrics.jsonl and trace.json");
  p.add("dp", &o->dp, "data-parallel size (default: all ranks)");
  p.add("replica-batches", &o->replica_batches,
        "sequences of each data-parallel replica, e.g. 12,4 (summing to --batch): fewer on slower devices");
  p.add("tp", &o->tp, "tensor-parallel size");
  p.add("pp", &o->pp, "pipeline-parallel size");
  p.add("mesh-order", &o->mesh_order, "rank order of the mesh axes, innermost first");
  p.add("schedule", &o->schedule, "pipeline schedule: gpipe, 1f1b (default), interleaved, zb-h1");
  p.add("chunks", &o->chunks, "model chunks per pipeline stage (--schedule interleaved)");
  p.add("pp-split", &o->pp_split,
        "layers of each virtual stage, e.g. 0:3,3:6 (layers: embeddings, blocks, head)");
  p.add("pp-balance", &o->pp_balance,
        "balance pipeline stages by measured layer 'time' (default) or 'params'");
  p.add("zero", &o->zero,
        "ZeRO stage over the data-parallel group: 0 off, 1 optimizer state sharded, 2 gradients too");
  p.add("bucket-mb", &o->bucket_mb, "gradient bucket size in MiB");
  p.add("first-bucket-mb", &o->first_bucket_mb, "size of the first gradient bucket in MiB");
  p.add("trace-steps", &o->trace_steps, "steps recorded in trace.json");
  p.add("sample-tokens", &o->sample_tokens, "bytes of text generated at the end");
  p.add("log-every", &o->log_every, "progress line every N steps when not on a terminal");
  p.add("dump-params", &o->dump_params, "write the final parameters to this file");
  p.add("checkpoint-every", &o->checkpoint_every, "write a checkpoint every N steps (0: never)");
  p.add("checkpoint-dir", &o->checkpoint_dir, "where checkpoints go (default: OUT/checkpoints)");
  p.add("keep-checkpoints", &o->keep_checkpoints, "how many of the newest checkpoints to keep");
  p.add_switch("resume", &o->resume,
               "continue from the newest checkpoint that verifies (any layout), if there is one");
  p.add("snapshot-every", &o->snapshot_every,
        "in-memory snapshot every N steps (default: every step when --max-restarts > 0; 0: off)");
  p.add("snapshot-overhead", &o->snapshot_overhead,
        "target stall of snapshots as a fraction of step time; above it the interval doubles (0: fixed)");
  p.add("snapshot-share", &o->snapshot_share,
        "1: the replicas of a data-parallel group share each snapshot, each copying 1/dp of the state (default "
        "with dp > 1, without ZeRO, in a job of fixed size); 0: every rank snapshots all of its state");
  p.add("device", &o->device, "cpu (Gloo) or cuda (NCCL, GPU = local rank)");
  p.add("plan", &o->plan,
        "run a plan written by trireme plan: its layout, global batch and model shape (and its emulated slow ranks)");
  p.add("emulate-slowdown", &o->emulate_slowdown,
        "RANK:FACTOR,...: slow those ranks' compute by FACTOR (emulates slower devices on this machine)");
  p.add_switch("quiet", &o->quiet, "no progress line and no sample");
}

namespace {

// --schedule, --chunks, --pp-split and --pp-balance against --pp and the model.
void validate_pipeline_options(TrainOptions* o) {
  TRIREME_CHECK(o->pp_balance == "time" || o->pp_balance == "params", "--pp-balance ",
                o->pp_balance, " is not known; use time or params");
  // (--plan sets --pp-split: the plan's own balance.)
  TRIREME_CHECK(!o->given.count("pp-balance") || (o->pp > 1 && o->pp_split.empty()), "--pp-balance applies only "
                "to a pipeline split by measurement: ", o->pp == 1 ? "there is no pipeline (pp 1)"
                : !o->plan.empty() ? "--plan " + o->plan + " gives the split" : "--pp-split gives the split",
                "; drop --pp-balance");
  if (o->pp == 1) {
    TRIREME_CHECK(o->schedule.empty(), "--schedule ", o->schedule,
                  " needs a pipeline: add --pp 2 or more (or drop --schedule)");
    TRIREME_CHECK(o->chunks == 1, "--chunks ", o->chunks,
                  " needs a pipeline: add --pp 2 or more with --schedule interleaved");
    TRIREME_CHECK(o->pp_split.empty(), "--pp-split needs a pipeline: add --pp 2 or more");
    return;
  }
  if (o->schedule.empty()) o->schedule = "1f1b";
  const pipeline::ScheduleSpec spec{pipeline::parse_schedule(o->schedule), o->pp,
                                    static_cast<int>(o->micro_batches), o->chunks};
  pipeline::validate(spec);
  const int64_t layers = o->model.layers + 2;  // embeddings, the blocks, the head
  const int64_t parts = static_cast<int64_t>(o->pp) * o->chunks;
  TRIREME_CHECK(parts <= layers, "--pp ", o->pp, (o->chunks > 1 ? " x --chunks " + std::to_string(o->chunks) : ""),
                " = ", parts, " pipeline parts but the model has only ", layers,
                " layers (embeddings, ", o->model.layers, " blocks, head); use fewer stages or more --layers");
  if (!o->pp_split.empty()) pipeline::parse_split(o->pp_split, static_cast<int>(layers), static_cast<int>(parts));
}

}  // namespace

bool drop_replica_batches_for(TrainOptions* o, int world_size) {
  const int64_t dp = world_size / std::max<int64_t>(1, int64_t{o->tp} * o->pp);
  if (o->replica_batches.empty() ||
      std::count(o->replica_batches.begin(), o->replica_batches.end(), ',') + 1 == dp)
    return false;
  o->replica_batches.clear();
  return true;
}

void validate_replica_batches(TrainOptions* o, const char* batch_flag) {
  o->replica_batch_sizes.clear();
  if (o->replica_batches.empty()) {
    TRIREME_CHECK(o->batch % o->dp == 0, batch_flag, " ", o->batch, " is not divisible by ", o->dp,
                  " data-parallel ranks; choose a multiple of ", o->dp, " (or give --replica-batches)");
    return;
  }
  // Every item between commas counts, so "6,2," is refused rather than read as 2 replicas
  // (drop_replica_batches_for counts its commas: 3).
  for (size_t begin = 0;;) {
    const size_t comma = o->replica_batches.find(',', begin);
    const std::string item = o->replica_batches.substr(begin, comma - begin);
    TRIREME_CHECK(!item.empty(), "--replica-batches ", o->replica_batches,
                  " has an empty item (a stray comma); give one count per replica, e.g. 12,4");
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    TRIREME_CHECK(std::isdigit(static_cast<unsigned char>(item[0])) && *end == '\0' && value >= 1,
                  "--replica-batches ", o->replica_batches, ": '", item,
                  "' is not a positive number of sequences; write e.g. 12,4");
    // (Each at most the batch: their sum is then at most dp x batch, far inside 64 bits.)
    TRIREME_CHECK(errno != ERANGE && value <= o->batch, "--replica-batches ", o->replica_batches, ": ", item,
                  " sequences are more than ", batch_flag, " ", o->batch, "; give each replica a share of the batch");
    o->replica_batch_sizes.push_back(value);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  TRIREME_CHECK(static_cast<int>(o->replica_batch_sizes.size()) == o->dp, "--replica-batches ",
                o->replica_batches, " gives ", o->replica_batch_sizes.size(), " replicas but --dp is ", o->dp,
                "; give one count per data-parallel replica");
  int64_t sum = 0;
  for (int64_t b : o->replica_batch_sizes) {
    sum += b;
    TRIREME_CHECK(b % o->micro_batches == 0, "--replica-batches ", o->replica_batches, ": ", b,
                  " sequences are not divisible by --micro-batches ", o->micro_batches,
                  "; give every replica a multiple of ", o->micro_batches);
  }
  TRIREME_CHECK(sum == o->batch, "--replica-batches ", o->replica_batches, " sum to ", sum, " but ", batch_flag,
                " is ", o->batch, "; make them add up to the global batch");
}

ReplicaShare replica_share(const TrainOptions& o, int replica) {
  ReplicaShare share;
  if (o.replica_batch_sizes.empty()) {
    share.count = o.batch / o.dp;
    share.begin = replica * share.count;
    return share;
  }
  for (int r = 0; r < replica; ++r) share.begin += o.replica_batch_sizes[r];
  share.count = o.replica_batch_sizes[replica];
  share.loss_weight = static_cast<double>(o.dp) * share.count / static_cast<double>(o.batch);
  return share;
}

namespace {

// A layout or model flag given on the command line that the plan sets otherwise would be
// silently replaced: refused instead. A flag given with the plan's value is fine (so is
// applying a plan twice). A flag counts as given when the parser saw it, at its default
// value too, or when it is set apart from its default (options built in code).
template <class T>
void check_plan_keeps(const TrainOptions& o, const char* flag, const T& given, const T& default_value,
                      const T& planned, const std::string& origin) {
  if ((!o.given.count(flag) && given == default_value) || given == planned) return;
  std::ostringstream text;
  text << "--" << flag << " " << given << " contradicts the plan " << origin << ", which sets " << planned
       << "; drop --" << flag << " (the plan fixes the layout, batch and model) or plan again";
  throw InvalidArgument(text.str());
}

}  // namespace

void apply_plan(const plan::Plan& p, const std::string& origin, TrainOptions* o) {
  TRIREME_CHECK(p.model.vocab >= 256, origin, ": the model's vocabulary is ", p.model.vocab,
                " but training reads bytes (256 symbols); plan a model with vocab 256 or more");
  std::string planned_replicas;
  for (int b : p.replica_micro_batch_sizes)
    planned_replicas += (planned_replicas.empty() ? "" : ",") + std::to_string(int64_t{b} * p.micro_batches);
  const TrainOptions d;
  check_plan_keeps<int64_t>(*o, "seq", o->model.seq_len, d.model.seq_len, p.model.seq_len, origin);
  check_plan_keeps<int64_t>(*o, "layers", o->model.layers, d.model.layers, p.model.layers, origin);
  check_plan_keeps<int64_t>(*o, "dim", o->model.dim, d.model.dim, p.model.dim, origin);
  check_plan_keeps<int64_t>(*o, "heads", o->model.heads, d.model.heads, p.model.heads, origin);
  check_plan_keeps<int64_t>(*o, "batch", o->batch, d.batch, p.global_batch, origin);
  check_plan_keeps<int64_t>(*o, "micro-batches", o->micro_batches, d.micro_batches, p.micro_batches, origin);
  check_plan_keeps<int>(*o, "dp", o->dp, d.dp, p.dp, origin);
  check_plan_keeps<int>(*o, "tp", o->tp, d.tp, p.tp, origin);
  check_plan_keeps<int>(*o, "pp", o->pp, d.pp, p.pp, origin);
  check_plan_keeps<int>(*o, "chunks", o->chunks, d.chunks, p.chunks, origin);
  check_plan_keeps<int>(*o, "zero", o->zero, d.zero, p.zero, origin);
  check_plan_keeps<std::string>(*o, "schedule", o->schedule, d.schedule, p.schedule, origin);
  check_plan_keeps<std::string>(*o, "pp-split", o->pp_split, d.pp_split, p.pp_split, origin);
  check_plan_keeps<std::string>(*o, "mesh-order", o->mesh_order, d.mesh_order, "tp-dp-pp", origin);
  check_plan_keeps<std::string>(*o, "replica-batches", o->replica_batches, d.replica_batches, planned_replicas, origin);
  o->model.vocab = p.model.vocab;
  o->model.seq_len = p.model.seq_len;
  o->model.layers = p.model.layers;
  o->model.dim = p.model.dim;
  o->model.heads = p.model.heads;
  o->model.mlp_ratio = p.model.mlp_ratio;
  o->batch = p.global_batch;
  o->dp = p.dp;
  o->tp = p.tp;
  o->pp = p.pp;
  o->schedule = p.schedule;
  o->chunks = p.chunks;
  o->micro_batches = p.micro_batches;
  o->zero = p.zero;
  o->pp_split = p.pp_split;
  o->replica_batches = planned_replicas;
  o->mesh_order = "tp-dp-pp";  // the plan's rank numbering
  if (o->emulate_slowdown.empty()) o->emulate_slowdown = plan::slowdown_flag(p);
  o->predicted_step_s = p.predicted_step_s;
}

void validate_train_options(TrainOptions* o, int world_size) {
  // --plan: the plan's layout replaces the layout flags (idempotent: every rank applies it).
  if (!o->plan.empty()) {
    const plan::Plan p = plan::read_plan(o->plan);
    apply_plan(p, o->plan, o);
    // (Before the layout's checks, which would name --dp and --pp the plan set.)
    TRIREME_CHECK(p.world() == world_size, "the plan ", o->plan, " runs on ", p.world(), " ranks but the job has ",
                  world_size, " processes; give --nproc-per-node ", p.world(),
                  " (with --nnodes K: --nproc-per-node x K = ", p.world(), ")");
  }
  o->model.validate();
  TRIREME_CHECK(o->device == "cpu" || o->device == "cuda", "--device ", o->device,
                " is not known; use cpu or cuda");
  TRIREME_CHECK(o->steps >= 1, "--steps must be at least 1, got ", o->steps);
  TRIREME_CHECK(o->batch >= 1 && o->batch <= (1 << 20), "--batch must be in [1, 1048576] sequences, got ", o->batch);
  TRIREME_CHECK(o->micro_batches >= 1 && o->micro_batches <= (1 << 20),
                "--micro-batches must be in [1, 1048576], got ", o->micro_batches);
  TRIREME_CHECK(o->tp >= 1 && o->pp >= 1, "--tp and --pp must be at least 1");
  // Products in 64 bits: --tp 4 --pp 1073741824 is 0 in an int (and dividing by it, SIGFPE).
  const int64_t tp_pp = int64_t{o->tp} * o->pp;
  TRIREME_CHECK(tp_pp <= world_size, "--tp ", o->tp, " x --pp ", o->pp, " = ", tp_pp,
                " ranks per data-parallel replica, but the job has ", world_size,
                " processes; make dp*tp*pp equal --nproc-per-node x --nnodes");
  // The executor posts receives ahead of the sends of the steps before them (they match by
  // tag on Gloo); NCCL's point-to-point has no tags and runs a pair's operations in order
  // on one stream, so an early receive would wait for a send queued behind it.
  TRIREME_CHECK(o->pp == 1 || o->device != "cuda", "--pp ", o->pp,
                " with --device cuda is not supported yet (the pipeline's early receives would deadlock on "
                "NCCL); run pipelines with --device cpu, or use --tp and --dp on GPUs");
  TRIREME_CHECK(o->model.heads % o->tp == 0, "--heads ", o->model.heads, " is not divisible by --tp ",
                o->tp, "; choose --tp dividing the number of heads");
  // (trireme train has no --vocab: the vocabulary is the byte-level 256, or the plan's.)
  TRIREME_CHECK(o->model.vocab % o->tp == 0, "the vocabulary of ", o->model.vocab, " tokens (",
                o->plan.empty() ? "byte-level" : "from --plan " + o->plan, ") is not divisible by --tp ", o->tp,
                "; choose --tp dividing ", o->model.vocab);
  if (o->dp == 0) o->dp = static_cast<int>(world_size / tp_pp);
  TRIREME_CHECK(o->dp >= 1 && o->dp * tp_pp == world_size, "--dp ", o->dp, " x --tp ", o->tp, " x --pp ", o->pp,
                " = ", o->dp * tp_pp, " but the job has ", world_size,
                " processes; make dp*tp*pp equal --nproc-per-node x --nnodes");
  plan::check_slowdown(o->emulate_slowdown, world_size);
  validate_replica_batches(o);
  if (o->replica_batch_sizes.empty()) {
    const int64_t local = o->batch / o->dp;
    TRIREME_CHECK(local % o->micro_batches == 0, "each rank's share of --batch (", local,
                  " sequences) is not divisible by --micro-batches ", o->micro_batches,
                  "; choose --micro-batches dividing ", local);
  }
  dist::Mesh::from_sizes(o->dp, o->tp, o->pp, o->mesh_order);  // throws naming a bad --mesh-order
  validate_pipeline_options(o);
  TRIREME_CHECK(o->zero >= 0 && o->zero <= 2, "--zero ", o->zero,
                " is not a ZeRO stage; use 1 (optimizer state sharded), 2 (gradients too) or 0 (off)");
  TRIREME_CHECK(o->zero == 0 || o->dp >= 2, "--zero ", o->zero,
                " shards over the data-parallel group, which has 1 rank here; use --dp 2 or more, or drop --zero");
  TRIREME_CHECK(o->bucket_mb > 0 && o->bucket_mb <= 1 << 20, "--bucket-mb must be in (0, 1048576] MiB, got ",
                o->bucket_mb);
  TRIREME_CHECK(o->first_bucket_mb > 0 && o->first_bucket_mb <= 1 << 20,
                "--first-bucket-mb must be in (0, 1048576] MiB, got ", o->first_bucket_mb);
  TRIREME_CHECK(o->trace_steps >= 0, "--trace-steps must be >= 0 (0: no trace), got ", o->trace_steps);
  TRIREME_CHECK(o->sample_tokens >= 0, "--sample-tokens must be >= 0 (0: no sample), got ", o->sample_tokens);
  TRIREME_CHECK(o->log_every >= 1, "--log-every must be at least 1 (a progress line every N steps), got ",
                o->log_every);
  o->trace_steps = std::min(o->trace_steps, o->steps);  // (all of them: a larger count overflowed)
  TRIREME_CHECK(o->warmup >= -1, "--warmup must be >= 0 steps (or -1: a tenth of --steps), got ", o->warmup);
  if (o->warmup < 0) o->warmup = o->steps / 10;
  optim::LrSchedule{o->lr, o->min_lr, o->warmup, o->steps}.validate();
  TRIREME_CHECK(o->weight_decay >= 0, "--weight-decay must be >= 0");
  TRIREME_CHECK(o->clip >= 0, "--clip must be >= 0 (0 turns clipping off)");
  TRIREME_CHECK(o->checkpoint_every >= 0, "--checkpoint-every must be >= 0 (0: no checkpoints), got ",
                o->checkpoint_every);
  TRIREME_CHECK(o->keep_checkpoints >= 1 && o->keep_checkpoints <= (1 << 20),
                "--keep-checkpoints must be in [1, 1048576], got ", o->keep_checkpoints);
  TRIREME_CHECK(!o->given.count("keep-checkpoints") || o->checkpoint_every > 0, "--keep-checkpoints applies only "
                "with --checkpoint-every N (no checkpoints are written without it); add --checkpoint-every or drop "
                "--keep-checkpoints");
  TRIREME_CHECK(o->snapshot_every >= -1, "--snapshot-every must be >= 0 (0: no snapshots), got ",
                o->snapshot_every);
  TRIREME_CHECK(o->snapshot_share >= -1 && o->snapshot_share <= 1,
                "--snapshot-share must be 0 or 1 (1: data-parallel replicas share snapshots), got ", o->snapshot_share);
  TRIREME_CHECK(o->snapshot_share != 1 || (o->dp > 1 && o->zero == 0), "--snapshot-share 1 shares snapshots ",
                o->zero > 0 ? "between the replicas of a data-parallel group, whose optimizer state --zero "
                              "already splits; drop --snapshot-share or --zero"
                            : "between data-parallel replicas, but dp is 1; drop --snapshot-share",
                "");
  TRIREME_CHECK(o->snapshot_overhead >= 0 && o->snapshot_overhead < 1,
                "--snapshot-overhead must be in [0, 1) (a fraction of step time; 0 keeps the interval fixed)");
  if (o->checkpoint_dir.empty()) o->checkpoint_dir = o->out + "/checkpoints";
}

}  // namespace trireme::cli
