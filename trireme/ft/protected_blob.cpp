// Protected snapshot copies as one byte string, replicated slices left out; see
// protected_blob.h.
#include "trireme/ft/protected_blob.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::ft {

namespace fs = std::filesystem;

namespace {

constexpr char kBlobMagic[] = "TRIREME-PROTECTED 2\n";
constexpr size_t kBlobMagicBytes = sizeof(kBlobMagic) - 1;

struct Hole {
  uint64_t offset = 0, bytes = 0;
  std::string key;
};

std::string top_of(const std::string& path) { return path.substr(0, path.find('/')); }

// The top directories of `paths`, in first-seen order.
std::vector<std::string> tops_of(const std::vector<std::string>& paths) {
  std::vector<std::string> tops;
  for (const std::string& path : paths)
    if (std::find(tops.begin(), tops.end(), top_of(path)) == tops.end()) tops.push_back(top_of(path));
  return tops;
}

// The slices of the snapshot in ROOT/<top>, by their file relative to ROOT.
std::multimap<std::string, Checkpoint::SliceRecord> slices_by_file(const std::string& root, const std::string& top) {
  std::multimap<std::string, Checkpoint::SliceRecord> out;
  for (Checkpoint::SliceRecord& slice : Checkpoint::open(root + "/" + top, /*verify_data=*/false).slices())
    out.emplace(top + "/" + slice.file, std::move(slice));
  return out;
}

// (resize and memcpy: g++ 12 warns falsely on vector::insert of a few bytes)
void append(std::vector<uint8_t>& out, const void* bytes, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, bytes, n);
}

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  append(out, &value, sizeof(T));
}

void put_text(std::vector<uint8_t>& out, const std::string& text) {
  put(out, static_cast<uint32_t>(text.size()));
  append(out, text.data(), text.size());
}

// A path a blob may hold: relative, no empty, "." or ".." component.
bool plain_relative(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.back() == '/') return false;
  std::istringstream parts(path);
  for (std::string part; std::getline(parts, part, '/');)
    if (part.empty() || part == "." || part == "..") return false;
  return true;
}

// Reads a blob front to back; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& blob) : blob_(blob) {}
  const uint8_t* take(uint64_t n) {
    if (blob_.size() - at_ < n) TRIREME_THROW(CheckpointCorrupt, "a rebuilt snapshot blob is truncated");
    const uint8_t* p = blob_.data() + at_;
    at_ += n;
    return p;
  }
  template <typename T>
  T number() {
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  std::string text() {
    const uint32_t length = number<uint32_t>();
    return {reinterpret_cast<const char*>(take(length)), length};
  }
  bool done() const { return at_ == blob_.size(); }
  uint64_t left() const { return blob_.size() - at_; }

 private:
  const std::vector<uint8_t>& blob_;
  uint64_t at_ = 0;
};

}  // namespace

std::string slice_key(const Checkpoint::SliceRecord& slice) {
  return slice.tensor + "|" + slice.dtype + "|" + describe(slice.box) + "|" + std::to_string(slice.bytes) + "|" +
         std::to_string(slice.crc);
}

std::set<std::string> slice_keys(const std::string& root, const std::vector<std::string>& paths) {
  std::set<std::string> keys;
  for (const std::string& top : tops_of(paths)) {
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> spans;  // by file: (offset, end)
    for (const auto& [file, slice] : slices_by_file(root, top)) {
      keys.insert(slice_key(slice));
      spans[file].emplace_back(slice.offset, slice.offset + slice.bytes);
    }
    // What serialize_blob relies on, checked here, before any machine commits to a round.
    for (auto& [file, mine] : spans) {
      std::sort(mine.begin(), mine.end());
      for (size_t i = 1; i < mine.size(); ++i)
        if (mine[i - 1].second > mine[i].first)
          TRIREME_THROW(CheckpointCorrupt, root, "/", file, ": its manifest's slices overlap");
    }
  }
  return keys;
}

std::vector<uint8_t> serialize_blob(const std::string& root, const std::vector<std::string>& paths,
                                    const std::set<std::string>& left_out, uint64_t* hole_bytes) {
  std::map<std::string, std::vector<Hole>> holes;  // by path
  uint64_t left_out_bytes = 0;
  if (!left_out.empty())
    for (const std::string& top : tops_of(paths))
      for (const auto& [file, slice] : slices_by_file(root, top)) {
        std::string key = slice_key(slice);
        if (left_out.count(key) == 0 || slice.bytes == 0) continue;
        holes[file].push_back({slice.offset, slice.bytes, std::move(key)});
        left_out_bytes += slice.bytes;
      }
  std::vector<uint64_t> sizes;
  uint64_t total = kBlobMagicBytes + sizeof(uint32_t);
  for (const std::string& path : paths) {
    sizes.push_back(fs::file_size(root + "/" + path));
    total += sizeof(uint32_t) + path.size() + sizeof(uint64_t) + sizeof(uint32_t) + sizes.back();
    std::vector<Hole>& mine = holes[path];
    std::sort(mine.begin(), mine.end(), [](const Hole& a, const Hole& b) { return a.offset < b.offset; });
    for (size_t i = 0; i < mine.size(); ++i) {
      // One writer's slices never overlap, and the manifest was checked against the length.
      if (mine[i].offset + mine[i].bytes > sizes.back() || (i && mine[i - 1].offset + mine[i - 1].bytes > mine[i].offset))
        TRIREME_THROW(CheckpointCorrupt, root, "/", path, ": its manifest's slices overlap or run past its end");
      total += 2 * sizeof(uint64_t) + sizeof(uint32_t) + mine[i].key.size() - mine[i].bytes;
    }
  }
  std::vector<uint8_t> blob;
  blob.reserve(total);
  append(blob, kBlobMagic, kBlobMagicBytes);
  put(blob, static_cast<uint32_t>(paths.size()));
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::vector<Hole>& mine = holes[paths[i]];
    put_text(blob, paths[i]);
    put(blob, sizes[i]);
    put(blob, static_cast<uint32_t>(mine.size()));
    for (const Hole& hole : mine) {
      put(blob, hole.offset);
      put(blob, hole.bytes);
      put_text(blob, hole.key);
    }
    const std::string file = root + "/" + paths[i];
    std::ifstream in(file, std::ios::binary);
    uint64_t at = 0;
    const auto copy_to = [&](uint64_t end) {
      const size_t from = blob.size();
      blob.resize(from + (end - at));
      if (!in.read(reinterpret_cast<char*>(blob.data() + from), static_cast<std::streamsize>(end - at)))
        TRIREME_THROW(Error, "cannot read ", file, " back for the parity exchange");
      at = end;
    };
    for (const Hole& hole : mine) {
      copy_to(hole.offset);
      in.seekg(static_cast<std::streamoff>(hole.offset + hole.bytes));
      at = hole.offset + hole.bytes;
    }
    copy_to(sizes[i]);
  }
  if (hole_bytes) *hole_bytes = left_out_bytes;
  return blob;
}

HoleFill fill_from(const std::string& root, const std::vector<std::string>& paths) {
  struct Source {
    std::string file;
    uint64_t offset = 0;
  };
  auto index = std::make_shared<std::map<std::string, Source>>();
  for (const std::string& top : tops_of(paths))
    for (const auto& [file, slice] : slices_by_file(root, top))
      index->emplace(slice_key(slice), Source{root + "/" + file, slice.offset});
  return [index](const std::string& key, uint8_t* out, uint64_t bytes) {
    const auto it = index->find(key);
    if (it == index->end()) return false;
    std::ifstream in(it->second.file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(it->second.offset));
    return static_cast<bool>(in.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(bytes)));
  };
}

std::vector<std::string> write_blob(const std::vector<uint8_t>& blob, const std::string& root, const HoleFill& fill) {
  Reader r(blob);
  if (std::memcmp(r.take(kBlobMagicBytes), kBlobMagic, kBlobMagicBytes) != 0)
    TRIREME_THROW(CheckpointCorrupt, "a rebuilt snapshot blob does not start with its magic line");
  const uint32_t count = r.number<uint32_t>();
  std::vector<std::string> tops;
  // Half-written copies must not stay where a restart looks for sources: what this wrote
  // goes again unless it all was written.
  struct Undo {
    const std::string& root;
    const std::vector<std::string>& tops;
    bool keep = false;
    ~Undo() {
      std::error_code ec;
      if (!keep)
        for (const std::string& top : tops) fs::remove_all(root + "/" + top, ec);
    }
  } undo{root, tops};
  for (uint32_t f = 0; f < count; ++f) {
    const std::string path = r.text();
    if (!plain_relative(path))
      TRIREME_THROW(CheckpointCorrupt, "a rebuilt snapshot blob names the path '", path, "'");
    const uint64_t size = r.number<uint64_t>();
    const uint32_t hole_count = r.number<uint32_t>();
    if (hole_count > r.left() / (2 * sizeof(uint64_t) + sizeof(uint32_t)))
      TRIREME_THROW(CheckpointCorrupt, "a rebuilt snapshot blob claims ", hole_count, " holes in ", path);
    std::vector<Hole> holes(hole_count);
    uint64_t hole_total = 0, end = 0;
    for (Hole& hole : holes) {
      hole.offset = r.number<uint64_t>();
      hole.bytes = r.number<uint64_t>();
      hole.key = r.text();
      if (hole.offset < end || hole.bytes > size || hole.offset > size - hole.bytes)
        TRIREME_THROW(CheckpointCorrupt, "a rebuilt snapshot blob has a misplaced hole in ", path);
      end = hole.offset + hole.bytes;
      hole_total += hole.bytes;
    }
    const uint8_t* data = r.take(size - hole_total);
    const std::string top = top_of(path);
    if (std::find(tops.begin(), tops.end(), top) == tops.end()) {
      fs::remove_all(root + "/" + top);
      tops.push_back(top);
    }
    const fs::path target = fs::path(root) / path;
    fs::create_directories(target.parent_path());
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    const auto write = [&](const uint8_t* from, uint64_t n) {
      out.write(reinterpret_cast<const char*>(from), static_cast<std::streamsize>(n));
    };
    uint64_t at = 0;
    std::vector<uint8_t> slice;  // one hole's bytes at a time
    for (const Hole& hole : holes) {
      write(data, hole.offset - at);
      data += hole.offset - at;
      slice.resize(hole.bytes);
      if (!fill(hole.key, slice.data(), hole.bytes))
        TRIREME_THROW(CheckpointCorrupt, "rebuilding ", path, ": no copy of the replicated slice ", hole.key,
                      " here to fill it from");
      write(slice.data(), hole.bytes);
      at = hole.offset + hole.bytes;
    }
    write(data, size - at);
    out.close();
    if (!out) TRIREME_THROW(Error, "cannot write ", target.string());
  }
  if (!r.done()) TRIREME_THROW(CheckpointCorrupt, "a rebuilt snapshot blob has bytes after its last file");
  undo.keep = true;
  return tops;
}

}  // namespace trireme::ft
