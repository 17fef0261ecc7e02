// `trireme train gpt`: checks every flag it can before any process starts, then launches
// its own ranks through the launcher, each running `trireme __train-worker gpt ARGS` with
// the same arguments (train_worker.cpp).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "trireme/cli/commands.h"
#include "trireme/cli/launch_flags.h"
#include "trireme/cli/train_options.h"
#include "trireme/common/error.h"
#include "trireme/data/corpus.h"
#include "trireme/dist/backend.h"
#include "trireme/ft/checkpoint.h"

namespace trireme::cli {
namespace {

constexpr const char* kTrainHelp =
    "usage: trireme train gpt --nproc-per-node N [--dp D --pp P --schedule S --chunks V]\n"
    "                         [--steps S --batch B --micro-batches M --seq T --layers L\n"
    "                         --dim C --heads H --lr LR --seed SEED --data FILE --out DIR]\n"
    "Trains the reference byte-level GPT on N ranks per node (several nodes: --nnodes,\n"
    "--node-rank, --rdzv): data, tensor (--tp) and pipeline parallel (--pp, schedules gpipe,\n"
    "1f1b, interleaved, zb-h1), writing DIR/metrics.jsonl, trace.json, timeline.tsv,\n"
    "timeline.svg, loss.svg and run.json (draw the pipeline: trireme report DIR), and prints\n"
    "a generated sample at the end when one rank holds the whole model.\n";

// `dir` as the directories it names: absolute, symbolic links and ".." of the part that
// exists resolved, no trailing separator ("" when that fails).
std::filesystem::path resolved(const std::string& dir) {
  std::error_code error;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, error), error);
  if (error) return {};
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// The outermost directory of `dir` (itself or an ancestor) that does not exist yet; "" when
// `dir` exists.
std::filesystem::path first_missing(const std::string& dir) {
  std::filesystem::path missing;
  std::error_code error;
  for (auto p = resolved(dir); !p.empty() && !std::filesystem::exists(p, error) && !error; p = p.parent_path()) {
    missing = p;
    if (p == p.parent_path()) break;
  }
  return missing;
}

// Removes the empty directories from `dir` up to `top` (made by check_output_dir for a run
// that was then refused): a refusal leaves nothing behind.
void remove_empty_dirs(const std::string& dir, const std::filesystem::path& top) {
  if (top.empty()) return;
  std::error_code error;
  for (auto p = resolved(dir); !p.empty(); p = p.parent_path()) {
    if (std::mismatch(top.begin(), top.end(), p.begin(), p.end()).first != top.end()) return;  // not inside `top`
    if (!std::filesystem::is_empty(p, error) || error || !std::filesystem::remove(p, error) || p == top) return;
  }
}

// Before the run starts: `path` can be made where it is needed (a --checkpoint-dir was
// found to be a file at the first checkpoint, a --dump-params without its folder after the
// last step: hours into a run). A directory is made with its missing parents; a file's
// folder must exist.
void check_creatable(const std::string& path, const char* flag, bool directory) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path p = resolved(path);
  TRIREME_CHECK(!p.empty(), flag, " ", path, ": not a usable path; choose another");
  const fs::file_status status = fs::status(p, error);
  if (fs::exists(status)) {
    TRIREME_CHECK(fs::is_directory(status) == directory, flag, " ", path, " is a ",
                  directory ? "file, not a directory" : "directory, not a file", "; choose another path");
    TRIREME_CHECK(::access(p.c_str(), directory ? W_OK | X_OK : W_OK) == 0, flag, " ", path,
                  " is not writable; choose a writable path");
    return;
  }
  fs::path parent = p.parent_path();
  if (directory)
    while (parent != parent.parent_path() && !fs::exists(fs::status(parent, error))) parent = parent.parent_path();
  const fs::file_status up = fs::status(parent, error);
  TRIREME_CHECK(fs::is_directory(up), flag, " ", path, ": ", parent.string(),
                fs::exists(up) ? " is a file, not a directory" : " does not exist", "; choose another path");
  TRIREME_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, flag, " ", path, ": ", parent.string(),
                " is not writable; choose a writable path");
}

void check_output_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  TRIREME_CHECK(!error, "--out ", dir, ": cannot create the directory (", error.message(),
                "); choose a writable path");
  const auto probe = std::filesystem::path(dir) / ".trireme-write-test";
  FILE* f = std::fopen(probe.c_str(), "w");
  TRIREME_CHECK(f, "--out ", dir, ": directory is not writable; choose a writable path");
  std::fclose(f);
  std::filesystem::remove(probe, error);
}

// A model far too large for this machine is refused here, in one line, rather than by the
// allocator (or the kernel's OOM killer) in every worker. The bound is a floor: each
// process builds its tensor-parallel share of the whole model in float32 on the host (a
// pipeline stage keeps only its layers afterwards; gradients and AdamW's moments come on
// top), and --nproc-per-node of them share the machine's memory.
void check_host_memory(const TrainOptions& opt, int local_processes) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return;  // unknown: the allocator will say
  const double memory = static_cast<double>(pages) * static_cast<double>(page_bytes);
  const double parameters = static_cast<double>(opt.model.num_parameters());
  const double needed = parameters / opt.tp * 4.0 * local_processes;
  if (needed <= memory) return;
  char line[320];
  std::snprintf(line, sizeof(line),
                "the model has %.3g parameters: its float32 weights%s take %.3g GiB in each of the %d processes "
                "on this machine, %.3g GiB in all, more than its %.3g GiB of memory; choose a smaller model "
                "(--layers, --dim, --seq)%s",
                parameters, opt.tp > 1 ? " (a --tp share)" : "", parameters / opt.tp * 4.0 / (1 << 30),
                local_processes, needed / (1 << 30), memory / (1 << 30),
                local_processes > 1 ? ", fewer --nproc-per-node or a larger --tp" : " or a larger --tp");
  TRIREME_THROW(InvalidArgument, line);
}

// Node 0, as it founds the job (LaunchOptions::before_founding: a node joining a running
// job, node 0's replacement under an external store too, sees that very job's files):
// - A run that does not --resume must not start among an earlier run's checkpoints: a
//   restart falling back to disk, or a later --resume, would load that run's newest one,
//   and retention (which keeps the newest) would delete this run's.
// - Nor in an --out that holds an earlier run's metrics or layout: it would write over
//   them (before 2026-12-07 it did, silently).
// - A run that does --resume cannot be past --steps (it trained nothing and wrote empty
//   traces over the run's own; resumed at --steps itself it loads the state, dumps it with
//   --dump-params, and leaves the run's files alone).
void check_earlier_run(const TrainOptions& opt) {
  int64_t newest = -1;
  for (int64_t step : ft::checkpoint_steps(opt.checkpoint_dir))
    if (std::filesystem::exists(opt.checkpoint_dir + "/" + std::to_string(step) + "/manifest.json"))
      newest = std::max(newest, step);
  std::string earlier;  // the first of an earlier run's files in --out, "" when none
  for (const char* file : {"metrics.jsonl", "run.json"})
    if (earlier.empty() && std::filesystem::exists(opt.out + "/" + file)) earlier = file;
  if (opt.resume) {
    TRIREME_CHECK(newest <= opt.steps, "the newest checkpoint in ", opt.checkpoint_dir, " is of step ", newest,
                  ", past --steps ", opt.steps, "; raise --steps to train on (--steps ", newest,
                  " loads it without training)");
    TRIREME_CHECK(newest >= 0 || earlier.empty(), opt.out, " holds an earlier run (", earlier,
                  ") but no checkpoint to resume it from; give another --out, or remove ", opt.out, " to start over");
    return;
  }
  TRIREME_CHECK(newest < 0, opt.checkpoint_dir, " already holds an earlier run's checkpoints (newest: step ", newest,
                "); pass --resume to continue that run, or give another --out");
  TRIREME_CHECK(earlier.empty(), opt.out, " holds an earlier run (", earlier, "); give another --out, or remove ",
                opt.out, " to start over");
}

}  // namespace

int train_main(const std::vector<std::string>& args) {
  TrainOptions opt;
  LaunchFlags launch_flags;
  FlagParser parser("trireme train");
  add_launch_flags(parser, &launch_flags);
  add_train_flags(parser, &opt);
  const auto positional = parser.parse(args);
  if (parser.help_requested()) {
    std::fputs(kTrainHelp, stdout);
    std::fputs(parser.usage().c_str(), stdout);
    return 0;
  }
  TRIREME_CHECK(!positional.empty(), "name the model to train: trireme train gpt ...");
  TRIREME_CHECK(positional[0] == "gpt", "unknown model '", positional[0], "'; the available model is: gpt");
  TRIREME_CHECK(positional.size() == 1, "unexpected argument '", positional[1], "' after 'trireme train gpt'; ",
                positional[1].rfind('-', 0) == 0 ? "flags start with two dashes, e.g. --nproc-per-node 2; "
                                                 : "flags take the form --name VALUE; ",
                "run 'trireme train --help' for the flags");

  std::vector<std::string> command = {self_executable(), "__train-worker"};
  command.insert(command.end(), args.begin(), args.end());
  if (launch_flags.standby < 0) launch_flags.standby = 1;  // its worker awaits activation in main()
  launch::LaunchOptions launch_options = finish_launch_flags(launch_flags, command);

  // (finish_launch_flags bounds both, so the product, taken in 64 bits, fits an int.)
  const int world_size = static_cast<int>(int64_t{launch_options.nproc_per_node} * launch_options.nnodes);
  if (launch::elastic(launch_options)) {
    // Every size the job may shrink to must run: tp and pp stay, dp follows the nodes.
    TRIREME_CHECK(opt.plan.empty(), "--plan fixes the layout for one size; an elastic job (--nnodes MIN:MAX) "
                  "chooses dp per generation: drop --plan or give --nnodes N");
    TRIREME_CHECK(opt.dp == 0, "--dp is chosen per generation in an elastic job (--nnodes MIN:MAX); drop --dp");
    TRIREME_CHECK(opt.snapshot_share != 1, "--snapshot-share 1 cannot be used in an elastic job (--nnodes MIN:MAX), "
                  "which restores from whole replicas; leave it out");
    for (int nodes = launch::min_nodes(launch_options); nodes < launch_options.nnodes; ++nodes) {
      TrainOptions at = opt;
      drop_replica_batches_for(&at, launch_options.nproc_per_node * nodes);  // as the worker will
      try {
        validate_train_options(&at, launch_options.nproc_per_node * nodes);
      } catch (const InvalidArgument& e) {
        TRIREME_THROW(InvalidArgument, "with ", nodes, " of --nnodes ", launch::min_nodes(launch_options), ":",
                      launch_options.nnodes, " nodes left: ", e.what());
      }
    }
  }
  validate_train_options(&opt, world_size);
  check_host_memory(opt, launch_options.nproc_per_node);
  const data::Corpus corpus =
      data::Corpus::load(opt.data.empty() ? data::default_corpus_path() : opt.data);
  corpus.require_length(opt.model.seq_len);
  if (opt.device == "cuda") dist::require_cuda_devices(launch_options.nproc_per_node);
  if (launch_options.node_rank == 0) launch_options.before_founding = [&opt] { check_earlier_run(opt); };
  // After every refusal made here, so that these leave no directory; the refusal of a fresh
  // run among earlier checkpoints (before_founding) comes later, inside launch().
  // (Every rank writes its checkpoint shards; rank 0 the dump, on node 0 unless an elastic
  // job renumbered it, after --out is made: a dump inside a new --out is fine.)
  if (opt.checkpoint_every > 0) check_creatable(opt.checkpoint_dir, "--checkpoint-dir", /*directory=*/true);
  const std::filesystem::path made = first_missing(opt.out);
  check_output_dir(opt.out);
  if (!opt.dump_params.empty() && (launch_options.node_rank == 0 || launch::elastic(launch_options))) {
    try {
      check_creatable(opt.dump_params, "--dump-params", /*directory=*/false);
    } catch (const Error&) {
      remove_empty_dirs(opt.out, made);
      throw;
    }
  }

  launch::LaunchResult result;
  try {
    result = launch::launch(launch_options);
  } catch (const Error&) {  // refused (before_founding, the rendezvous): no empty --out left
    remove_empty_dirs(opt.out, made);
    throw;
  }
  if (result.exit_code != 0) remove_empty_dirs(opt.out, made);
  if (!result.failure.empty()) std::fprintf(stderr, "trireme train: %s\n", result.failure.c_str());
  return result.exit_code;
}

}  // namespace trireme::cli
