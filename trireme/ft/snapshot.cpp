// BackgroundWriter (copy here, write on a thread) and Snapshotter (copy into reused
// shared-memory slots); see snapshot.h.
#include "trireme/ft/snapshot.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "trireme/common/error.h"
#include "trireme/ft/checksum.h"
#include "trireme/obs/clock.h"

namespace trireme::ft {

BackgroundWriter::BackgroundWriter(WriteFn write, bool idle_priority) : write_(std::move(write)) {
  thread_ = std::thread([this, idle_priority] { run(idle_priority); });
}

BackgroundWriter::~BackgroundWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  release_staging();
}

namespace {

constexpr size_t kAlign = 64;  // each copy's start in a shared buffer

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

void BackgroundWriter::release_staging() {
  if (staging_pinned_) unpin_host_memory(device_staging_.data_ptr());
  staging_.clear();
  device_staging_ = at::Tensor();
  staging_pinned_ = false;
}

double BackgroundWriter::take(int64_t step, const std::vector<SavedPiece>& pieces) {
  const double start = obs::now_us();
  wait();
  // Into the host buffers of the previous snapshot when the tensors are the same (its
  // write is done): no fresh allocation, so no page faults on the training thread.
  bool reuse = staging_.size() == pieces.size();
  for (size_t i = 0; reuse && i < pieces.size(); ++i)
    reuse = staging_[i].sizes() == pieces[i].data.sizes() && staging_[i].dtype() == pieces[i].data.dtype();
  if (!reuse) {
    release_staging();
    // Copies of device tensors share one buffer, page-locked once (as the snapshot slots
    // are), so that they run asynchronously.
    size_t device_bytes = 0;
    for (const SavedPiece& p : pieces)
      if (!p.data.device().is_cpu()) device_bytes += aligned(p.data.nbytes());
    if (device_bytes > 0) {
      device_staging_ = at::empty({static_cast<int64_t>(device_bytes)}, at::kByte);
      staging_pinned_ = pin_host_memory(device_staging_.data_ptr(), device_bytes);
    }
    size_t offset = 0;
    for (const SavedPiece& p : pieces) {
      if (p.data.device().is_cpu()) {
        staging_.push_back(at::empty(p.data.sizes(), p.data.options()));
        continue;
      }
      const auto bytes = static_cast<int64_t>(p.data.nbytes());
      staging_.push_back(device_staging_.narrow(0, static_cast<int64_t>(offset), bytes)
                             .view(p.data.scalar_type())
                             .view(p.data.sizes()));
      offset += aligned(p.data.nbytes());
    }
  }
  std::vector<SavedPiece> copies;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  for (size_t i = 0; i < pieces.size(); ++i) {
    copies.push_back({pieces[i].name, pieces[i].shape, pieces[i].box, staging_[i]});
    pairs.emplace_back(staging_[i], pieces[i].data);
  }
  copies_.copy_all(pairs);
  submit(step, std::move(copies));
  return obs::now_us() - start;
}

void BackgroundWriter::submit(int64_t step, std::vector<SavedPiece> pieces, std::function<void()> host_copy) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copying_ = host_copy;
    pending_.emplace(Job{step, std::move(pieces), std::move(host_copy)});
    busy_ = true;
  }
  wake_.notify_all();
}

double BackgroundWriter::before_update() {
  const double start = obs::now_us();
  std::function<void()> host_copy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    host_copy = copying_;
  }
  // What the writer thread has not begun is done here, at the caller's priority: a busy
  // machine that starves the idle-priority thread delays the step by no more than the copy.
  if (host_copy) host_copy();
  const double host = obs::now_us() - start;
  return host + copies_.settle();
}

void BackgroundWriter::drain() noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return !busy_; });
}

void BackgroundWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return !busy_; });
  if (!failure_.empty()) TRIREME_THROW(Error, failure_);
}

void BackgroundWriter::run(bool idle_priority) {
  if (idle_priority) {
    const sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);  // best effort
  }
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (!pending_) return;
      job = std::move(*pending_);
      pending_.reset();
    }
    const double cpu_start = obs::thread_cpu_us();
    std::string failure;
    const auto failed = [&](const std::exception& e) {
      failure = std::string("background write of step ") + std::to_string(job.step) + " failed: " + e.what();
    };
    if (job.host_copy) {
      try {
        job.host_copy();
      } catch (const std::exception& e) {
        failed(e);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      copying_ = nullptr;
    }
    try {
      copies_.wait_host();
      if (failure.empty()) write_(job.step, job.pieces);
    } catch (const std::exception& e) {
      failed(e);
    }
    last_write_cpu_us_.store(obs::thread_cpu_us() - cpu_start);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) failure_ = failure;
      busy_ = false;
    }
    wake_.notify_all();
  }
}

namespace fs = std::filesystem;

Snapshotter::Snapshotter(std::string dir, CheckpointLayout layout, std::function<void(int64_t)> before_commit)
    : BackgroundWriter([this](int64_t step, const std::vector<SavedPiece>& in_slot) { commit(step, in_slot); },
                       /*idle_priority=*/true),
      dir_(std::move(dir)),
      layout_(std::move(layout)),
      before_commit_(std::move(before_commit)) {
  slots_.reserve(kMaxSlots);
}

Snapshotter::~Snapshotter() {
  drain();  // the thread reads the slots and this object's members
  for (Slot& slot : slots_) release(slot);
}

void Snapshotter::release(Slot& slot) {
  if (slot.pinned) unpin_host_memory(slot.base);
  if (slot.base) ::munmap(slot.base, slot.bytes);
  slot = Slot{};
}

namespace {

// Contiguous host pieces of one snapshot, each copied into its slot and checksummed in
// one pass by whichever thread takes it first: the writer thread, at idle priority, in the
// step's waits, or the training thread in before_update(), for what is left.
class SharedCopy {
 public:
  struct Piece {
    size_t index;  // into crcs
    unsigned char* to;
    at::Tensor from;
  };
  SharedCopy(std::vector<Piece> pieces, std::vector<std::optional<uint32_t>>* crcs)
      : pieces_(std::move(pieces)), crcs_(crcs) {}

  // Takes pieces until none is left, then waits for those another thread took.
  void work() {
    for (size_t i = next_.fetch_add(1); i < pieces_.size(); i = next_.fetch_add(1)) {
      const Piece& p = pieces_[i];
      (*crcs_)[p.index] = copy_with_crc32(p.to, p.from.data_ptr(), p.from.nbytes());
      if (done_.fetch_add(1) + 1 == pieces_.size()) {
        std::lock_guard<std::mutex> lock(mutex_);
        all_done_.notify_all();
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    all_done_.wait(lock, [this] { return done_.load() == pieces_.size(); });
  }

 private:
  const std::vector<Piece> pieces_;
  std::vector<std::optional<uint32_t>>* const crcs_;  // distinct elements per piece
  std::atomic<size_t> next_{0}, done_{0};
  std::mutex mutex_;
  std::condition_variable all_done_;
};

// An exclusive flock on a slot's data file, taken without waiting; closed (unlocked) when
// it goes. Not held when the file is gone or someone else (the keeper) holds a lock.
class SlotLock {
 public:
  explicit SlotLock(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~SlotLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace

Snapshotter::Slot* Snapshotter::claim(int64_t step, size_t bytes) {
  const std::string target = dir_ + "/" + std::to_string(step);
  // A slot is reused when it still exists with the right size (the state's shapes are
  // fixed, so only a first snapshot or a damaged area makes a new one).
  for (Slot& slot : slots_)
    if (slot.bytes != bytes || slot.dir == target || !fs::exists(slot.dir + "/data.bin")) release(slot);
  slots_.erase(std::remove_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.base == nullptr; }),
               slots_.end());
  if (fs::exists(target)) fs::remove_all(target);  // left by an earlier generation (a held file stays)
  std::vector<Slot*> order;  // oldest first
  for (Slot& slot : slots_) order.push_back(&slot);
  std::sort(order.begin(), order.end(), [](const Slot* a, const Slot* b) { return a->step < b->step; });
  // The first of `candidates` whose file no keeper holds, made this snapshot's slot.
  const auto reuse = [&](const std::vector<Slot*>& candidates) -> Slot* {
    for (Slot* slot : candidates) {
      const SlotLock lock(slot->dir + "/data.bin");
      if (!lock.held()) continue;  // lent to the keeper
      fs::remove(slot->dir + "/manifest.json");  // the old snapshot is incomplete from here on
      fs::rename(slot->dir, target);
      slot->dir = target;
      slot->step = step;
      keep_ = static_cast<int>(slots_.size());
      return slot;
    }
    return nullptr;
  };
  // The oldest slot but the two newest snapshots.
  if (order.size() >= static_cast<size_t>(kSlots))
    if (Slot* slot = reuse(std::vector<Slot*>(order.begin(), order.end() - 2))) return slot;
  // When no slot beyond those can be had, the one before the newest serves: the newest
  // complete snapshot stays. (Skipping this snapshot instead, and every later one, kept
  // this rank's newest step where it was, and with it the step its node's keeper holds:
  // one that is then never let go.) Only when that one is held too is it skipped.
  const auto second_newest = [&]() -> Slot* {
    return order.size() >= 2 ? reuse({order[order.size() - 2]}) : nullptr;
  };
  // A slot beyond the three in use is for the keeper's sake.
  const bool extra = slots_.size() >= static_cast<size_t>(kSlots);
  if (extra && slots_.size() >= static_cast<size_t>(kMaxSlots)) return second_newest();
  fs::create_directories(target);
  const std::string path = target + "/data.bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  TRIREME_CHECK(fd >= 0, "cannot create snapshot file ", path, ": ", std::strerror(errno));
  const int reserved = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = reserved == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
                             : MAP_FAILED;
  const int mapped_errno = errno;
  ::close(fd);
  if (reserved != 0 || (base == MAP_FAILED && extra)) {
    if (base != MAP_FAILED) ::munmap(base, bytes);
    fs::remove_all(target);
    if (extra) return second_newest();
    TRIREME_THROW(Error, "no room for a ", bytes >> 20, " MiB snapshot in ", dir_, " (", std::strerror(reserved),
                  "): free shared memory or set --snapshot-every 0");
  }
  if (base == MAP_FAILED) {
    fs::remove_all(target);  // (its reserved pages, the snapshot's size, go with it)
    TRIREME_THROW(Error, "cannot map snapshot file ", path, ": ", std::strerror(mapped_errno));
  }
  made_slot_ = true;
  Slot& slot = slots_.emplace_back();
  slot.dir = target;
  slot.step = step;
  slot.base = static_cast<unsigned char*>(base);
  slot.bytes = bytes;
  const std::string_view magic = shard_magic();
  std::memcpy(slot.base, magic.data(), magic.size());
  keep_ = std::max<int>(kSlots, static_cast<int>(slots_.size()));
  return &slot;
}

double Snapshotter::take(int64_t step, const std::vector<SavedPiece>& pieces) {
  const double start = obs::now_us();
  wait();  // the previous snapshot is complete before the slot of the one before is reused
  size_t bytes = shard_magic().size();
  bool on_device = false;
  for (const SavedPiece& piece : pieces) {
    check_piece(piece);
    bytes += piece.data.nbytes();
    on_device = on_device || !piece.data.device().is_cpu();
  }
  fs::create_directories(dir_);
  made_slot_ = false;
  Slot* claimed = claim(step, bytes);
  if (!claimed) {  // every slot but the newest two held by the keeper, and no room for another
    if (!warned_full_)
      std::fprintf(stderr, "snapshot: no free slot in %s (the node agent holds the others and /dev/shm has no "
                   "room for another): snapshots are skipped until it lets one go\n", dir_.c_str());
    warned_full_ = true;
    return obs::now_us() - start;
  }
  Slot& slot = *claimed;
  if (on_device && !slot.pin_tried) {  // once per slot
    slot.pinned = pin_host_memory(slot.base, slot.bytes);
    slot.pin_tried = true;
  }
  std::vector<SavedPiece> in_slot;  // the same pieces, as views of the slot
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;  // device or strided: copies_ copies them
  std::vector<SharedCopy::Piece> host;  // contiguous host state: copied off this call
  crcs_.assign(pieces.size(), std::nullopt);
  uint64_t offset = shard_magic().size();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const SavedPiece& piece = pieces[i];
    at::Tensor view = at::from_blob(slot.base + offset, piece.data.sizes(), piece.data.options().device(at::kCPU));
    in_slot.push_back({piece.name, piece.shape, piece.box, view});
    if (piece.data.device().is_cpu() && piece.data.is_contiguous())
      host.push_back({i, slot.base + offset, piece.data});
    else
      pairs.emplace_back(std::move(view), piece.data);
    offset += piece.data.nbytes();
  }
  copies_.copy_all(pairs);  // on a failure the slot has no manifest: the snapshots before it serve
  std::function<void()> host_copy;
  if (!host.empty())
    host_copy = [shared = std::make_shared<SharedCopy>(std::move(host), &crcs_)] { shared->work(); };
  submit(step, std::move(in_slot), std::move(host_copy));
  return obs::now_us() - start;
}

void Snapshotter::commit(int64_t step, const std::vector<SavedPiece>& in_slot) {
  std::vector<PlacedPiece> placed;
  placed.reserve(in_slot.size());
  uint64_t offset = shard_magic().size();
  for (size_t i = 0; i < in_slot.size(); ++i) {  // back to back after the magic line, as take() put them
    const SavedPiece& piece = in_slot[i];
    const size_t n = piece.data.nbytes();
    const std::optional<uint32_t> known = i < crcs_.size() ? crcs_[i] : std::nullopt;
    placed.push_back({&piece, offset, n, known ? *known : crc32(piece.data.data_ptr(), n)});
    offset += n;
  }
  if (before_commit_) before_commit_(step);
  // Every complete snapshot in a slot is kept (the slots bound how many there are).
  commit_local_checkpoint(dir_, step, layout_, "data.bin", placed, keep_);
}

std::vector<int64_t> Snapshotter::complete_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  for (int64_t step : checkpoint_steps(dir)) {
    try {
      // Manifest, magic lines and lengths; each slice's CRC is checked as it is read.
      Checkpoint::open(dir + "/" + std::to_string(step), /*verify_data=*/false);
      steps.push_back(step);
    } catch (const CheckpointCorrupt&) {
      // interrupted or damaged: not a candidate
    }
  }
  return steps;
}

}  // namespace trireme::ft
