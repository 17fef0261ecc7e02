#include "trireme/obs/metrics.h"

#include <cerrno>
#include <cstring>

#include "trireme/common/error.h"

namespace trireme::obs {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), file_(std::fopen(path.c_str(), append ? "a" : "w")) {
  TRIREME_CHECK(file_, "cannot open ", path, " for writing (", std::strerror(errno),
                "); choose a writable --out directory");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const JsonObject& record) {
  const std::string line = record.str();
  // Checked: on a full disk the line stays in the buffer and fflush fails (ENOSPC).
  if (std::fprintf(file_, "%s\n", line.c_str()) < 0 || std::fflush(file_) != 0)
    TRIREME_THROW(Error, "cannot append to ", path_, " (", std::strerror(errno),
                  "); free space on its disk or choose another --out directory");
}

}  // namespace trireme::obs
