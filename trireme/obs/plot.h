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

// Writes `svg` to `path`; throws InvalidArgument when it cannot.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace trireme::obs
