// The per-rank body of `trireme train gpt`: build the mesh, this rank's engine (the whole
// model under DataParallel, or one pipeline stage: cli/train_engine.h), and train with
// AdamW, clipping and the warm-up/cosine schedule. Rank 0 writes DIR/metrics.jsonl, draws
// the progress line, merges DIR/trace.json, DIR/timeline.tsv and DIR/run.json (what
// `trireme report` reads), and prints a generated sample at the end when it holds the
// whole model.
#include <torch/optim/adamw.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "trireme/cli/commands.h"
#include "trireme/cli/train_engine.h"
#include "trireme/cli/train_options.h"
#include "trireme/common/error.h"
#include "trireme/data/batch.h"
#include "trireme/data/corpus.h"
#include "trireme/data/sampler.h"
#include "trireme/dist/world.h"
#include "trireme/ft/checksum.h"
#include "trireme/ft/resume.h"
#include "trireme/launch/standby.h"
#include "trireme/models/gpt.h"
#include "trireme/obs/clock.h"
#include "trireme/obs/memory.h"
#include "trireme/obs/metrics.h"
#include "trireme/obs/param_dump.h"
#include "trireme/obs/plot.h"
#include "trireme/obs/progress.h"
#include "trireme/obs/timeline.h"
#include "trireme/optim/clip.h"
#include "trireme/optim/lr_schedule.h"
#include "trireme/parallel/data/zero.h"

namespace trireme::cli {
namespace {

// A standby's warm-up, before it waits for activation: two steps of a tiny model of the
// same kind (one block, at most 4 heads of size 8, 16 tokens), forward, backward,
// clipping and AdamW, on the CPU. The first step after a restart then finds libtorch's code paged in and its
// kernels' one-off set-up done: 30-70 ms of a ~450-500 ms recovery here
// (docs/benchmarks.md). It keeps nothing: the model is dropped, and the default
// generator's state is put back. Not for CUDA runs: a standby must not open a CUDA
// context beside the worker it stands in for.
void warm_up_kernels(const TrainOptions& opt) {
  if (opt.device != "cpu") return;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor generator_state = generator.get_state();
  models::GptConfig tiny = opt.model;
  tiny.layers = 1;
  tiny.heads = std::min<int64_t>(tiny.heads, 4);  // (--dim 1024 --heads 1024 is valid: head size 1)
  tiny.dim = 8 * tiny.heads;
  tiny.seq_len = std::min<int64_t>(tiny.seq_len, 16);
  models::Gpt model(tiny, static_cast<uint64_t>(opt.seed));
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(opt.lr).weight_decay(opt.weight_decay));
  const at::Tensor tokens = at::arange(2 * tiny.seq_len, at::kLong).remainder(tiny.vocab).reshape({2, tiny.seq_len});
  for (int step = 0; step < 2; ++step) {
    model->loss(tokens, tokens).backward();
    optim::clip_grad_norm(model->parameters(), 1.0);
    adamw.step();
    adamw.zero_grad();
  }
  generator.set_state(generator_state);
}

// The element-wise largest and smallest of `values` across `group`: one MAX all-reduce of
// the values and their negations. Returned on the CPU.
std::pair<at::Tensor, at::Tensor> extremes_across(const dist::Group& group, const at::Tensor& values,
                                                  at::Device device, const char* what) {
  const int64_t n = values.numel();
  const at::Tensor both =
      dist::all_reduce(group, at::cat({values, -values}), c10d::ReduceOp::MAX, device, what).cpu();
  return {both.narrow(0, 0, n), -both.narrow(0, n, n)};
}

// The replicas of a data-parallel group end with the same parameters: they take the same
// averaged gradients and the same optimizer step (under ZeRO each updates its piece and
// gathers the others'). Checked once, after the last step, by one all-reduce of the
// parameters' CRCs (extremes_across): --dump-params, and with it every parity test, sees
// the first replica's copy only, so replicas that drift apart (a gradient left out of the average, a
// broken gather or restore) would go unseen. Replicas on identical hardware agree bit for
// bit; on different hardware (AVX2 beside AVX-512, two GPU models) each replica's own
// clipping norm and AdamW step may round differently in the last bits. So a difference is
// measured (a second all-reduce, of the differing parameters) and reported on stderr by
// each group's first replica, and the run fails only with TRIREME_REPLICA_CHECK=strict
// (which the test suite sets): then it throws Unrecoverable naming the parameters.
// Test seam: TRIREME_TEST_DRIFT_REPLICA=R changes one value of data-parallel replica R
// first, so the tests see the check report and fail.
void check_replicas_agree(TrainEngine& engine, const dist::MeshGroups& groups, at::Device device) {
  if (groups.size("dp") < 2) return;
  const std::vector<std::pair<std::string, at::Tensor>> named = engine.named_parameters();
  if (const char* drift = std::getenv("TRIREME_TEST_DRIFT_REPLICA"))
    if (std::atoi(drift) == groups.coord("dp") && !named.empty()) {
      const at::NoGradGuard no_grad;
      named.front().second.view(-1)[0].add_(1.0);
    }
  const dist::Group& dp = groups.axis("dp");
  std::vector<int64_t> crcs;
  for (const auto& [name, param] : named) {
    const at::Tensor host = param.detach().to(at::kCPU).contiguous();
    crcs.push_back(ft::crc32(host.data_ptr(), host.nbytes()));
  }
  const auto [crc_max, crc_min] = extremes_across(dp, at::tensor(crcs, at::kLong), device, "replica agreement check");
  std::vector<size_t> differing;
  for (size_t i = 0; i < named.size(); ++i)
    if (crc_max[i].item<int64_t>() != crc_min[i].item<int64_t>()) differing.push_back(i);
  if (differing.empty()) return;
  // How far apart, over the differing parameters (alike on every replica: they saw the
  // same CRCs).
  std::vector<at::Tensor> values;
  for (size_t i : differing) values.push_back(named[i].second.detach().to(at::kDouble).reshape({-1}));
  const auto [high, low] = extremes_across(dp, at::cat(values), device, "replica agreement check");
  const double spread = (high - low).max().item<double>();
  std::string names;
  for (size_t k = 0; k < differing.size() && k < 3; ++k) names += (k ? ", " : "") + named[differing[k]].first;
  if (differing.size() > 3) names += " and " + std::to_string(differing.size() - 3) + " more";
  char what[512];
  std::snprintf(what, sizeof what,
                "the data-parallel replicas ended with different parameters (%s; max abs diff %.3g): expected "
                "only when replicas ran on different hardware, else a Trireme bug to report with the command line",
                names.c_str(), spread);
  const char* mode = std::getenv("TRIREME_REPLICA_CHECK");
  if (mode && std::string(mode) == "strict") TRIREME_THROW(Unrecoverable, what);
  if (groups.coord("dp") == 0) {
    std::fprintf(stderr, "gpt: %s\n", what);
    std::fflush(stderr);
  }
}

// What a run trains on, for its checkpoints (ft::CheckpointLayout::data): the batch of a
// step is a function of the corpus, --seed and --batch (and --seq, among the model flags).
std::string data_identity(const data::Corpus& corpus, uint32_t corpus_crc, const TrainOptions& opt) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", corpus_crc);
  return "corpus of " + std::to_string(corpus.size()) + " bytes, CRC-32 " + crc + "; --seed " +
         std::to_string(opt.seed) + " --batch " + std::to_string(opt.batch);
}

// Every rank reads the same corpus: a batch is drawn from the corpus's size and the step,
// so nodes holding different copies of --data would train on different text for the same
// step, and nothing else would notice. One all-reduce of its size and CRC at the start.
void check_ranks_read_one_corpus(dist::World& world, const data::Corpus& corpus, uint32_t corpus_crc,
                                 at::Device device) {
  if (world.size() < 2) return;
  const at::Tensor mine = at::tensor(std::vector<int64_t>{corpus_crc, static_cast<int64_t>(corpus.size())}, at::kLong);
  const auto [high, low] = extremes_across(world.group(), mine, device, "corpus agreement check");
  const int64_t most = high[1].item<int64_t>(), least = low[1].item<int64_t>();
  if (high[0].item<int64_t>() != low[0].item<int64_t>() || most != least)
    TRIREME_THROW(Unrecoverable, "the ranks read different corpora (--data ", corpus.path(), ": ",
                  most == least ? "same size, other bytes" : std::to_string(least) + " to " + std::to_string(most) +
                                                               " bytes",
                  "): give every node the same --data file");
}

// Set by SIGTERM in an elastic job's worker: stop after the current step.
volatile std::sig_atomic_t stop_requested = 0;
void on_stop_request(int) { stop_requested = 1; }

// Replaces bytes that are not valid UTF-8 (a sample may stop mid-character) and control
// characters other than newline and tab with '?', so a sample cannot garble the terminal.
std::string printable(std::string text) {
  for (char& c : text)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7f) c = '?';
  size_t at = 0;
  while (at < text.size()) {
    const auto* data = reinterpret_cast<const uint8_t*>(text.data());
    const int64_t bad = data::first_invalid_utf8(data + at, text.size() - at);
    if (bad < 0) break;
    text[at + bad] = '?';
    at += bad + 1;
  }
  return text;
}

// The GPU of this local rank; throws InvalidArgument when there is none.
at::Device cuda_device(int local_rank) {
  TRIREME_CHECK(at::hasCUDA() && at::getNumGPUs() > static_cast<size_t>(local_rank),
                "--device cuda: no CUDA device for local rank ", local_rank, " (",
                at::hasCUDA() ? at::getNumGPUs() : 0, " visible); use --device cpu");
  // A step replayed after a restart must give the uninterrupted run's bits: kernels with a
  // deterministic variant use it (a warning names any without), cuBLAS gets a fixed
  // workspace (read at its first use, after this), and attention runs on the math backend,
  // as the memory-efficient one's backward accumulates in a varying order. Compiled, not
  // yet run on a GPU.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  at::globalContext().setSDPUseMemEfficient(false);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

// One line of metrics.jsonl.
obs::JsonObject step_record(int64_t step, double loss, double lr, double tokens_per_s,
                            const StepTimes& times, const parallel::StepCommStats& comm,
                            double grad_norm, int restart) {
  return obs::JsonObject()
      .add("step", step + 1)
      .add("restart", restart)
      .add("loss", loss)
      .add("lr", lr)
      .add("tokens_per_s", tokens_per_s)
      .add("step_ms", times.step_us / 1e3)
      .add("forward_ms", times.forward_us / 1e3)
      .add("backward_ms", times.backward_us / 1e3)
      .add("optimizer_ms", times.optimizer_us / 1e3)
      .add("comm_exposed_ms", comm.exposed_us() / 1e3)
      .add("comm_busy_ms", comm.comm_busy_us() / 1e3)
      .add("buckets", static_cast<int64_t>(comm.buckets.size()))
      .add("buckets_overlapped", comm.buckets_overlapped())
      .add("grad_norm", grad_norm)
      .add("snapshot_ms", times.snapshot_us / 1e3)
      .add("snapshot_writer_cpu_ms", times.snapshot_writer_us / 1e3)
      .add("checkpoint_ms", times.checkpoint_us / 1e3);
}

// A restart's recovery, in wall-clock microseconds (comparable across the processes of a
// machine): the agents' part (dist::World::RestartTimes), then this worker's: it began
// (its process started, or its standby was activated), began and finished reading the
// state.
struct Recovery {
  std::optional<dist::World::RestartTimes> agents;  // nullopt: a first generation
  double started_us = 0;
  double resume_us = 0;
  double resumed_us = 0;

  // The phases from the agent's sight of the failure to the step done at `now`, in ms, in
  // order: (name in metrics.jsonl, name in the report). (A phase between two clocks that
  // disagree by a little reads 0, not negative.)
  std::vector<std::tuple<const char*, const char*, double>> phases_ms(double now) const {
    const auto ms = [](double from, double to) { return std::max(0.0, to - from) / 1e3; };
    return {{"membership", "membership", ms(agents->failure_seen_us, agents->members_decided_us)},
            {"snapshot_recovery", "snapshot recovery", ms(agents->members_decided_us, agents->recovered_us)},
            {"workers", "workers running", ms(agents->recovered_us, started_us)},
            {"setup", "model and groups", ms(started_us, resume_us)},
            {"state", "state read", ms(resume_us, resumed_us)},
            {"first_step", "first step", ms(resumed_us, now)}};
  }

  // "training again 472 ms after the failure was seen (membership 3 ms, snapshot recovery
  // 0 ms, workers running 30 ms, model and groups 60 ms, state read 28 ms, first step
  // 348 ms)".
  std::string describe(double now) const {
    std::string text = "training again " + std::to_string(std::lround(total_ms(now))) +
                       " ms after the failure was seen (";
    const char* separator = "";
    for (const auto& [key, name, ms] : phases_ms(now)) {
      text += separator + std::string(name) + " " + std::to_string(std::lround(ms)) + " ms";
      separator = ", ";
    }
    return text + ")";
  }

  // metrics.jsonl's "recovery_phases_ms": {"membership": ..., ..., "first_step": ...}.
  std::string phases_json(double now) const {
    obs::JsonObject phases;
    for (const auto& [key, name, ms] : phases_ms(now)) phases.add(key, ms);
    return phases.str();
  }

  double total_ms(double now) const { return (now - agents->failure_seen_us) / 1e3; }
};

// DIR/run.json: the layout and each rank's place in it, for `trireme report`.
std::string run_json(const TrainOptions& opt, const dist::Mesh& mesh, int64_t first_traced,
                     int64_t last_traced, const std::vector<std::string>& rank_entries) {
  std::string ranks = "[";
  for (size_t r = 0; r < rank_entries.size(); ++r) ranks += (r ? ", " : "") + rank_entries[r];
  ranks += "]";
  return obs::JsonObject()
             .add("command", "train gpt")
             .add("mesh", mesh.describe())
             .add("dp", opt.dp)
             .add("tp", opt.tp)
             .add("pp", opt.pp)
             .add("zero", opt.zero)
             .add("schedule", opt.pp > 1 ? opt.schedule : std::string("none"))
             .add("micro_batches", opt.micro_batches)
             .add("replica_batches", opt.replica_batches.empty() ? std::string("even") : opt.replica_batches)
             .add("chunks", opt.chunks)
             .add_raw("traced_steps", "[" + std::to_string(first_traced) + ", " + std::to_string(last_traced) + "]")
             .add_raw("ranks", ranks)
             .str() +
         "\n";
}

// The snapshot interval's ceiling when the stall policy keeps doubling it.
constexpr int64_t kMaxSnapshotInterval = 1024;

// Waits (up to 30 s) until every rank of this node (the rank directories beside
// `snapshot_dir`, but `but`) has committed its snapshot of `step`: the other ranks' idle-priority
// writers may lag, and the test seams below expect that step whole everywhere.
void await_snapshot_on_node(const std::string& snapshot_dir, int64_t step, const std::string& but = "") {
  namespace fs = std::filesystem;
  const auto committed_everywhere = [&] {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(fs::path(snapshot_dir).parent_path(), ec)) {
      if (entry.path().filename().string().rfind("rank-", 0) != 0) continue;
      if (!but.empty() && fs::equivalent(entry.path(), but, ec)) continue;
      const auto steps = ft::Snapshotter::complete_steps(entry.path().string());
      if (std::find(steps.begin(), steps.end(), step) == steps.end()) return false;
    }
    return true;
  };
  const double deadline = obs::now_us() + 30e6;
  while (!committed_everywhere() && obs::now_us() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// The leader's line of a step comes before its state's commit. The leader writes step S's
// line in metrics.jsonl after S's snapshot (or checkpoint) is taken, so that the line says
// what the snapshot held the step; a leader killed after the writer thread committed S but
// before the line was written would have the job resume after S with S's line missing. So
// the leader's writers wait, just before they commit S, until S's line is written (the
// training thread writes it microseconds after the take; the commit is the writer's, off
// the step). A leader killed in between leaves S uncommitted: the job resumes from the
// step before, and S is trained, and its line written, again.
class RecordGate {
 public:
  // On a writer thread, before committing `step`.
  void before_commit(int64_t step) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto held = held_.insert(step);  // (the snapshot's and the checkpoint's writers may both wait)
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_ || written_ >= step; });
    held_.erase(held);
  }
  void written(int64_t step) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      written_ = step;
    }
    changed_.notify_all();
  }
  // For good: the training thread leaves (an exception, the end), and the writers' drains
  // must not wait for lines that will not come.
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }
  // (Test seam.) Whether a writer waits here to commit `step` within 30 s.
  bool await_held(int64_t step) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return held_.count(step) > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t written_ = -1;
  std::multiset<int64_t> held_;  // the steps writers wait to commit
  bool open_ = false;
};

// Test seam: TRIREME_TEST_KILL_BEFORE_RECORD=STEP makes the leader of the first generation
// SIGKILL itself after its snapshot of STEP is taken and before STEP's line is written, once
// the other ranks of the node have committed STEP and its own writer is ready to (waits at
// the RecordGate). The restart must resume at STEP-1 and write STEP's line.
void kill_before_record_seam(bool leader, int restart, const std::string& snapshot_dir, int64_t steps_done,
                             bool snapshotted, RecordGate& gate) {
  const char* spec = std::getenv("TRIREME_TEST_KILL_BEFORE_RECORD");
  if (!spec || !leader || restart > 0 || snapshot_dir.empty() || std::atoll(spec) != steps_done) return;
  if (!snapshotted || !gate.await_held(steps_done)) {
    std::fprintf(stderr, "gpt: TRIREME_TEST_KILL_BEFORE_RECORD: no snapshot of step %lld waits to commit; not "
                         "killed\n", (long long)steps_done);
    return;
  }
  await_snapshot_on_node(snapshot_dir, steps_done, /*but=*/snapshot_dir);
  std::raise(SIGKILL);
}

// Test seam (STYLE 8): TRIREME_TEST_KILL_IN_SNAPSHOT="RANK:STEP" makes that rank kill
// itself with SIGKILL in the middle of writing its snapshot of STEP (data written, manifest
// not), in the first generation only, once STEP-1 is whole on the node.
std::function<void(int64_t)> kill_in_snapshot_seam(int rank, int restart, const std::string& snapshot_dir) {
  const char* spec = std::getenv("TRIREME_TEST_KILL_IN_SNAPSHOT");
  int victim = -1;
  long long at = -1;
  if (!spec || restart > 0 || std::sscanf(spec, "%d:%lld", &victim, &at) != 2 || victim != rank) return {};
  return [at, snapshot_dir](int64_t step) {
    if (step != at) return;
    await_snapshot_on_node(snapshot_dir, at - 1);
    std::raise(SIGKILL);
  };
}

// Test seam: TRIREME_TEST_KILL_AFTER_TRAINING=RANK makes that rank of the first
// generation SIGKILL itself after its last step, once that step is whole on the node: the
// restart resumes at --steps itself, trains nothing, and writes the run's files.
void kill_after_training_seam(int rank, int restart, const std::string& snapshot_dir, int64_t steps) {
  const char* spec = std::getenv("TRIREME_TEST_KILL_AFTER_TRAINING");
  if (!spec || restart > 0 || std::atoi(spec) != rank || snapshot_dir.empty()) return;
  await_snapshot_on_node(snapshot_dir, steps);
  std::raise(SIGKILL);
}

// Test seam: TRIREME_TEST_DAMAGE_SNAPSHOT="RANK:STEP" makes that rank of the first
// generation, on the training thread right after its snapshot of STEP, wait until STEP is
// whole on the node, flip a byte in the middle of its own snapshot's data (as a memory
// fault would), and kill itself with SIGKILL. The other ranks cannot finish STEP+1 without
// it, so every rank still holds STEP-1, which the restart must fall back to.
int64_t damage_snapshot_step(int rank, int restart) {
  const char* spec = std::getenv("TRIREME_TEST_DAMAGE_SNAPSHOT");
  int victim = -1;
  long long at = -1;
  if (!spec || restart > 0 || std::sscanf(spec, "%d:%lld", &victim, &at) != 2 || victim != rank) return -1;
  return at;
}

void damage_snapshot_and_die(ft::Snapshotter& snapshotter, const std::string& snapshot_dir, int64_t step) {
  namespace fs = std::filesystem;
  snapshotter.wait();  // its own commit
  await_snapshot_on_node(snapshot_dir, step);
  std::error_code ec;
  fs::path data;  // the largest file of the snapshot: its data (the magic line is at the start)
  for (const auto& entry : fs::directory_iterator(snapshot_dir + "/" + std::to_string(step), ec))
    if (entry.is_regular_file(ec) && (data.empty() || entry.file_size(ec) > fs::file_size(data, ec)))
      data = entry.path();
  const int fd = ::open(data.c_str(), O_RDWR);
  const auto middle = static_cast<off_t>(fs::file_size(data, ec) / 2);
  unsigned char byte = 0;
  if (fd < 0 || ::pread(fd, &byte, 1, middle) != 1) std::abort();
  byte ^= 0x01;
  if (::pwrite(fd, &byte, 1, middle) != 1) std::abort();
  ::close(fd);
  std::raise(SIGKILL);
}

// Keeps the lines of a metrics.jsonl whose step is at most `last` (a resumed run writes
// the later steps again), and puts their losses on `curve`: loss.svg shows the whole run.
// A line that is not a whole record (one cut by a crash or a full disk as it was written)
// is dropped, and a loss that is not a number (null: the step's loss was not finite) is
// left off the curve rather than drawn as 0.
void keep_metrics_up_to(const std::string& path, int64_t last, obs::Series* curve) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) continue;
    const int64_t step = record["step"].get<int64_t>();
    if (step > last) continue;
    kept += line + "\n";
    if (record.contains("loss") && record["loss"].is_number()) {
      curve->x.push_back(static_cast<double>(step));
      curve->y.push_back(record["loss"].get<double>());
    }
  }
  in.close();
  obs::write_text_file(path, kept);
}

int64_t bytes_of(const std::vector<at::Tensor>& tensors, bool grads) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    const at::Tensor& x = grads ? t.grad() : t;
    if (x.defined()) bytes += static_cast<int64_t>(x.nbytes());
  }
  return bytes;
}

// What this rank holds, by kind (maxima over the run's steps), for run.json and the
// memory lines at the end.
//   parameters       this rank's parameters (its shards under TP, its stage under PP)
//   gradients        gradients held between backward and the optimizer step: the
//                    parameters' .grad, or under ZeRO-2 this rank's gradient chunks
//   optimizer state  AdamW's exp_avg and exp_avg_sq (this rank's pieces under ZeRO)
//   comm buffers     DataParallel's all-reduce buckets, kept between steps
//   activations      peak bytes a step (forward and backward) allocated above what was
//                    live before it, less one gradient per parameter, which backward also
//                    allocates: activations kept for backward, receive buffers, temporaries
struct MemoryAccount {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, comm_buffers = 0, peak_step = 0;

  int64_t activations() const { return std::max<int64_t>(0, peak_step - parameters); }
  void add_to(obs::JsonObject& out) const {
    out.add("parameter_bytes", parameters)
        .add("gradient_bytes", gradients)
        .add("optimizer_state_bytes", optimizer_state)
        .add("comm_buffer_bytes", comm_buffers)
        .add("peak_step_bytes", peak_step)
        .add("peak_activation_bytes", activations());
  }
  std::string line(int rank) const {
    const auto mib = [](int64_t b) { return b / double(1 << 20); };
    char text[256];
    std::snprintf(text, sizeof text,
                  "rank %d: params %.2f, grads %.2f, optimizer state %.2f, comm buffers %.2f, "
                  "peak activations %.2f MiB",
                  rank, mib(parameters), mib(gradients), mib(optimizer_state), mib(comm_buffers),
                  mib(activations()));
    return text;
  }
};

void record_comm(obs::Timeline& timeline, const ClockMap& clock,
                 const parallel::StepCommStats& stats) {
  for (const auto& b : stats.buckets)
    timeline.add({"allreduce bucket " + std::to_string(b.bucket), "comm", obs::Lane::kComm,
                  clock.wall(b.launch_us), b.done_us - b.launch_us,
                  "{\"bytes\": " + std::to_string(b.bytes) + "}", ""});
}

}  // namespace

int train_worker_main(const std::vector<std::string>& args) {
  TrainOptions opt;
  FlagParser parser("trireme train");
  add_train_flags(parser, &opt);
  parser.parse(args, /*allow_unknown=*/true);  // the launcher's flags are in args too
  // What needs no world is done before a standby waits for activation (main() leaves the
  // wait to us): the corpus read (8 ms for the default one) and the kernels' warm-up.
  const data::Corpus corpus =
      data::Corpus::load(opt.data.empty() ? data::default_corpus_path() : opt.data);
  corpus.require_length(opt.model.seq_len);
  const uint32_t corpus_crc = ft::crc32(corpus.bytes().data(), corpus.size());  // (before a standby waits)
  // One intra-op thread per rank unless the launcher says otherwise.
  const char* threads = std::getenv("OMP_NUM_THREADS");
  at::set_num_threads(threads ? std::max(1, std::atoi(threads)) : 1);
  if (launch::awaiting_activation()) {
    warm_up_kernels(opt);
    launch::await_activation();
  }
  Recovery recovery;  // (used only after a restart)
  recovery.started_us = obs::wall_us();

  const dist::WorldInfo world_info = dist::world_info_from_env();
  dist::WorldOptions world_options;
  world_options.on_store_retry = report_store_retry;
  if (opt.device == "cuda") {
    world_options.group.backend = dist::BackendKind::kNccl;
    world_options.group.cuda_device = world_info.local_rank;  // as cuda_device() below
  }
  dist::World world = dist::World::connect(world_info, world_options);
  // An elastic job (--nnodes MIN:MAX) keeps tp and pp and chooses dp for the ranks present.
  const bool elastic = ft::elastic_from_env();
  if (elastic) {
    opt.dp = 0;
    const std::string named = opt.replica_batches;
    if (drop_replica_batches_for(&opt, world.size()) && world.rank() == 0)
      std::fprintf(stderr, "gpt: --replica-batches %s names a different number of replicas than the %d now present; "
                           "splitting --batch evenly\n", named.c_str(), world.size() / std::max(1, opt.tp * opt.pp));
  }
  validate_train_options(&opt, world.size());
  const int rank = world.rank();
  const bool leader = rank == 0;

  const dist::Mesh mesh = dist::Mesh::from_sizes(opt.dp, opt.tp, opt.pp, opt.mesh_order);
  dist::MeshGroups groups = world.mesh_groups(mesh);
  const int dp_rank = groups.coord("dp");
  std::string role = opt.pp > 1 ? "pipeline stage " + std::to_string(groups.coord("pp")) + " of " +
                                      std::to_string(opt.pp) + ", data-parallel replica " +
                                      std::to_string(dp_rank)
                                : "data-parallel replica " + std::to_string(dp_rank) + " of " +
                                      std::to_string(opt.dp);
  if (opt.tp > 1)
    role += ", tensor-parallel rank " + std::to_string(groups.coord("tp")) + " of " + std::to_string(opt.tp);
  world.announce_role(role);
  // Creating NCCL groups loaded libtorch's CUDA part; only now can CUDA be asked about.
  const at::Device device = opt.device == "cuda" ? cuda_device(world.info().local_rank)
                                                 : at::Device(at::kCPU);
  check_ranks_read_one_corpus(world, corpus, corpus_crc, device);

  // The default generators (dropout's) are seeded apart per data-parallel replica and
  // pipeline stage, and alike within a tensor-parallel group, whose replicated regions must
  // draw the same masks (tensor::RngTracker). A restore then overwrites them.
  at::manual_seed(static_cast<uint64_t>(opt.seed) * 1000003 + 7919 * static_cast<uint64_t>(dp_rank) +
                  104729 * static_cast<uint64_t>(groups.coord("pp")) + 1);
  const data::BatchSampler sampler(corpus.size(), opt.model.seq_len, opt.batch,
                                   static_cast<uint64_t>(opt.seed));

  obs::CpuMemory::install();
  const int restart = world.info().restart_count;
  // A restart or --resume overwrites the parameters right after: they need not first be
  // initialised and made equal across replicas (unless nothing is restored, below).
  const bool restoring = restart > 0 || opt.resume;
  std::unique_ptr<TrainEngine> engine =
      opt.pp > 1 ? make_pipeline_engine(opt, world, groups, device, restoring)
                 : make_data_parallel_engine(opt, groups, device, restoring);
  const EmulatedSlowdown slowdown(opt, rank);
  // AdamW over this rank's parameters, or under --zero over the pieces it owns.
  const auto adamw_options =
      torch::optim::AdamWOptions(opt.lr).betas({0.9, 0.95}).weight_decay(opt.weight_decay);
  std::unique_ptr<torch::optim::AdamW> adamw;
  std::unique_ptr<parallel::ZeroOptimizer> zero;
  if (opt.zero > 0)
    zero = std::make_unique<parallel::ZeroOptimizer>(engine->data_parallel(), opt.zero, adamw_options);
  else
    adamw = std::make_unique<torch::optim::AdamW>(engine->parameters(), adamw_options);
  const optim::NormSharing sharing =
      zero ? zero->norm_sharing(engine->parameters(), engine->gradient_norm_sharing())
           : engine->gradient_norm_sharing();
  MemoryAccount memory;
  memory.parameters = bytes_of(engine->parameters(), false);
  ft::TrainingState train_state;  // what checkpoints and snapshots hold
  train_state.world = &world;
  train_state.parameters = engine->named_parameters();
  train_state.specs = engine->shard_specs();
  train_state.split_rng = engine->split_rng();
  train_state.tp = opt.tp;
  train_state.tp_rank = groups.coord("tp");
  train_state.dp = opt.dp;
  train_state.dp_rank = groups.coord("dp");
  train_state.dp_group = groups.axis("dp");
  train_state.data_parallel = &engine->data_parallel();
  train_state.adamw = adamw.get();
  train_state.zero = zero.get();
  train_state.layout = {mesh.describe(), opt.dp, opt.tp, opt.pp, opt.zero, -1, opt.model.flags(),
                        data_identity(corpus, corpus_crc, opt)};
  // An elastic job restores from whatever whole replicas the nodes left hold: no shares
  // (`trireme train` refuses --snapshot-share 1 there).
  train_state.share_snapshots = opt.snapshot_share == 1 || (opt.snapshot_share == -1 && !elastic);
  // Where this rank resumes: after a restart from the node's in-memory snapshots, else
  // (or when they cannot serve) from the newest checkpoint on disk.
  const std::string area = ft::snapshot_area_on_every_node(train_state);
  const std::string snapshot_dir = area.empty() ? "" : ft::snapshot_dir_from_env(rank);
  int64_t first_step = 0;
  std::string resumed_from;
  const double resume_start = obs::now_us();
  recovery.resume_us = obs::wall_us();
  // A committed checkpoint newer than every step the snapshots hold serves first (on a tie
  // the snapshots do); else the restart would redo its steps and rewrite it.
  int64_t floor = 0;
  if (restart > 0 && !area.empty() && (elastic || !snapshot_dir.empty())) {
    const int64_t in_memory = ft::memory_step_bound(train_state, area, elastic);
    first_step = ft::load_newer_checkpoint(train_state, opt.checkpoint_dir, in_memory, &floor);
    if (first_step > 0) resumed_from = opt.checkpoint_dir;
  }
  if (first_step == 0 && restart > 0 && elastic && !area.empty()) {
    // The membership may have changed: any layout, from whatever this node's memory holds.
    first_step = ft::load_from_memory(train_state, area, &resumed_from, floor);
    if (first_step == 0 && leader)
      std::fprintf(stderr, "gpt: restart %d: no step of the training state is whole in the memory of the nodes "
                           "left; resuming from the newest checkpoint in %s\n", restart, opt.checkpoint_dir.c_str());
  } else if (first_step == 0 && restart > 0 && !snapshot_dir.empty()) {
    bool shared = false;
    first_step = ft::load_snapshot(train_state, snapshot_dir, &shared, floor);
    if (first_step > 0)
      resumed_from = shared ? "memory snapshots (shared by " + std::to_string(opt.dp) + " replicas)" : "memory snapshots";
  }
  if (first_step == 0 && (opt.resume || restart > 0)) {
    first_step = ft::load_checkpoint(train_state, opt.checkpoint_dir);
    if (first_step > 0) resumed_from = opt.checkpoint_dir;
  }
  if (restoring && first_step == 0) {  // nothing restored: start as a first run does
    engine->initialize_parameters();
    engine->data_parallel().broadcast_initial_state();
  }
  recovery.resumed_us = obs::wall_us();
  if (leader && first_step < opt.steps) recovery.agents = world.restart_times();  // (a step to report it with)
  if (recovery.agents && !opt.quiet) world.reporting_recovery();  // our line, not the agent's
  if (leader && !opt.quiet && first_step > 0)
    std::fprintf(stderr, "gpt: %sresumed at step %lld from %s in %.0f ms\n",
                 restart > 0 ? ("restart " + std::to_string(restart) + ": ").c_str() : "", (long long)first_step,
                 resumed_from.c_str(), (obs::now_us() - resume_start) / 1e3);
  else if (leader && !opt.quiet && (opt.resume || restart > 0))
    std::fprintf(stderr, "gpt: nothing to resume from (no snapshot, no checkpoint in %s); starting at step 0\n",
                 opt.checkpoint_dir.c_str());
  // Snapshots: every --snapshot-every steps; by default every step when the launcher
  // allows restarts and gives a snapshot area.
  // Test seam: TRIREME_TEST_HANG_AT="RANK:STEP" makes that rank of the first generation
  // stop (without exiting) after that step, as a deadlocked worker would.
  int64_t hang_at = -1;
  if (const char* spec = std::getenv("TRIREME_TEST_HANG_AT")) {
    int victim = -1;
    long long at = -1;
    if (restart == 0 && std::sscanf(spec, "%d:%lld", &victim, &at) == 2 && victim == rank) hang_at = at;
  }
  double last_stall = 0;  // the last snapshot's stall / its step's time, until reduced
  struct {
    double held_us = 0, step_us = 0;  // step_us 0: no snapshot waits to be judged
    int64_t every = 1;
  } unjudged;  // the last snapshot, until the next step's before_update() completes its stall
  int64_t snapshot_every = ft::snapshot_interval(opt.snapshot_every, snapshot_dir);
  int64_t last_snapshot = first_step;  // the newest step snapshotted (or resumed from)
  const int64_t damage_at = damage_snapshot_step(rank, restart);
  // Disk checkpoints are written in the background too, committed through the store.
  RecordGate record_gate;  // the leader's writers commit a step once its line is written
  std::function<void(int64_t)> gate;
  if (leader) gate = [&record_gate](int64_t step) { record_gate.before_commit(step); };
  std::unique_ptr<ft::BackgroundWriter> checkpointer;
  if (opt.checkpoint_every > 0)
    checkpointer =
        ft::checkpoint_writer(train_state, opt.checkpoint_dir, static_cast<int>(opt.keep_checkpoints), gate);
  std::unique_ptr<ft::Snapshotter> snapshotter;
  ft::CheckpointLayout snapshot_layout = train_state.layout;
  snapshot_layout.rank = rank;  // a snapshot holds this rank's own state
  if (snapshot_every > 0) {
    auto seam = kill_in_snapshot_seam(rank, restart, snapshot_dir);
    snapshotter = std::make_unique<ft::Snapshotter>(snapshot_dir, snapshot_layout, [seam, gate](int64_t step) {
      if (seam) seam(step);
      if (gate) gate(step);
    });
  }
  // Opens the gate before the writers' destructors wait for their commits, however this
  // function ends (declared after them, so destroyed first).
  struct GateOpener {
    RecordGate& gate;
    ~GateOpener() { gate.open(); }
  } const open_gate_at_exit{record_gate};
  const optim::LrSchedule schedule{opt.lr, opt.min_lr, opt.warmup, opt.steps};

  std::filesystem::create_directories(opt.out);
  std::unique_ptr<obs::MetricsWriter> metrics;
  obs::Series loss_curve{"loss (global batch)", {}, {}};
  // A run resumed (--resume) at --steps itself trains nothing: it loads the state (for
  // --dump-params, or to check a load under another layout) and leaves the run's metrics,
  // traces and layout as they were (before 2026-12-07 it wrote empty ones over them). A
  // restart there (a worker failed after the last step) still writes them: this job's own.
  const bool trained = first_step < opt.steps || restart > 0;
  if (leader && first_step > 0 && trained) keep_metrics_up_to(opt.out + "/metrics.jsonl", first_step, &loss_curve);
  if (leader && trained)
    metrics = std::make_unique<obs::MetricsWriter>(opt.out + "/metrics.jsonl", /*append=*/first_step > 0);
  const bool live = std::getenv("TRIREME_TTY") && std::string(std::getenv("TRIREME_TTY")) == "1";
  obs::ProgressLine progress(stderr, live, opt.log_every);
  obs::Timeline timeline(rank);
  ClockMap clock;
  // Across machines, the timeline is kept on rank 0's clock: each rank's wall clock read
  // as a barrier ends (within a message's latency everywhere) against rank 0's reading
  // gives its clock's offset, which a skew between machines would otherwise add to the
  // trace and to `trireme report`'s bubble.
  if (world.info().spans_machines()) {
    dist::run_collective("clock barrier", [&] { return world.group()->barrier(); });
    const double mine = obs::wall_us();
    const at::Tensor reading = at::tensor({rank == 0 ? mine : 0.0}, at::kDouble);
    clock.offset -= mine - dist::all_reduce(world.group(), reading, c10d::ReduceOp::SUM, device, "clock reading")
                               .cpu()
                               .item<double>();
  }
  const int64_t trace_first = opt.steps > 1 ? 1 : 0;  // skip the warm-up step
  const int64_t trace_last = trace_first + opt.trace_steps;
  const int64_t tokens_per_step = opt.batch * opt.model.seq_len;
  const ReplicaShare share = replica_share(opt, dp_rank);
  const int64_t micro = share.count / opt.micro_batches;
  if (leader && !opt.quiet)
    std::fprintf(stderr, "gpt: %lld parameters | %s | %s | batch %lld%s x %lld bytes | %lld steps\n",
                 (long long)models::GptConfig(opt.model).num_parameters(), mesh.describe().c_str(),
                 (engine->describe() + (opt.zero ? ", ZeRO-" + std::to_string(opt.zero) : "")).c_str(),
                 (long long)opt.batch,
                 opt.replica_batches.empty() ? "" : (" (replicas " + opt.replica_batches + ")").c_str(),
                 (long long)opt.model.seq_len, (long long)opt.steps);

  double elapsed_s = 0;
  std::vector<double> step_seconds;  // the leader's, for the plan's prediction
  // An elastic job's worker takes SIGTERM (its agent's preemption notice, or a restart)
  // as: finish this step, commit its snapshot, exit; so that no finished step is lost.
  // (A worker whose collective fails because a peer went away commits its pending
  // snapshot too: the exception unwinds through ~Snapshotter, which drains its writer.)
  if (elastic) std::signal(SIGTERM, on_stop_request);
  for (int64_t step = first_step; step < opt.steps; ++step) {
    const bool tracing = step >= trace_first && step < trace_last;
    const double lr = schedule.at(step);
    if (zero) {
      zero->set_lr(lr);
    } else {
      for (auto& group : adamw->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }

    const double step_start = obs::now_us();
    StepTimes times;
    const auto offsets = sampler.slice(step, share.begin, share.count);
    std::vector<data::Batch> micro_batches;
    for (int64_t m = 0; m < opt.micro_batches; ++m) {
      std::vector<uint64_t> part(offsets.begin() + m * micro, offsets.begin() + (m + 1) * micro);
      data::Batch batch = data::make_batch(corpus, part, opt.model.seq_len);
      batch.inputs = batch.inputs.to(device, /*non_blocking=*/true);
      batch.targets = batch.targets.to(device, /*non_blocking=*/true);
      micro_batches.push_back(std::move(batch));
    }
    const int64_t live_before = obs::CpuMemory::current_bytes();
    obs::CpuMemory::reset_peak();
    const double local_loss =
        engine->run_step(micro_batches, &times, {tracing ? &timeline : nullptr, &clock, step + 1});
    memory.peak_step = std::max(memory.peak_step, obs::CpuMemory::peak_bytes() - live_before);
    const parallel::StepCommStats& comm = engine->comm();
    if (tracing) record_comm(timeline, clock, comm);

    // No parameter may change before the last snapshot's copy (on a GPU's side stream) has
    // read it: a wait here, if the copy is still running, is part of the snapshot's stall.
    if (snapshotter) {
      const double waited = snapshotter->before_update();
      times.snapshot_writer_us = snapshotter->last_write_cpu_us();
      times.snapshot_us += waited;
      // The last snapshot's stall is now whole: what its step was held for the copy plus
      // this wait. Spread over the steps of its interval, it is the overhead the policy
      // below judges.
      if (unjudged.step_us > 0)
        last_stall = (unjudged.held_us + waited) / (unjudged.step_us * static_cast<double>(unjudged.every));
      unjudged = {};
    }
    if (checkpointer) times.checkpoint_us += checkpointer->before_update();
    const double o0 = obs::now_us();
    const double cpu0 = obs::thread_cpu_us();  // the emulated slowdown's measure (no waits)
    const int64_t buffers = engine->data_parallel().buffer_bytes();
    memory.gradients = std::max(memory.gradients, bytes_of(engine->parameters(), true) + (opt.zero == 2 ? buffers : 0));
    memory.comm_buffers = std::max(memory.comm_buffers, opt.zero == 2 ? 0 : buffers);
    double grad_norm = 0;
    if (zero) {
      zero->attach_gradients();
      grad_norm = optim::clip_grad_norm(zero->parameters(), opt.clip, sharing);
      zero->step();
      zero->zero_grad();
      memory.optimizer_state = zero->optimizer_state_bytes();
    } else {
      grad_norm = optim::clip_grad_norm(engine->parameters(), opt.clip, sharing);
      adamw->step();
      adamw->zero_grad();
      memory.optimizer_state = parallel::adamw_state_bytes(*adamw);
    }
    slowdown.after((obs::thread_cpu_us() - cpu0) * 1e-6);  // an emulated slower device's optimizer too
    const double o1 = obs::now_us();
    times.optimizer_us = o1 - o0;
    if (tracing)
      timeline.add({"optimizer", "compute", obs::Lane::kCompute, clock.wall(o0), o1 - o0, "", ""});

    // The step's loss over the global batch: the mean of the data-parallel replicas' means
    // (each replica's held by its last pipeline stage; the other ranks add 0).
    // The same all-reduce carries the stall of the last snapshot (as a fraction of its
    // step), so that every rank takes the same decision on the snapshot frequency.
    std::vector<at::Tensor> loss_buffer{
        at::tensor({local_loss, last_stall}, at::TensorOptions(at::kDouble)).to(device)};
    if (world.size() > 1)
      dist::run_collective("loss all-reduce", [&] { return world.group()->allreduce(loss_buffer); });
    const at::Tensor reduced = loss_buffer[0].cpu();
    const double loss = reduced[0].item<double>() / opt.dp;
    const double mean_stall = reduced[1].item<double>() / world.size();
    last_stall = 0;
    if (snapshotter && opt.snapshot_overhead > 0 && mean_stall > opt.snapshot_overhead &&
        snapshot_every < kMaxSnapshotInterval) {
      // CheckFreq's policy: snapshot less often while the stall exceeds the target.
      snapshot_every *= 2;
      if (leader && !opt.quiet)
        std::fprintf(stderr, "gpt: snapshots cost %.1f%% of step time (target %.1f%%): now every %lld steps\n",
                     100 * mean_stall, 100 * opt.snapshot_overhead, (long long)snapshot_every);
    }
    world.heartbeat(step + 1);
    if (hang_at == step + 1) ::pause();  // test seam: hang (no heartbeat, no exit)
    // A snapshot that creates a slot (the first ones of a process, and one more while the
    // node agent holds a slot) pays its page allocation once: not what snapshots cost.
    double snapshot_held_us = -1;
    if (snapshotter && (step + 1) % snapshot_every == 0) {
      snapshot_held_us = ft::take_snapshot(train_state, *snapshotter, step + 1);
      last_snapshot = step + 1;
      if (damage_at == step + 1) {  // test seam (it waits for the commit: no line for it will come)
        record_gate.open();
        damage_snapshot_and_die(*snapshotter, snapshot_dir, step + 1);
      }
      times.snapshot_us += snapshot_held_us;
      if (snapshotter->made_slot()) snapshot_held_us = -1;
    }
    if (checkpointer && (step + 1) % opt.checkpoint_every == 0)
      times.checkpoint_us += ft::save_checkpoint_async(train_state, *checkpointer, step + 1);
    times.step_us = obs::now_us() - step_start;
    if (snapshot_held_us >= 0) unjudged = {snapshot_held_us, times.step_us, snapshot_every};
    elapsed_s += times.step_us / 1e6;

    if (leader) {
      step_seconds.push_back(times.step_us / 1e6);
      loss_curve.x.push_back(static_cast<double>(step + 1));
      loss_curve.y.push_back(loss);
      const double tokens_per_s = tokens_per_step / (times.step_us / 1e6);
      obs::JsonObject record = step_record(step, loss, lr, tokens_per_s, times, comm, grad_norm, restart);
      if (step == first_step && recovery.agents) {
        // The first step after a restart: how long training stood still, from the agent's
        // first sight of the failure.
        const double now = obs::wall_us();
        record.add("recovery_ms", recovery.total_ms(now)).add_raw("recovery_phases_ms", recovery.phases_json(now));
        if (!opt.quiet) std::fprintf(stderr, "gpt: restart %d: %s\n", restart, recovery.describe(now).c_str());
      }
      kill_before_record_seam(leader, restart, snapshot_dir, step + 1, last_snapshot == step + 1, record_gate);
      metrics->write(record);
      record_gate.written(step + 1);
      if (!opt.quiet)
        progress.update({step + 1, opt.steps, loss, tokens_per_s, elapsed_s / (step + 1 - first_step)});
    }
    if (stop_requested) {
      // (Its newest snapshot: with a longer interval than 1 the job resumes from the newest
      // step every rank snapshotted, and the steps since are run again.)
      if (snapshotter) snapshotter->wait();
      std::fprintf(stderr, "gpt: rank %d stopped after step %lld (SIGTERM), its snapshot of step %lld committed\n",
                   rank, (long long)(step + 1), (long long)last_snapshot);
      std::fflush(stderr);
      std::_Exit(128 + SIGTERM);
    }
  }
  // Training is over: what is left (the last snapshot and checkpoint, the timeline, the
  // dump) makes no steps, so the agent's hang watch ends here. (Under load it took more
  // than a 2 s --heartbeat-timeout, and the finished job was killed as hung.)
  world.heartbeat_done();
  if (snapshotter) snapshotter->wait();
  kill_after_training_seam(rank, restart, snapshot_dir, opt.steps);
  if (checkpointer) checkpointer->wait();  // rank 0 commits the last checkpoint before leaving
  check_replicas_agree(*engine, groups, device);
  if (leader && !opt.quiet) progress.finish();

  obs::RankEvents ranks;
  for (const auto& text : world.gather_on_leader("timeline", timeline.serialize()))
    ranks.push_back(obs::Timeline::parse(text));
  const std::vector<std::string> dumps =
      opt.dump_params.empty() ? std::vector<std::string>()
                              : world.gather_on_leader("dump", obs::parameter_dump_bytes(engine->dump_parameters()));
  obs::JsonObject entry;
  entry.add("rank", rank).add("stage", groups.coord("pp")).add("dp", dp_rank);
  engine->summarize(entry);
  memory.add_to(entry);
  const std::vector<std::string> entries = world.gather_on_leader("summary", entry.str());
  const std::vector<std::string> memory_lines = world.gather_on_leader("memory", memory.line(rank));
  if (leader && !opt.dump_params.empty()) {
    std::string all;
    for (const auto& d : dumps) all += d;  // each stage once, in rank order
    obs::write_text_file(opt.dump_params, all);
  }
  if (leader && !trained)
    std::fprintf(stderr, "gpt: resumed at step %lld, which is --steps: nothing to train; %s left as they were\n",
                 (long long)first_step,
                 opt.dump_params.empty() ? (opt.out + "'s files").c_str()
                                         : ("wrote " + opt.dump_params + ", " + opt.out + "'s files").c_str());
  if (leader && trained) {
    // This generation traced the window's steps from where it started (a resumed one
    // traced none of those before its first step); [first, first - 1] when none.
    const int64_t first_traced = std::max(trace_first, first_step);
    const int64_t last_traced = std::max(first_traced, std::min(trace_last, opt.steps));
    obs::write_text_file(opt.out + "/trace.json", obs::chrome_trace_json(ranks));
    obs::write_text_file(opt.out + "/timeline.tsv", obs::serialize_ranks(ranks));
    obs::write_text_file(opt.out + "/run.json",
                         run_json(opt, mesh, first_traced + 1, last_traced, entries));
    const std::string steps = last_traced > first_traced ? "steps " + std::to_string(first_traced + 1) + "-" +
                                                               std::to_string(last_traced)
                                                         : "no steps traced";
    obs::write_text_file(opt.out + "/timeline.svg",
                         obs::timeline_svg("trireme train gpt, " + steps + ": " + mesh.describe(), ranks));
    obs::write_text_file(opt.out + "/loss.svg",
                         obs::line_chart_svg("trireme train gpt: " + mesh.describe(), "step",
                                             "cross-entropy (nats/byte)", {loss_curve}));
    models::GptImpl* model = engine->whole_model();
    if (!opt.quiet && opt.sample_tokens > 0 && model && opt.model.vocab != 256) {
      // (A plan's model may have another vocabulary: its tokens are not this corpus's bytes.)
      std::fprintf(stderr, "gpt: no text sample: the model's vocabulary has %lld tokens, not the 256 bytes the "
                           "sample decodes\n", (long long)opt.model.vocab);
    } else if (!opt.quiet && opt.sample_tokens > 0 && model) {
      const std::string sample =
          model->generate("And God said", opt.sample_tokens, 0.8, static_cast<uint64_t>(opt.seed));
      std::printf("--- sample (temperature 0.8) ---\nAnd God said%s\n---\n", printable(sample).c_str());
      std::fflush(stdout);
    }
    if (!opt.quiet) {
      std::fprintf(stderr, "gpt: memory per rank%s\n",
                   opt.zero ? (" (ZeRO-" + std::to_string(opt.zero) + ")").c_str() : "");
      for (const auto& line : memory_lines) std::fprintf(stderr, "  %s\n", line.c_str());
    }
    if (opt.predicted_step_s > 0 && step_seconds.size() > 3) {
      // The first steps warm up allocators and caches; the plan predicts the steady state.
      std::vector<double> steady(step_seconds.begin() + 3, step_seconds.end());
      std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
      const double measured = steady[steady.size() / 2];
      std::fprintf(stderr, "gpt: step time measured %.1f ms (median of steps 4..%zu), plan %s predicted %.1f ms (%+.1f%%)\n",
                   measured * 1e3, step_seconds.size(), opt.plan.c_str(), opt.predicted_step_s * 1e3,
                   (opt.predicted_step_s / measured - 1) * 100);
    }
    std::fprintf(stderr,
                 "gpt: wrote %s/metrics.jsonl, trace.json (open in ui.perfetto.dev), timeline.svg, "
                 "loss.svg, run.json%s\n",
                 opt.out.c_str(), opt.pp > 1 ? "; draw the pipeline with: trireme report DIR" : "");
  }
  return 0;
}

}  // namespace trireme::cli
