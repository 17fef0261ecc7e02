// metrics.jsonl: one JSON object per line, appended and flushed as each step ends, so a
// crashed run keeps every completed step's numbers.
#pragma once

#include <cstdio>
#include <string>

#include "trireme/obs/json.h"

namespace trireme::obs {

class MetricsWriter {
 public:
  // Truncates `path` unless append. Throws InvalidArgument when it cannot be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends one line and flushes it; throws Error naming the path and the system's reason
  // when either fails (a full disk).
  void write(const JsonObject& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace trireme::obs
