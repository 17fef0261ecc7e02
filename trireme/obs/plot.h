// Small SVG charts for things people would rather look at than read: the loss curve of
// a run (DIR/loss.svg). Pure; the output opens in any browser.
#pragma once

#include <string>
#include <vector>

namespace trireme::obs {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

// A line chart of one or more series with labelled axes and a title. Empty series are
// drawn as an empty frame.
std::string line_chart_svg(const std::string& title, const std::string& x_label,
                           const std::string& y_label, const std::vector<Series>& series);

// Writes `text` to `path` durably (through a temporary `path`.tmp.PID.N, fsynced and
// renamed over it); throws InvalidArgument naming the path, the system's reason and `fix`
// when it cannot, e.g. when `path` is a directory. The temporary file is removed on failure.
void write_text_file(const std::string& path, const std::string& text,
                     const std::string& fix = "choose a file in a directory you can write to");

}  // namespace trireme::obs
