// SVG line charts; see obs/plot.h.
#include "trireme/obs/plot.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "trireme/common/error.h"
#include "trireme/common/file_io.h"
#include "trireme/obs/json.h"

namespace trireme::obs {
namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

// A point is drawn when both coordinates are finite and within 1e300 (past which the
// axis's span, a difference, would overflow to infinity and every point with it).
bool plottable(const Series& s, size_t i) {
  return std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && std::fabs(s.x[i]) <= 1e300 && std::fabs(s.y[i]) <= 1e300;
}

}  // namespace

std::string line_chart_svg(const std::string& title, const std::string& x_label,
                           const std::string& y_label, const std::vector<Series>& series) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!plottable(s, i)) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * ph; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\""
      << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
      << xml_escape(title) << "</text>\n"
      << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#444\"/>\n";
  for (int t = 0; t <= 4; ++t) {  // grid and tick labels
    const double fy = y0 + (y1 - y0) * t / 4, fx = x0 + (x1 - x0) * t / 4;
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + pw << "\" y1=\"" << py(fy) << "\" y2=\""
        << py(fy) << "\" stroke=\"#ddd\"/>\n"
        << "<text x=\"" << kLeft - 6 << "\" y=\"" << py(fy) + 4 << "\" text-anchor=\"end\">"
        << number(fy) << "</text>\n"
        << "<text x=\"" << px(fx) << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">"
        << number(fx) << "</text>\n";
  }
  svg << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kHeight - 10 << "\" text-anchor=\"middle\">"
      << xml_escape(x_label) << "</text>\n"
      << "<text transform=\"translate(16," << kTop + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << xml_escape(y_label) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* color = kColors[k % 4];
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (plottable(s, i)) svg << number(px(s.x[i])) << "," << number(py(s.y[i])) << " ";
    svg << "\"/>\n<text x=\"" << kLeft + pw - 8 << "\" y=\"" << kTop + 16 + 16 * k
        << "\" text-anchor=\"end\" fill=\"" << color << "\">" << xml_escape(s.label) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

void write_text_file(const std::string& path, const std::string& text, const std::string& fix) {
  // Written to a temporary file of its own beside it (another writer of the same path
  // has another), flushed to the disk and renamed over it, and the rename made durable:
  // a crash or a power loss leaves the old file or the new one, never half of one that a
  // later command trips over.
  // (Named by process and call, created with the umask's permissions as any new file.)
  static std::atomic<uint64_t> calls{0};
  const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(calls++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  TRIREME_CHECK(fd >= 0, "cannot write ", path, " (", std::strerror(errno), "); ", fix);
  const char* failed = "failed writing ";  // what went wrong, when `error` says it did
  int error = write_all(fd, {{text.data(), text.size()}});
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) {
    error = errno;
    failed = "cannot replace ";
  }
  if (error != 0) {
    ::unlink(temporary.c_str());
    TRIREME_THROW(InvalidArgument, failed, path, " (", std::strerror(error), "); ", fix);
  }
  const std::string folder = std::filesystem::path(path).parent_path().string();
  sync_directory(folder.empty() ? "." : folder);
}

}  // namespace trireme::obs
