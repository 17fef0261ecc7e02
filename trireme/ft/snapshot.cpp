// BackgroundWriter and Snapshotter: copy on the training thread, write on another; see
// snapshot.h.
#include "trireme/ft/snapshot.h"

#include <algorithm>
#include <filesystem>

#include "trireme/common/error.h"
#include "trireme/obs/clock.h"

namespace trireme::ft {

// Two snapshots are kept: the newest may be the one a crash interrupted.
constexpr int kSnapshotsKept = 2;

BackgroundWriter::BackgroundWriter(WriteFn write) : write_(std::move(write)) {
  thread_ = std::thread([this] { run(); });
}

Snapshotter::Snapshotter(const std::string& dir, const CheckpointLayout& layout,
                         std::function<void(int64_t)> before_commit)
    : BackgroundWriter([dir, layout, before_commit](int64_t step, const std::vector<SavedPiece>& pieces) {
        std::filesystem::create_directories(dir);
        write_local_checkpoint(dir, step, layout, pieces, kSnapshotsKept,
                               [&] { if (before_commit) before_commit(step); });
      }) {}

BackgroundWriter::~BackgroundWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
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
    staging_.clear();
    for (const SavedPiece& p : pieces) staging_.push_back(at::empty(p.data.sizes(), p.data.options().device(at::kCPU)));
  }
  std::vector<SavedPiece> copies;
  copies.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    staging_[i].copy_(pieces[i].data.detach());
    copies.push_back({pieces[i].name, pieces[i].shape, pieces[i].box, staging_[i]});
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.emplace(step, std::move(copies));
    busy_ = true;
  }
  wake_.notify_all();
  return obs::now_us() - start;
}

void BackgroundWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return !busy_; });
  if (!failure_.empty()) TRIREME_THROW(Error, failure_);
}

void BackgroundWriter::run() {
  for (;;) {
    std::pair<int64_t, std::vector<SavedPiece>> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (!pending_) return;
      job = std::move(*pending_);
      pending_.reset();
    }
    std::string failure;
    try {
      write_(job.first, job.second);
    } catch (const std::exception& e) {
      failure = std::string("background write of step ") + std::to_string(job.first) + " failed: " + e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) failure_ = failure;
      busy_ = false;
    }
    wake_.notify_all();
  }
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
