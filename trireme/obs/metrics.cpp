#include "trireme/obs/metrics.h"

#include <cerrno>
#include <cstring>

#include "trireme/common/error.h"

namespace trireme::obs {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : file_(std::fopen(path.c_str(), append ? "a" : "w")) {
  TRIREME_CHECK(file_, "cannot open ", path, " for writing (", std::strerror(errno),
                "); choose a writable --out directory");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const JsonObject& record) {
  const std::string line = record.str();
  std::fprintf(file_, "%s\n", line.c_str());
  std::fflush(file_);
}

}  // namespace trireme::obs
