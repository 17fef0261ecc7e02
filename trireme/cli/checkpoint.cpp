// `trireme checkpoint inspect DIR`: verifies every slice of a checkpoint (manifest, files,
// lengths, CRC-32) and prints what it holds. DIR is one checkpoint (it has manifest.json,
// or its name is a step number and it holds no steps: an incomplete one is reported as
// such) or a checkpoint directory, whose newest good checkpoint is shown (damaged newer
// ones are listed as skipped). Exit 1 with one line when nothing verifies.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>

#include "trireme/cli/commands.h"
#include "trireme/cli/flags.h"
#include "trireme/common/error.h"
#include "trireme/ft/checkpoint.h"

namespace trireme::cli {
namespace {

// Whether `dir` is named as a checkpoint's step (ROOT/<step>, a trailing '/' allowed).
// A directory with steps of its own is a root whatever its name (a SLURM job's
// /scratch/987654 holding 3/manifest.json), see checkpoint_main.
bool named_as_step(const std::string& dir) {
  std::filesystem::path path(dir);
  if (path.filename().empty()) path = path.parent_path();
  const std::string name = path.filename().string();
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

int checkpoint_main(const std::vector<std::string>& args) {
  FlagParser parser("trireme checkpoint inspect DIR");
  const auto rest = parser.parse(args);
  if (parser.help_requested()) {
    std::fputs("usage: trireme checkpoint inspect DIR\n"
               "Verifies a checkpoint (DIR/manifest.json: manifest, file lengths and every slice's CRC-32)\n"
               "and prints its step, the layout and model that wrote it, and its tensors; given a\n"
               "directory of checkpoints, the newest that verifies, naming the damaged ones skipped.\n"
               "A directory named as a step (DIR/200) is one checkpoint, complete or not, unless it\n"
               "holds steps of its own (a root named by a job id, /scratch/987654).\n",
               stdout);
    return 0;
  }
  TRIREME_CHECK(rest.size() == 2 && rest[0] == "inspect",
                "usage: trireme checkpoint inspect DIR (a checkpoint, or a directory of them)");
  const std::string& dir = rest[1];
  TRIREME_CHECK(std::filesystem::is_directory(dir), "checkpoint directory ", dir,
                std::filesystem::exists(dir) ? " is a file, not a directory" : " does not exist",
                "; pass a run's checkpoints/ directory or one of its steps");
  const bool has_steps = !ft::checkpoint_steps(dir).empty();
  if (std::filesystem::exists(dir + "/manifest.json") || (named_as_step(dir) && !has_steps)) {
    const ft::Checkpoint checkpoint = ft::Checkpoint::open(dir, /*verify_data=*/true);
    std::printf("%s  verified: manifest, file lengths and every slice's CRC-32\n", checkpoint.describe().c_str());
    return 0;
  }
  std::vector<std::string> skipped;
  const auto latest = ft::Checkpoint::find_latest(dir, &skipped);
  for (const auto& why : skipped) std::printf("skipped: %s\n", why.c_str());
  if (!latest && skipped.empty() && std::filesystem::is_directory(dir + "/checkpoints"))
    TRIREME_THROW(InvalidArgument, dir, " holds no checkpoint itself: it looks like a run's --out; inspect ", dir,
                  "/checkpoints");
  if (!latest && skipped.empty())
    TRIREME_THROW(InvalidArgument, dir, " holds no checkpoint; pass a run's checkpoints/ directory (e.g. "
                  "runs/mine/checkpoints) or one of its steps");
  if (!latest) TRIREME_THROW(CheckpointCorrupt, "no checkpoint under ", dir, " verifies");
  std::printf("%s  verified: manifest, file lengths and every slice's CRC-32\n", latest->describe().c_str());
  return 0;
}

}  // namespace trireme::cli
