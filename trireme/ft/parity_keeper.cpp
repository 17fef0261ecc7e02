// ParityKeeper: protection rounds on a background thread, and the rebuild of lost
// machines' protected copies on the survivors; see parity_keeper.h.
#include "trireme/ft/parity_keeper.h"

#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>

#include "trireme/common/error.h"
#include "trireme/dist/backend.h"
#include "trireme/ft/checkpoint.h"
#include "trireme/ft/parity_exchange.h"
#include "trireme/ft/protected_blob.h"
#include "trireme/ft/redundancy.h"
#include "trireme/ft/snapshot.h"
#include "trireme/obs/clock.h"

namespace trireme::ft {

namespace fs = std::filesystem;
using launch::KeeperGeneration;
using launch::KeeperRecovery;

// Snapshot data files held against reuse by a shared flock(2) each (ft/snapshot.h, "Lent
// slots"): a worker reuses a slot only once it has the file's exclusive lock. Closing the
// descriptors hands the slots back.
class HeldFiles {
 public:
  HeldFiles() = default;
  HeldFiles(HeldFiles&& other) noexcept : fds_(std::move(other.fds_)) { other.fds_.clear(); }
  HeldFiles& operator=(HeldFiles&& other) noexcept {
    if (this != &other) {
      release();
      fds_ = std::move(other.fds_);
      other.fds_.clear();
    }
    return *this;
  }
  HeldFiles(const HeldFiles&) = delete;
  HeldFiles& operator=(const HeldFiles&) = delete;
  ~HeldFiles() { release(); }

  // Takes ownership of `fd`, locked.
  void add(int fd) { fds_.push_back(fd); }
  // Takes over `other`'s descriptors.
  void add(HeldFiles&& other) {
    fds_.insert(fds_.end(), other.fds_.begin(), other.fds_.end());
    other.fds_.clear();
  }
  void release() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }

 private:
  std::vector<int> fds_;
};

struct ParityKeeper::Committed {
  int64_t step = 0;
  std::vector<int> members;        // the generation whose plan `held` follows ({}: none)
  std::vector<std::string> files;  // the blob's files, relative to AREA/protected/<step>/
  std::set<std::string> replicated;  // keys of the slices left out of the blob (protected_blob.h)
  ParityHeld held;
  HeldFiles files_held;  // the workers' data files linked under AREA/protected/<step>/
};

namespace {

// The plan for a generation of `machines`: K+M, or, once the job has shrunk below K + M
// machines, (machines - M)+M: still any M losses, with fewer data machines per codeword
// (more parity memory each). Throws InvalidArgument when there are M machines or fewer.
RedundancyPlan plan_for(int machines, int k, int m) {
  return RedundancyPlan::make(machines, machines >= k + m ? k : machines - m, m);
}

// Gloo's limit on every operation of the keeper's groups, and the store's: how long stop()
// and recover() can wait on a machine that vanished without closing its connections.
constexpr std::chrono::seconds kGroupTimeout{30};
// How often a round looks for a new snapshot step or at the other machines' readiness,
// and so how soon it sees the stop flag there.
constexpr std::chrono::milliseconds kPoll{25};
// How often a round held back by the CPU share looks for a flush on another machine (its
// own stop and flush wake it at once): a store round trip each time, which counts in the
// share, and a flush is for a preemption notice of tens of seconds.
constexpr std::chrono::milliseconds kHeldBackPoll{1000};
// The files of a one-rank snapshot (ft/snapshot.h), the manifest last as its writer does:
// a rebuild cut short leaves a directory without a manifest, never a manifest over
// missing data.
constexpr const char* kSnapshotFiles[] = {"data.bin", "manifest.json"};

std::string rank_name(int rank) { return "rank-" + std::to_string(rank); }
std::string protected_root(const std::string& area) { return area + "/protected"; }

std::string joined(const std::vector<int>& values, const char* separator) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? separator : "") << values[i];
  return out.str();
}

std::string size_text(uint64_t bytes) {
  char text[32];
  if (bytes < (1u << 20))
    std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / (1 << 10));
  else
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// The newest step every local rank has a complete snapshot of; 0 when there is none (or
// the area changed under the look: the next look decides). With `listed_only`, from
// directory listings and the manifests' presence alone (a snapshot's manifest is its last
// file): cheap enough to look often, and never older than the full answer.
int64_t newest_common_step(const KeeperGeneration& g, bool listed_only) {
  if (g.local_ranks.empty()) return 0;
  std::vector<int64_t> common;
  try {
    for (size_t i = 0; i < g.local_ranks.size(); ++i) {
      const std::string dir = g.area + "/" + rank_name(g.local_ranks[i]);
      std::vector<int64_t> steps;
      if (listed_only) {
        for (int64_t step : checkpoint_steps(dir))
          if (fs::exists(dir + "/" + std::to_string(step) + "/manifest.json")) steps.push_back(step);
      } else {
        steps = Snapshotter::complete_steps(dir);
      }
      std::sort(steps.begin(), steps.end());
      if (i == 0) {
        common = std::move(steps);
        continue;
      }
      std::vector<int64_t> both;
      std::set_intersection(common.begin(), common.end(), steps.begin(), steps.end(), std::back_inserter(both));
      common = std::move(both);
    }
  } catch (const std::exception&) {
    return 0;  // a snapshot was being replaced while it was looked at
  }
  return common.empty() ? 0 : common.back();
}

// A file's identity and version: a rewritten file (a new inode by rename) or a changed one
// differs.
struct FileStamp {
  dev_t device = 0;
  ino_t inode = 0;
  int64_t mtime_ns = 0, ctime_ns = 0, bytes = 0;
  bool operator==(const FileStamp& o) const {
    return device == o.device && inode == o.inode && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns &&
           bytes == o.bytes;
  }
};

std::optional<FileStamp> stamp(const std::string& path) {
  struct stat s {};
  if (::stat(path.c_str(), &s) != 0) return std::nullopt;
  const auto ns = [](const timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; };
  return FileStamp{s.st_dev, s.st_ino, ns(s.st_mtim), ns(s.st_ctim), static_cast<int64_t>(s.st_size)};
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Takes the snapshot directory `from` (of step `step`) into the round's directory `to`
// without copying its data: a shared flock on its data file, which keeps the worker from
// reusing that slot (ft/snapshot.h, "Lent slots"), then a hard link to the file and a copy
// of the manifest. "" when it is whole, and the locked descriptor is added to `held`; else
// why not. A worker takes a slot's exclusive lock, removes the manifest and renames the
// directory before it writes a byte of the slot, so once the lock is held here the
// snapshot is whole exactly when the manifest is still there, unchanged, and the
// directory still names the locked file: checked by the manifest's identity (inode, times,
// size) and bytes (an inode can be reused where the area is not on tmpfs) before and
// after the link. (Its CRCs are checked where it is read: when the workers resume from it
// or a rebuild writes it.) `between` runs between the link and that check (a test seam).
// Where the area's file system refuses links, the data is copied, under the lock, which is
// then let go.
std::string hold_snapshot(const std::string& from, const std::string& to, int64_t step,
                          const std::function<void(const std::string&)>& between, HeldFiles& held) {
  try {
    const std::string manifest = from + "/manifest.json", data = from + "/data.bin";
    const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return from + ": no longer complete";
    HeldFiles file;
    file.add(fd);
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0) return from + ": its slot is being reused";
    const std::optional<FileStamp> before = stamp(manifest);
    const std::string text = file_text(manifest);
    struct stat locked {}, named {};
    if (!before || ::fstat(fd, &locked) != 0 || ::stat(data.c_str(), &named) != 0 || locked.st_ino != named.st_ino ||
        locked.st_dev != named.st_dev)
      return from + ": no longer complete";
    fs::create_directories(to);
    bool linked = ::link(data.c_str(), (to + "/data.bin").c_str()) == 0;
    if (!linked) {
      if (errno != EXDEV && errno != EPERM && errno != EMLINK) return data + ": " + std::strerror(errno);
      fs::copy_file(data, to + "/data.bin", fs::copy_options::overwrite_existing);
    }
    fs::copy_file(manifest, to + "/manifest.json", fs::copy_options::overwrite_existing);
    if (between) between(from);
    const std::optional<FileStamp> after = stamp(manifest);
    if (!after || !(*after == *before) || file_text(to + "/manifest.json") != text)
      return from + ": replaced while it was taken";
    const Checkpoint copy = Checkpoint::open(to, /*verify_data=*/false);
    if (copy.step() != step) return to + ": holds step " + std::to_string(copy.step());
    if (linked) held.add(std::move(file));  // a copy needs the worker's file no longer
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// A set of slice keys as one store value, and back (keys hold no newline).
std::vector<uint8_t> joined_keys(const std::set<std::string>& keys) {
  std::vector<uint8_t> out;
  for (const std::string& key : keys) {
    out.insert(out.end(), key.begin(), key.end());
    out.push_back('\n');
  }
  return out;
}

std::set<std::string> split_keys(const std::vector<uint8_t>& bytes) {
  std::set<std::string> keys;
  std::string key;
  for (uint8_t c : bytes) {
    if (c != '\n') {
      key += static_cast<char>(c);
      continue;
    }
    keys.insert(std::move(key));
    key.clear();
  }
  return keys;
}

// CPU time of the calling thread, ms.
double thread_cpu_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// A client of the rendezvous store, its keys under `prefix`.
dist::Store connect_store(const KeeperGeneration& g, const std::string& prefix) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(g.store_port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = kGroupTimeout;
  dist::Store client;
  try {
    client = c10::make_intrusive<c10d::TCPStore>(g.store_host, options);
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, "snapshot redundancy cannot reach the rendezvous store at ", g.store_host, ":",
                  g.store_port, ": ", dist::error_text(e));
  }
  return c10::make_intrusive<c10d::PrefixStore>(prefix, client);
}

dist::Group agents_group(const dist::Store& store, int rank, int size) {
  dist::GroupOptions options;
  options.timeout = kGroupTimeout;
  options.spans_machines = size > 1;  // one keeper per machine: never bind loopback
  return dist::create_gloo_group(store, rank, size, options);
}

// The minimum of every machine's `value` for `key`, through the store: each machine puts
// its own under KEY/<position>, waits for the others' and takes the minimum. nullopt when
// stop_ is set meanwhile. Through the store rather than a Gloo all-reduce, so that a
// machine that stops leaves the others waiting only until their own stop (a recv posted
// on a pair whose peer already went away waits out the group's timeout).
// `binding`: the others act on this machine's key once they see all of them (they go on to
// the exchange, or commit), so a stop does not end the wait at once: it waits up to
// kBindingGrace more for the rest (a peer starved by its workers posts as soon as the
// restart stops them). Leaving at once, a machine could keep the older step while the
// others committed the new one (and then the survivors disagree and fall back to disk),
// or leave a peer's exchange waiting out the group's time-out.
constexpr auto kBindingGrace = std::chrono::seconds(5);

std::optional<int64_t> store_min(c10d::Store& store, const std::string& key, int position, int machines,
                                 int64_t value, const std::atomic<bool>& stop, bool binding = false) {
  const std::string text = std::to_string(value);
  store.set(key + "/" + std::to_string(position), std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<std::string> keys;
  for (int p = 0; p < machines; ++p) keys.push_back(key + "/" + std::to_string(p));
  std::optional<std::chrono::steady_clock::time_point> give_up;
  while (!store.check(keys)) {
    if (stop && !binding) return std::nullopt;
    if (stop && !give_up) give_up = std::chrono::steady_clock::now() + kBindingGrace;
    if (give_up && std::chrono::steady_clock::now() > *give_up) return std::nullopt;
    std::this_thread::sleep_for(kPoll);
  }
  int64_t least = value;
  for (const std::string& k : keys) {
    const std::vector<uint8_t> bytes = store.get(k);
    least = std::min<int64_t>(least, std::stoll(std::string(bytes.begin(), bytes.end())));
  }
  return least;
}

// The element-wise minimum over the group.
std::vector<int64_t> all_min(const dist::Group& group, const std::vector<int64_t>& values, const char* what) {
  const at::Tensor t = dist::all_reduce(group, at::tensor(values, at::kLong), c10d::ReduceOp::MIN, at::kCPU, what);
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

// Removes a round's copy unless it was committed.
struct RoundCopy {
  std::string path;
  bool committed = false;
  ~RoundCopy() {
    std::error_code ignored;
    if (!committed) fs::remove_all(path, ignored);
  }
};

}  // namespace

ParityKeeper::ParityKeeper(int k, int m, double cpu_share, std::function<void(const std::string&)> after_copy)
    : k_(k), m_(m), cpu_share_(cpu_share), after_copy_(std::move(after_copy)) {
  TRIREME_CHECK(k >= 1 && m >= 0, "--redundancy needs K >= 1 and M >= 0, got ", k, "+", m);
}

ParityKeeper::~ParityKeeper() { stop(); }

void ParityKeeper::start(const KeeperGeneration& g) {
  stop();
  stop_ = false;
  hurry_ = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.error.clear();
  }
  // After recover(), the steps already in the rank directories are the previous
  // generation's: this generation's workers resume from an older step (what recover()
  // rebuilt) and write those steps again. Protecting one of them would remove the
  // rebuilt step while the workers may still read it; start above them.
  floor_ = recovered_ ? newest_common_step(g, /*listed_only=*/false) : 0;
  current_ = g;
  recovered_ = false;
  thread_ = std::thread([this, g] { run(g); });
}

void ParityKeeper::stop() {
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t ParityKeeper::protected_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.protected_step;
}

KeeperStats ParityKeeper::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

bool ParityKeeper::flush(double timeout_s) {
  if (!thread_.joinable()) return false;
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    hurry_ = true;
  }
  wake_.notify_all();
  const int64_t target = newest_common_step(current_, /*listed_only=*/false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stats_.protected_step >= target) return true;
      if (!stats_.error.empty()) return false;
    }
    std::this_thread::sleep_for(kPoll);
  }
  return false;
}

std::string ParityKeeper::summary() const {
  const KeeperStats s = stats();
  if (s.rounds == 0 && s.skipped == 0) return "";
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  char line[400];
  std::snprintf(line, sizeof line,
                "snapshot redundancy: %d round%s protected (newest step %lld, %d skipped); median copy %.1f ms, "
                "exchange %.1f ms, CPU %.1f ms per round; this machine holds a %.2f MiB copy and %.2f MiB of parity "
                "(%.2f MiB of the copy is on every machine of its group, so not coded)",
                s.rounds, s.rounds == 1 ? "" : "s", static_cast<long long>(s.protected_step), s.skipped,
                median(s.round_copy_ms), median(s.round_exchange_ms), median(s.round_cpu_ms), s.copy_bytes / 1048576.0,
                s.parity_bytes / 1048576.0, s.replicated_bytes / 1048576.0);
  return s.error.empty() ? std::string(line) : line + ("; protection stopped: " + s.error);
}

void ParityKeeper::run(const KeeperGeneration& g) {
  const sched_param none{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);  // best effort
  const auto fail = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.error = why;
  };
  const int machines = static_cast<int>(g.members.size());
  RedundancyPlan plan;
  try {
    plan = plan_for(machines, k_, m_);
  } catch (const InvalidArgument&) {
    const std::string why = "--redundancy " + std::to_string(k_) + "+" + std::to_string(m_) + " needs more than " +
                            std::to_string(m_) + " machines; generation " + std::to_string(g.generation) +
                            " has " + std::to_string(machines) + ", so its snapshots are not protected";
    fail(why);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!warned_) std::fprintf(stderr, "trireme run: %s\n", why.c_str());
    warned_ = true;
    return;
  }
  try {
    const std::string root = protected_root(g.area);
    fs::create_directories(root);
    for (const auto& entry : fs::directory_iterator(root))  // copies of rounds cut short earlier
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path());
    const dist::Store store = connect_store(g, "trireme/keeper/" + std::to_string(g.generation));
    const dist::Group group =
        agents_group(c10::make_intrusive<c10d::PrefixStore>("group", store), g.position, machines);

    // Only steps newer than any protected before: a protected step may be in use (the
    // workers of this generation resuming from what recover() rebuilt there).
    int64_t tried = std::max(protected_step(), floor_);
    // The CPU share: this thread's CPU time since its set-up, over the share, is the
    // earliest wall time of the next round (the first goes at once). A flush (here or, through the store, on another
    // machine: a machine leaving on a preemption notice) lifts it for the generation.
    const double start_us = obs::now_us(), start_cpu_ms = thread_cpu_ms();
    bool hurried = false;
    // How long the share still holds round `round` back, in microseconds (0: not).
    const auto held_back_us = [&](int round) -> double {
      if (cpu_share_ <= 0 || hurried || round == 0) return 0;
      if (hurry_) {
        store->set("hurry", std::vector<uint8_t>{'1'});
        hurried = true;
        return 0;
      }
      const double left = start_us + (thread_cpu_ms() - start_cpu_ms) * 1e3 / cpu_share_ - obs::now_us();
      if (left <= 0) return 0;
      hurried = store->check({"hurry"});
      return hurried ? 0 : left;
    };
    for (int round = 0;; ++round) {
      // 1. The round's turn (held back: sleep in long slices, so that waiting costs little
      // of the share), then a newer step here.
      int64_t newest = 0;
      while (true) {
        if (stop_) return;
        if (const double held = held_back_us(round); held > 0) {
          if (const int64_t seen = newest_common_step(g, /*listed_only=*/true); seen > tried) {
            std::lock_guard<std::mutex> lock(mutex_);
            stats_.held_back_step = seen;
          }
          std::unique_lock<std::mutex> lock(wake_mutex_);
          wake_.wait_for(lock,
                         std::min<std::chrono::microseconds>(std::chrono::microseconds(static_cast<int64_t>(held)),
                                                             kHeldBackPoll),
                         [&] { return stop_ || hurry_; });
          continue;
        }
        if (newest_common_step(g, /*listed_only=*/true) > tried &&
            (newest = newest_common_step(g, /*listed_only=*/false)) > tried)
          break;
        std::this_thread::sleep_for(kPoll);
      }
      // 2. The round's step: the oldest of the machines' newest, each read once every
      // machine has come to the round. (Read before, a machine's newest is as old as its
      // wait for the others, whose CPU shares let them start later: its workers may have
      // reused that step's slot meanwhile, and the round would fail there.)
      // The keys of round - 2 are read by everyone: every machine has posted round - 1's.
      for (const char* what : {"arrived/", "ready/", "verified/", "keys/", "exchanged/"})
        store->deleteKey(what + std::to_string(round - 2) + "/" + std::to_string(g.position));
      if (!store_min(*store, "arrived/" + std::to_string(round), g.position, machines, 1, stop_)) return;
      newest = std::max(newest, newest_common_step(g, /*listed_only=*/false));
      const auto agreed = store_min(*store, "ready/" + std::to_string(round), g.position, machines, newest, stop_);
      if (!agreed) return;
      const int64_t step = *agreed;
      // 3. Copy, and the keys of the copy's slices.
      if (stop_) return;
      const double copy_start = obs::now_us(), cpu_start = thread_cpu_ms();
      RoundCopy copy{root + "/.tmp-" + std::to_string(step)};
      fs::remove_all(copy.path);
      bool copied = step > tried;  // never over a protected step (see above)
      HeldFiles files_held;
      std::vector<std::string> files;
      for (int rank : g.local_ranks) {
        if (!copied) break;
        const std::string from = g.area + "/" + rank_name(rank) + "/" + std::to_string(step);
        copied = hold_snapshot(from, copy.path + "/" + rank_name(rank), step, after_copy_, files_held).empty();
        for (const char* name : kSnapshotFiles) files.push_back(rank_name(rank) + "/" + name);
      }
      std::set<std::string> keys;
      if (copied) {
        try {
          keys = slice_keys(copy.path, files);
        } catch (const std::exception&) {
          copied = false;
        }
      }
      const double copy_ms = (obs::now_us() - copy_start) / 1e3;
      // 4. Every machine's copy whole, or the round is dropped everywhere. With the
      // agreement, each machine's keys: the slices every machine of a redundancy group
      // holds are left out of its coding (ft/protected_blob.h).
      store->set("keys/" + std::to_string(round) + "/" + std::to_string(g.position), joined_keys(keys));
      const auto verified =
          store_min(*store, "verified/" + std::to_string(round), g.position, machines, copied, stop_, /*binding=*/true);
      if (!verified) return;
      copied = *verified == 1;
      tried = step;
      if (!copied) {
        fs::remove_all(copy.path);
        files_held.release();
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.skipped;
        continue;
      }
      // 5. Parity. Every machine has agreed to it: none leaves now (a stop waits for the
      // exchange), since a peer's recv posted after this machine's group went away would
      // wait out the group's timeout instead of failing.
      const double exchange_start = obs::now_us();
      for (int other : plan.group_of(g.position).machines) {
        if (other == g.position) continue;
        const std::set<std::string> theirs =
            split_keys(store->get("keys/" + std::to_string(round) + "/" + std::to_string(other)));
        std::set<std::string> both;
        std::set_intersection(keys.begin(), keys.end(), theirs.begin(), theirs.end(),
                              std::inserter(both, both.end()));
        keys = std::move(both);
      }
      uint64_t copy_bytes = 0, replicated_bytes = 0;
      for (const std::string& file : files) copy_bytes += fs::file_size(copy.path + "/" + file);
      ParityHeld held;
      {
        const std::vector<uint8_t> blob = serialize_blob(copy.path, files, keys, &replicated_bytes);
        held = exchange_parity(plan, g.position, blob.data(), blob.size(), group);
      }
      // 6. Commit once every machine has its parity.
      if (!store_min(*store, "exchanged/" + std::to_string(round), g.position, machines, 1, stop_, /*binding=*/true))
        return;
      const double exchange_ms = (obs::now_us() - exchange_start) / 1e3;
      // The new step's files are held by `state` before its directory is renamed into
      // place, and the older step's are let go only once no directory names them (a held
      // file let go is the workers' to rewrite).
      uint64_t parity_bytes = 0;
      for (const auto& [where, block] : held.parity) parity_bytes += block.size();
      auto state = std::make_unique<Committed>();
      *state = {step, g.members, std::move(files), std::move(keys), std::move(held), std::move(files_held)};
      const std::string target = root + "/" + std::to_string(step);
      fs::remove_all(target);
      fs::rename(copy.path, target);
      copy.committed = true;
      std::unique_ptr<Committed> older_state;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        older_state = std::move(committed_);
        committed_ = std::move(state);
      }
      std::error_code not_removed;
      for (const auto& entry : fs::directory_iterator(root, not_removed)) {
        const std::string name = entry.path().filename().string();
        const bool a_step = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (a_step && name != std::to_string(step)) fs::remove_all(entry.path(), not_removed);
        if (not_removed) break;
      }
      if (not_removed) (void)older_state.release();  // still named: its files stay held for good
      older_state.reset();
      const double cpu_ms = thread_cpu_ms() - cpu_start;
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.rounds;
      stats_.protected_step = step;
      stats_.round_copy_ms.push_back(copy_ms);
      stats_.round_exchange_ms.push_back(exchange_ms);
      stats_.round_cpu_ms.push_back(cpu_ms);
      stats_.copy_bytes = copy_bytes;
      stats_.replicated_bytes = replicated_bytes;
      stats_.parity_bytes = parity_bytes;
    }
  } catch (const std::exception& e) {
    fail(dist::error_text(e));
  }
}

KeeperRecovery ParityKeeper::recover(const KeeperGeneration& previous, const KeeperGeneration& next) {
  recovered_ = true;
  try {
    return recover_or_throw(previous, next);
  } catch (const std::exception& e) {
    return {0, false, "snapshot redundancy: recovery failed: " + dist::error_text(e)};
  }
}

KeeperRecovery ParityKeeper::recover_or_throw(const KeeperGeneration& previous, const KeeperGeneration& next) {
  stop();
  const int machines = static_cast<int>(previous.members.size());
  TRIREME_CHECK(previous.position >= 0 && previous.position < machines, "position ", previous.position,
                " is not a machine of generation ", previous.generation);
  // Machines are indices into previous.members; ranks, indices among the survivors.
  std::vector<int> rank_of_machine(static_cast<size_t>(machines), -1), lost, lost_nodes;
  int survivors = 0;
  for (int machine = 0; machine < machines; ++machine) {
    const int node = previous.members[static_cast<size_t>(machine)];
    if (std::find(next.members.begin(), next.members.end(), node) != next.members.end()) {
      rank_of_machine[static_cast<size_t>(machine)] = survivors++;
    } else {
      lost.push_back(machine);
      lost_nodes.push_back(node);
    }
  }
  const int me = previous.position;
  TRIREME_CHECK(rank_of_machine[static_cast<size_t>(me)] >= 0, "node ", previous.members[static_cast<size_t>(me)],
                " is not in generation ", next.generation, ": only survivors recover");
  const Committed* state = committed_ && committed_->members == previous.members ? committed_.get() : nullptr;
  std::string stopped;  // why this machine's protection had stopped, if it had
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stats_.error.empty()) stopped = "; protection here had stopped: " + stats_.error;
  }

  const dist::Store store = connect_store(next, "trireme/keeper/" + std::to_string(next.generation) + "/recover");
  const dist::Group group = agents_group(store, rank_of_machine[static_cast<size_t>(me)], survivors);
  const int64_t mine = state ? state->step : 0;
  const std::vector<int64_t> agreed = all_min(group, {mine, -mine}, "snapshot redundancy: protected step");
  const int64_t step = agreed[0] == -agreed[1] ? agreed[0] : 0;
  const std::string step_text = std::to_string(step);
  const std::string nodes_text = "node" + std::string(lost_nodes.size() > 1 ? "s " : " ") + joined(lost_nodes, ", ");
  const std::string redundancy = "--redundancy " + std::to_string(k_) + "+" + std::to_string(m_);

  // Free the parity once it no longer matches the job's machines; the step stays, so that
  // later rounds do not protect over it.
  struct ReleaseParity {
    ParityKeeper& keeper;
    bool release;
    ~ReleaseParity() {
      if (!release) return;
      std::lock_guard<std::mutex> lock(keeper.mutex_);
      if (keeper.committed_) {
        keeper.committed_->members.clear();
        keeper.committed_->held = ParityHeld{};
      }
      keeper.stats_.parity_bytes = 0;
    }
  } release{*this, next.members != previous.members};

  if (lost.empty())
    return {step, true,
            "snapshot redundancy: no machine lost; " +
                (step ? "step " + step_text + " stays protected" : std::string("no step was protected"))};
  if (step == 0) {
    const std::string why = agreed[0] == -agreed[1]
                                ? "no snapshot step had been protected"
                                : "the survivors had protected different steps (" + std::to_string(agreed[0]) +
                                      " to " + std::to_string(-agreed[1]) + ")";
    return {0, false, "snapshot redundancy: lost " + nodes_text + ", but " + why + stopped};
  }
  if (m_ == 0)
    return {step, false,
            "snapshot redundancy: lost " + nodes_text + "; " + redundancy +
                " keeps no parity, so their snapshots cannot be rebuilt from memory"};
  const RedundancyPlan plan = plan_for(machines, k_, m_);
  for (const RedundancyGroup& g : plan.groups) {
    if (g.recoverable(lost)) continue;
    std::vector<int> here;
    for (int machine : g.machines)
      if (std::find(lost.begin(), lost.end(), machine) != lost.end())
        here.push_back(previous.members[static_cast<size_t>(machine)]);
    return {step, false,
            "snapshot redundancy: lost " + std::to_string(here.size()) + " machines (node ids " + joined(here, ", ") +
                ") of one redundancy group; " + redundancy + " tolerates " + std::to_string(m_) +
                " per group: their snapshots cannot be rebuilt from memory"};
  }

  // Every survivor of a group that lost machines gives its blob, re-read from its copy.
  const std::string root = protected_root(previous.area) + "/" + step_text;
  const RedundancyGroup& mine_group = plan.group_of(me);
  const bool affected = std::any_of(mine_group.machines.begin(), mine_group.machines.end(), [&](int machine) {
    return std::find(lost.begin(), lost.end(), machine) != lost.end();
  });
  std::vector<uint8_t> blob;
  std::string unreadable;
  if (affected) {
    try {
      blob = serialize_blob(root, state->files, state->replicated);
      if (blob.size() != state->held.sizes.at(me))
        unreadable = root + " is not what was protected (" + std::to_string(blob.size()) + " bytes, " +
                     std::to_string(state->held.sizes.at(me)) + " exchanged)";
    } catch (const std::exception& e) {
      unreadable = e.what();
    }
  }
  if (all_min(group, {unreadable.empty() ? 1 : 0}, "snapshot redundancy: copies readable")[0] == 0)
    return {step, false,
            "snapshot redundancy: lost " + nodes_text + ", but a survivor could not read back its copy of step " +
                step_text + (unreadable.empty() ? std::string() : " (" + unreadable + ")")};

  const double start = obs::now_us();
  std::map<int, std::vector<uint8_t>> rebuilt =
      rebuild_lost(plan, me, lost, blob.data(), state->held, group, rank_of_machine);
  blob = {};
  std::vector<std::string> done;
  std::string failure;
  HoleFill fill;  // the replicated slices, from this machine's own copy
  for (auto& [machine, bytes] : rebuilt) {
    const std::string node = "node " + std::to_string(previous.members[static_cast<size_t>(machine)]);
    std::vector<std::string> dirs;
    try {
      if (!fill) fill = fill_from(root, state->files);
      std::vector<int> ranks;
      uint64_t written = 0;
      dirs = write_blob(bytes, root, fill);
      for (const std::string& dir : dirs) {
        const Checkpoint copy = Checkpoint::open(root + "/" + dir, /*verify_data=*/true);
        TRIREME_CHECK(copy.step() == step, root, "/", dir, " holds step ", copy.step());
        ranks.push_back(copy.layout().rank >= 0 ? copy.layout().rank : std::stoi(dir.substr(dir.find('-') + 1)));
        for (const auto& entry : fs::directory_iterator(root + "/" + dir)) written += entry.file_size();
      }
      done.push_back(node + " (ranks " + joined(ranks, ",") + "; " + size_text(written) + ", " +
                     size_text(bytes.size()) + " of it coded, the rest replicated here)");
    } catch (const std::exception& e) {
      failure = node + ": " + dist::error_text(e);
      // A copy that does not verify must not stay where a restart looks for sources.
      std::error_code ec;
      for (const std::string& dir : dirs) fs::remove_all(root + "/" + dir, ec);
    }
    bytes = {};
  }
  const double ms = (obs::now_us() - start) / 1e3;
  if (all_min(group, {failure.empty() ? 1 : 0}, "snapshot redundancy: rebuilt copies verified")[0] == 0)
    return {step, false,
            failure.empty() ? "snapshot redundancy: rebuilding step " + step_text + " of lost " + nodes_text +
                                  " failed on another survivor (see its log)"
                            : "snapshot redundancy: the rebuilt snapshot of step " + step_text + " of " + failure};
  if (!done.empty()) {
    std::string what;
    for (size_t i = 0; i < done.size(); ++i) what += (i ? " and " : "") + done[i];
    char took[32];
    std::snprintf(took, sizeof(took), "%.0f ms", ms);
    return {step, true,
            "snapshot redundancy: rebuilt the snapshot of step " + step_text + " of " + what + " from parity in " +
                took};
  }
  std::vector<std::string> where;  // which survivor rebuilt each lost machine
  for (int machine : lost) {
    for (int other : plan.group_of(machine).machines)
      if (rank_of_machine[static_cast<size_t>(other)] >= 0) {
        where.push_back("node " + std::to_string(previous.members[static_cast<size_t>(machine)]) + " on node " +
                        std::to_string(previous.members[static_cast<size_t>(other)]));
        break;
      }
  }
  std::string what;
  for (size_t i = 0; i < where.size(); ++i) what += (i ? ", " : "") + where[i];
  return {step, true, "snapshot redundancy: step " + step_text + " of lost " + what + " rebuilt from parity"};
}

}  // namespace trireme::ft
