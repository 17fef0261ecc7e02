// Writing, verifying and reading checkpoints; see checkpoint.h.
#include "trireme/ft/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "trireme/common/error.h"
#include "trireme/common/file_io.h"
#include "trireme/ft/checksum.h"

namespace trireme::ft {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[] = "TRIREME-CKPT-SHARD 1\n";
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr char kFormat[] = "trireme-checkpoint";

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kByte: return "uint8";
    default: TRIREME_THROW(InvalidArgument, "checkpoint: unsupported dtype ", c10::toString(t));
  }
}

at::ScalarType dtype_of(const std::string& name, const std::string& where) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "int64") return at::kLong;
  if (name == "uint8") return at::kByte;
  TRIREME_THROW(CheckpointCorrupt, where, ": unknown dtype '", name, "'");
}

// Writes the buffers, in order, to `path` and makes it durable (fsync of the file).
void write_durably(const std::string& path, const std::vector<std::pair<const char*, size_t>>& buffers) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TRIREME_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno));
  if (const int error = write_all(fd, buffers)) {
    ::close(fd);
    TRIREME_THROW(Error, "writing ", path, " failed: ", std::strerror(error));
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  TRIREME_CHECK(synced, "fsync of ", path, " failed: ", std::strerror(errno));
}

void write_durably(const std::string& path, const std::string& text) {
  write_durably(path, {{text.data(), text.size()}});
}

std::vector<int64_t> ints(const json& j, const std::string& where, const char* field) {
  if (!j.is_array()) TRIREME_THROW(CheckpointCorrupt, where, ": field ", field, " is not a list of integers");
  std::vector<int64_t> out;
  for (const auto& v : j) {
    if (!v.is_number_integer()) TRIREME_THROW(CheckpointCorrupt, where, ": field ", field, " is not a list of integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

const json& field(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key))
    TRIREME_THROW(CheckpointCorrupt, where, ": missing field '", key, "'");
  return object.at(key);
}

// Throws CheckpointCorrupt (naming `at`) unless a slice's box lies inside the tensor's
// `shape` and its `bytes` are the box's elements of `element` bytes each.
void check_slice(const Box& box, uint64_t bytes, const std::vector<int64_t>& shape, uint64_t element,
                 const std::string& at) {
  uint64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.start[d] < 0 || box.size[d] < 0 || box.size[d] > shape[d] || box.start[d] > shape[d] - box.size[d])
      TRIREME_THROW(CheckpointCorrupt, at, ": slice ", describe(box), " is not inside the tensor's shape");
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(box.size[d]), &numel))
      TRIREME_THROW(CheckpointCorrupt, at, ": slice ", describe(box), " has too many elements");
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow(numel, element, &expected) || expected != bytes)
    TRIREME_THROW(CheckpointCorrupt, at, ": slice ", describe(box), " has ", bytes, " bytes for ", numel,
                  " elements of ", element, " bytes");
}

// Throws CheckpointCorrupt (naming `at`) when two of a tensor's slices overlap: readers
// count the elements the slices cover, so an overlap would pass for elements never read.
void check_disjoint(std::vector<Box> boxes, const std::string& at) {
  std::sort(boxes.begin(), boxes.end(), [](const Box& a, const Box& b) { return a.start < b.start; });
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      // Sorted by their start along dimension 0: the later ones begin past this one there.
      if (!boxes[i].start.empty() && boxes[j].start[0] >= boxes[i].start[0] + boxes[i].size[0]) break;
      if (intersect(boxes[i], boxes[j]))
        TRIREME_THROW(CheckpointCorrupt, at, ": slices ", describe(boxes[i]), " and ", describe(boxes[j]), " overlap");
    }
}

// Throws CheckpointCorrupt (naming `where`) when `dir` is named as a step (a number) other
// than `step`, the manifest's.
void check_step_matches(const std::string& dir, int64_t step, const std::string& where) {
  fs::path path(dir);
  if (path.filename().empty()) path = path.parent_path();  // "ROOT/4/"
  const std::string name = path.filename().string();
  int64_t named = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), named);
  if (!name.empty() && error == std::errc() && end == name.data() + name.size() && named != step)
    TRIREME_THROW(CheckpointCorrupt, where, ": step ", step, " in the directory of step ", name);
}

}  // namespace

namespace {

// A slice's manifest entry (before commit() groups the entries by tensor).
json slice_entry(const PlacedPiece& placed, at::ScalarType dtype, const std::string& file) {
  return {{"name", placed.piece->name},   {"dtype", dtype_name(dtype)},   {"shape", placed.piece->shape},
          {"file", file},                 {"offset", placed.offset},      {"bytes", placed.bytes},
          {"crc32", placed.crc},          {"start", placed.piece->box.start}, {"size", placed.piece->box.size}};
}

// Writes this rank's file of `dir` and returns its slices' manifest entries (JSON text).
std::string write_shard(const std::string& dir, const std::string& file, const std::vector<SavedPiece>& pieces) {
  fs::create_directories(dir);
  fs::remove(dir + "/manifest.json");  // a rewrite of this step is incomplete until the end
  std::vector<at::Tensor> held;  // keeps the buffers alive until written
  std::vector<std::pair<const char*, size_t>> buffers{{kMagic, kMagicBytes}};
  uint64_t offset = kMagicBytes;
  json entries = json::array();
  for (const SavedPiece& piece : pieces) {
    const at::Tensor data = host_data(piece);
    const size_t n = data.nbytes();
    held.push_back(data);
    buffers.emplace_back(static_cast<const char*>(data.data_ptr()), n);
    entries.push_back(slice_entry({&piece, offset, n, crc32(data.data_ptr(), n)}, data.scalar_type(), file));
    offset += n;
  }
  write_durably(dir + "/" + file + ".tmp", buffers);
  fs::rename(dir + "/" + file + ".tmp", dir + "/" + file);
  return entries.dump();
}

// The CRC-32 of a manifest's "tensors" as nlohmann writes them compactly (keys sorted): a
// name, shape or offset changed after the commit, which the structural checks can miss (a
// rank's snapshot need not cover its tensors), fails it.
uint32_t tensors_crc(const json& tensors) {
  const std::string text = tensors.dump();
  return crc32(text.data(), text.size());
}

// Writes the manifest of `step` from the writers' entries (the commit), then removes all
// but the newest `keep` complete checkpoints under root.
void commit(const std::string& root, int64_t step, const CheckpointLayout& layout, int world_size,
            const std::vector<std::string>& entry_texts, int keep) {
  const std::string dir = root + "/" + std::to_string(step);
  json tensors = json::object();
  for (const std::string& text : entry_texts)
    for (const json& e : json::parse(text)) {
      json& t = tensors[e.at("name").get<std::string>()];
      t["dtype"] = e.at("dtype");
      t["shape"] = e.at("shape");
      json slice = e;
      for (const char* k : {"name", "dtype", "shape"}) slice.erase(k);
      t["slices"].push_back(slice);
    }
  const json manifest = {{"format", kFormat},   {"version", kCheckpointVersion},
                         {"step", step},        {"mesh", layout.mesh},
                         {"dp", layout.dp},     {"tp", layout.tp},
                         {"pp", layout.pp},     {"zero", layout.zero},
                         {"rank", layout.rank},     {"model", layout.model},
                         {"data", layout.data},
                         {"world_size", world_size}, {"tensors", tensors}, {"tensors_crc32", tensors_crc(tensors)}};
  write_durably(dir + "/manifest.json.tmp", manifest.dump(1));
  fs::rename(dir + "/manifest.json.tmp", dir + "/manifest.json");
  sync_directory(dir);
  sync_directory(root);  // the step's own entry, before retention removes older steps
  int kept = 0;
  for (int64_t s : checkpoint_steps(root)) {
    const std::string d = root + "/" + std::to_string(s);
    if (s > step) continue;
    if (fs::exists(d + "/manifest.json") && kept < keep) {
      ++kept;
      continue;
    }
    if (s >= step) continue;
    // The step is committed: an older one that cannot be removed (a file someone else owns,
    // a mount) costs disk space, not the checkpoint, so it is said and training goes on.
    std::error_code error;
    fs::remove_all(d, error);
    if (error)
      std::fprintf(stderr, "trireme: checkpoint retention could not remove %s (%s); it stays on disk\n", d.c_str(),
                   error.message().c_str());
  }
}

}  // namespace

bool checkpoint_dtype_supported(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kLong || dtype == at::kByte;
}

void check_piece(const SavedPiece& piece) {
  TRIREME_CHECK(piece.data.numel() == piece.box.numel(), "checkpoint piece ", piece.name, " has ",
                piece.data.numel(), " elements for box ", describe(piece.box));
}

at::Tensor host_data(const SavedPiece& piece) {
  check_piece(piece);
  return piece.data.detach().to(at::kCPU).contiguous();
}

WriterLock::WriterLock(const std::string& root, std::chrono::milliseconds wait, bool restarted) {
  std::error_code made;
  fs::create_directories(root, made);
  TRIREME_CHECK(!made, "cannot create the checkpoint directory ", root, ": ", made.message());
  const std::string path = root + "/.writer";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TRIREME_CHECK(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EINTR || (error == EWOULDBLOCK && std::chrono::steady_clock::now() < deadline)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK && restarted) {
      std::fprintf(stderr, "trireme: %s is still locked, presumably by this job's earlier generation (a lost "
                           "machine's lock lasts until its lease ends); writing checkpoints without the lock\n",
                   path.c_str());
      return;
    }
    if (error == EWOULDBLOCK)
      TRIREME_THROW(Unrecoverable, "checkpoint directory ", root, " is being written by another job (or another "
                    "checkpoint writer of this one; ", path, " is locked): give each job its own --checkpoint-dir");
    TRIREME_THROW(Error, "cannot lock ", path, ": ", std::strerror(error));
  }
}

WriterLock::~WriterLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::vector<int64_t> checkpoint_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), step);
    if (!entry.is_directory(ec) || error != std::errc() || end != name.data() + name.size() || step < 0)
      continue;  // not a step's directory (or a number too large to be one)
    steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

void write_checkpoint(const std::string& root, int64_t step, const CheckpointLayout& layout,
                      const std::vector<SavedPiece>& pieces, dist::World& world, int keep) {
  TRIREME_CHECK(keep >= 1, "checkpoints to keep must be >= 1, got ", keep);
  const std::string entries = write_shard(root + "/" + std::to_string(step),
                                          "rank-" + std::to_string(world.rank()) + ".bin", pieces);
  const std::vector<std::string> all = world.gather_on_leader("checkpoint/" + std::to_string(step), entries);
  if (world.rank() == 0) commit(root, step, layout, world.size(), all, keep);
  dist::run_collective("checkpoint barrier", [&] { return world.group()->barrier(); });
}

void write_checkpoint_through_store(const std::string& root, int64_t step, const CheckpointLayout& layout,
                                    const std::vector<SavedPiece>& pieces, const dist::Store& store, int rank,
                                    int world_size, int keep) {
  TRIREME_CHECK(keep >= 1, "checkpoints to keep must be >= 1, got ", keep);
  const std::string entries =
      write_shard(root + "/" + std::to_string(step), "rank-" + std::to_string(rank) + ".bin", pieces);
  const std::string key = "checkpoint-entries/" + std::to_string(step) + "/";
  store->set(key + std::to_string(rank), std::vector<uint8_t>(entries.begin(), entries.end()));
  if (rank != 0) return;
  std::vector<std::string> keys, all;
  for (int r = 0; r < world_size; ++r) keys.push_back(key + std::to_string(r));
  store->wait(keys);
  for (const std::string& k : keys) {
    const std::vector<uint8_t> bytes = store->get(k);
    all.emplace_back(bytes.begin(), bytes.end());
  }
  commit(root, step, layout, world_size, all, keep);
  for (const std::string& k : keys) store->deleteKey(k);
}

std::string_view shard_magic() { return {kMagic, kMagicBytes}; }

void commit_local_checkpoint(const std::string& root, int64_t step, const CheckpointLayout& layout,
                             const std::string& file, const std::vector<PlacedPiece>& placed, int keep) {
  TRIREME_CHECK(keep >= 1, "snapshots to keep must be >= 1, got ", keep);
  json entries = json::array();
  for (const PlacedPiece& p : placed) entries.push_back(slice_entry(p, p.piece->data.scalar_type(), file));
  commit(root, step, layout, 1, {entries.dump()}, keep);
}

Checkpoint Checkpoint::open(const std::string& dir, bool verify_data) {
  Checkpoint c;
  c.dir_ = dir;
  const std::string manifest_path = dir + "/manifest.json";
  std::ifstream in(manifest_path);
  if (!in) TRIREME_THROW(CheckpointCorrupt, manifest_path, ": missing (the checkpoint was not completed)");
  json m;
  try {
    m = json::parse(in);
  } catch (const std::exception& e) {
    TRIREME_THROW(CheckpointCorrupt, manifest_path, ": not valid JSON (", e.what(), ")");
  }
  const std::string& where = manifest_path;
  // (Checked by type first: json's value() throws its own error, naming no file, for a
  // "format" that is a number or null, and the loader would not skip to an older step.)
  if (!m.is_object() || !m.contains("format") || !m["format"].is_string() ||
      m["format"].get<std::string>() != kFormat)
    TRIREME_THROW(CheckpointCorrupt, where, ": not a Trireme checkpoint (format is not '", kFormat, "')");
  const json& version = field(m, "version", where);
  if (!version.is_number_integer() || version.get<int64_t>() != kCheckpointVersion)
    TRIREME_THROW(CheckpointCorrupt, where, ": format version ", version.dump(), ", this build reads ",
                  kCheckpointVersion);
  try {
    // Whole numbers in range, not converted from anything (1e300 is no step, 2^40 no size).
    const auto count = [&](const char* key, int64_t max) {
      const json& v = field(m, key, where);
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > max)
        TRIREME_THROW(CheckpointCorrupt, where, ": field ", key, " is not a whole number in [0, ", max, "]");
      return v.get<int64_t>();
    };
    constexpr int64_t kIntMax = std::numeric_limits<int>::max();
    c.step_ = count("step", std::numeric_limits<int64_t>::max());
    check_step_matches(dir, c.step_, where);
    c.layout_ = {field(m, "mesh", where).get<std::string>(), static_cast<int>(count("dp", kIntMax)),
                 static_cast<int>(count("tp", kIntMax)), static_cast<int>(count("pp", kIntMax)),
                 static_cast<int>(count("zero", kIntMax)), m.value("rank", -1), "", ""};
    if (m.contains("model")) {
      if (!m["model"].is_string()) TRIREME_THROW(CheckpointCorrupt, where, ": field model is not a string");
      c.layout_.model = m["model"].get<std::string>();
    }
    if (m.contains("data")) {
      if (!m["data"].is_string()) TRIREME_THROW(CheckpointCorrupt, where, ": field data is not a string");
      c.layout_.data = m["data"].get<std::string>();
    }
    std::map<std::string, uint64_t> needed;  // file -> bytes it must have
    for (const auto& [name, t] : field(m, "tensors", where).items()) {
      Tensor tensor;
      const std::string at = where + ": tensor " + name;
      tensor.dtype = field(t, "dtype", at).get<std::string>();
      const auto element = static_cast<uint64_t>(c10::elementSize(dtype_of(tensor.dtype, at)));
      tensor.shape = ints(field(t, "shape", at), at, "shape");
      if (std::any_of(tensor.shape.begin(), tensor.shape.end(), [](int64_t size) { return size < 0; }))
        TRIREME_THROW(CheckpointCorrupt, at, ": a negative size in its shape");
      for (const json& s : field(t, "slices", at)) {
        Slice slice;
        slice.file = field(s, "file", at).get<std::string>();
        if (slice.file.find('/') != std::string::npos || slice.file.find("..") != std::string::npos)
          TRIREME_THROW(CheckpointCorrupt, at, ": slice file '", slice.file, "' is not a plain file name");
        slice.offset = field(s, "offset", at).get<uint64_t>();
        slice.bytes = field(s, "bytes", at).get<uint64_t>();
        slice.crc = field(s, "crc32", at).get<uint32_t>();
        slice.box = {ints(field(s, "start", at), at, "start"), ints(field(s, "size", at), at, "size")};
        if (slice.box.start.size() != tensor.shape.size() || slice.box.size.size() != tensor.shape.size())
          TRIREME_THROW(CheckpointCorrupt, at, ": a slice's box has the wrong number of dimensions");
        check_slice(slice.box, slice.bytes, tensor.shape, element, at);
        needed[slice.file] = std::max(needed[slice.file], slice.offset + slice.bytes);
        tensor.slices.push_back(std::move(slice));
      }
      std::vector<Box> boxes;
      int64_t covered = 0, elements = 1;
      bool overflow = false;
      for (const Slice& slice : tensor.slices) {
        boxes.push_back(slice.box);
        overflow |= __builtin_add_overflow(covered, slice.box.numel(), &covered);
      }
      for (int64_t size : tensor.shape) overflow |= __builtin_mul_overflow(elements, size, &elements);
      if (overflow) TRIREME_THROW(CheckpointCorrupt, at, ": its shape or slices hold too many elements");
      check_disjoint(std::move(boxes), at);
      // Disjoint boxes inside the shape: their elements add up to the tensor's only when they
      // cover all of it (before, a tensor without slices verified, and loading failed later).
      // Only a whole job's checkpoint covers every tensor: a rank's snapshot (rank >= 0)
      // holds its own shards.
      if (c.layout_.rank < 0 && covered != elements)
        TRIREME_THROW(CheckpointCorrupt, at, ": its slices cover ", covered, " of its ", elements, " elements");
      c.tensors_[name] = std::move(tensor);
    }
    if (c.layout_.rank < 0 && c.tensors_.empty()) TRIREME_THROW(CheckpointCorrupt, where, ": it holds no tensors");
    for (const auto& [file, bytes] : needed) {
      const std::string path = dir + "/" + file;
      std::ifstream f(path, std::ios::binary);
      if (!f) TRIREME_THROW(CheckpointCorrupt, path, ": missing");
      char magic[kMagicBytes];
      if (!f.read(magic, kMagicBytes) || std::memcmp(magic, kMagic, kMagicBytes) != 0)
        TRIREME_THROW(CheckpointCorrupt, path, ": not a Trireme checkpoint shard (bad magic line)");
      std::error_code size_error;
      const uint64_t size = fs::file_size(path, size_error);
      if (size_error) TRIREME_THROW(CheckpointCorrupt, path, ": cannot read its size (", size_error.message(), ")");
      if (size < bytes)
        TRIREME_THROW(CheckpointCorrupt, path, ": truncated (", size, " bytes, the manifest needs ", bytes, ")");
    }
    // (Last: a manifest edited into a structural fault is named by that fault. Manifests
    // written before 2026-12-07 carry no such CRC.)
    if (m.contains("tensors_crc32") && (!m["tensors_crc32"].is_number_unsigned() ||
                                        m["tensors_crc32"].get<uint64_t>() != tensors_crc(field(m, "tensors", where))))
      TRIREME_THROW(CheckpointCorrupt, where, ": its tensors do not match their CRC-32 (the manifest was changed "
                    "after it was written)");
  } catch (const nlohmann::json::exception& e) {
    TRIREME_THROW(CheckpointCorrupt, where, ": a field has the wrong type (", e.what(), ")");
  }
  if (verify_data) {
    for (const auto& [name, tensor] : c.tensors_)
      for (const Slice& slice : tensor.slices) c.read_slice(slice);
    c.verified_ = true;  // the reads need not check again
  }
  return c;
}

std::optional<Checkpoint> Checkpoint::find_latest(const std::string& root, std::vector<std::string>* skipped) {
  for (int64_t s : checkpoint_steps(root)) {
    const std::string dir = root + "/" + std::to_string(s);
    try {
      return open(dir, /*verify_data=*/true);
    } catch (const CheckpointCorrupt& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

struct Checkpoint::Mapping {
  const unsigned char* base = nullptr;
  size_t size = 0;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(const unsigned char* b, size_t n) : base(b), size(n) {}
  ~Mapping() {
    if (base) ::munmap(const_cast<unsigned char*>(base), size);
  }
};

const unsigned char* Checkpoint::mapped_slice(const Slice& slice) const {
  const std::string path = dir_ + "/" + slice.file;
  auto& mapping = mapped_[slice.file];
  if (!mapping) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) TRIREME_THROW(CheckpointCorrupt, path, ": cannot open (", std::strerror(errno), ")");
    struct stat st {};
    void* base = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && st.st_size > 0)
      base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) TRIREME_THROW(CheckpointCorrupt, path, ": cannot map (empty or unreadable)");
    mapping = std::make_shared<const Mapping>(static_cast<const unsigned char*>(base), static_cast<size_t>(st.st_size));
  }
  if (slice.offset > mapping->size || slice.bytes > mapping->size - slice.offset)
    TRIREME_THROW(CheckpointCorrupt, path, ": cannot read bytes ", slice.offset, "..", slice.offset + slice.bytes,
                  " (truncated?)");
  return mapping->base + slice.offset;
}

void Checkpoint::throw_crc_mismatch(const Slice& slice) const {
  TRIREME_THROW(CheckpointCorrupt, dir_, "/", slice.file, ": CRC-32 mismatch in bytes ", slice.offset, "..",
                slice.offset + slice.bytes, " (box ", ft::describe(slice.box), "): the file is damaged");
}

const unsigned char* Checkpoint::read_slice(const Slice& slice) const {
  const unsigned char* bytes = mapped_slice(slice);
  if (crc32(bytes, slice.bytes) != slice.crc) throw_crc_mismatch(slice);
  return bytes;
}

std::vector<int64_t> Checkpoint::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  TRIREME_CHECK(it != tensors_.end(), "checkpoint ", dir_, " has no tensor '", name, "'");
  return it->second.shape;
}

std::vector<std::string> Checkpoint::names(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = tensors_.lower_bound(prefix); it != tensors_.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.push_back(it->first);
  return out;
}

std::vector<Checkpoint::SliceRecord> Checkpoint::slices() const {
  std::vector<SliceRecord> out;
  for (const auto& [name, tensor] : tensors_)
    for (const Slice& slice : tensor.slices)
      out.push_back({name, tensor.dtype, slice.file, slice.offset, slice.bytes, slice.crc, slice.box});
  return out;
}

std::vector<Box> Checkpoint::boxes(const std::string& name) const {
  std::vector<Box> out;
  auto it = tensors_.find(name);
  if (it != tensors_.end())
    for (const Slice& slice : it->second.slices) out.push_back(slice.box);
  return out;
}

bool Checkpoint::covers(const std::string& name, const Box& want) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || want.start.size() != it->second.shape.size()) return false;
  int64_t covered = 0;  // slices of one writer do not overlap
  for (const Slice& slice : it->second.slices)
    if (const auto common = intersect(slice.box, want)) covered += common->numel();
  return covered == want.numel();
}

at::Tensor Checkpoint::read(const std::string& name, const Box& want) const {
  auto it = tensors_.find(name);
  TRIREME_CHECK(it != tensors_.end(), "checkpoint ", dir_, " has no tensor '", name, "'");
  at::Tensor out = at::empty(want.size, at::TensorOptions(dtype_of(it->second.dtype, dir_)));
  read_into(name, want, out);
  return out;
}

void Checkpoint::read_into(const std::string& name, const Box& want, const at::Tensor& out) const {
  auto it = tensors_.find(name);
  TRIREME_CHECK(it != tensors_.end(), "checkpoint ", dir_, " has no tensor '", name, "'");
  const Tensor& tensor = it->second;
  const at::ScalarType dtype = dtype_of(tensor.dtype, dir_);
  TRIREME_CHECK(want.start.size() == tensor.shape.size() && intersect(want, whole(tensor.shape)) &&
                    intersect(want, whole(tensor.shape))->numel() == want.numel(),
                "box ", ft::describe(want), " is outside tensor '", name, "' of the checkpoint");
  TRIREME_CHECK(out.sizes().vec() == want.size, "reading box ", ft::describe(want), " of '", name,
                "' into a tensor of another shape");
  const bool direct = out.device().is_cpu() && out.scalar_type() == dtype && out.is_contiguous();
  int64_t covered = 0;
  for (const Slice& slice : tensor.slices) {
    const auto common = intersect(slice.box, want);
    if (!common) continue;
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    if (static_cast<int64_t>(slice.bytes) != slice.box.numel() * element)
      TRIREME_THROW(CheckpointCorrupt, dir_, "/", slice.file, ": slice of '", name, "' has ", slice.bytes,
                    " bytes for box ", ft::describe(slice.box));
    if (direct && slice.box.start == want.start && slice.box.size == want.size) {
      if (verified_)
        std::memcpy(out.data_ptr(), mapped_slice(slice), slice.bytes);
      else if (copy_with_crc32(out.data_ptr(), mapped_slice(slice), slice.bytes) != slice.crc)
        throw_crc_mismatch(slice);
      covered += common->numel();
      continue;
    }
    const unsigned char* bytes = verified_ ? mapped_slice(slice) : read_slice(slice);
    at::Tensor stored = at::from_blob(const_cast<unsigned char*>(bytes), slice.box.size, at::TensorOptions(dtype));
    at::Tensor from = stored, to = out;
    for (size_t d = 0; d < want.start.size(); ++d) {
      from = from.narrow(static_cast<int64_t>(d), common->start[d] - slice.box.start[d], common->size[d]);
      to = to.narrow(static_cast<int64_t>(d), common->start[d] - want.start[d], common->size[d]);
    }
    to.copy_(from);
    covered += common->numel();
  }
  if (covered != want.numel())
    TRIREME_THROW(CheckpointCorrupt, dir_, ": tensor '", name, "' box ", ft::describe(want), " is covered by ",
                  covered, " of its ", want.numel(), " elements");
}

std::string Checkpoint::describe() const {
  std::ostringstream out;
  int64_t bytes = 0, slices = 0;
  for (const auto& [name, t] : tensors_)
    for (const Slice& s : t.slices) {
      bytes += static_cast<int64_t>(s.bytes);
      ++slices;
    }
  out << "checkpoint " << dir_ << "\n  step " << step_ << ", written by " << layout_.mesh << " (dp " << layout_.dp
      << ", tp " << layout_.tp << ", pp " << layout_.pp << ", zero " << layout_.zero << ")"
      << (layout_.rank >= 0 ? ", the snapshot of rank " + std::to_string(layout_.rank) : std::string())
      << (layout_.model.empty() ? std::string() : "\n  model " + layout_.model)
      << (layout_.data.empty() ? std::string() : "\n  data " + layout_.data) << "\n  "
      << tensors_.size()
      << " tensors, " << slices << " slices, " << bytes << " bytes\n";
  for (const auto& [name, t] : tensors_) {
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d) shape += (d ? "x" : "") + std::to_string(t.shape[d]);
    int64_t tb = 0;
    for (const Slice& s : t.slices) tb += static_cast<int64_t>(s.bytes);
    out << "  " << name << "  " << t.dtype << " [" << shape << "]  " << t.slices.size() << " slice"
        << (t.slices.size() == 1 ? "" : "s") << ", " << tb << " bytes\n";
  }
  return out.str();
}

}  // namespace trireme::ft
