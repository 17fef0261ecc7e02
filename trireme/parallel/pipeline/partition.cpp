// Contiguous layer partitioning; see parallel/pipeline/partition.h.
//
// balance_partition is the classic linear-partition dynamic programme: best[k][i] is the
// smallest possible largest part when the first i layers form k parts;
//   best[k][i] = min over j < i of max(best[k-1][j], sum(costs[j..i)))
// O(parts * layers^2), instant for the layer counts of real models.
#include "trireme/parallel/pipeline/partition.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "trireme/common/error.h"

namespace trireme::pipeline {

std::vector<LayerRange> balance_partition(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  TRIREME_CHECK(parts >= 1, "a pipeline needs at least one part, got ", parts);
  TRIREME_CHECK(n >= parts, "cannot split ", n, " layers into ", parts,
                " pipeline parts (pp x chunks); use fewer stages or chunks, or more layers");
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    TRIREME_CHECK(costs[i] >= 0, "layer ", i, " has a negative cost ", costs[i]);
    prefix[i + 1] = prefix[i] + costs[i];
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        const double worst = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        // Strictly better only, scanning j upwards: ties keep the earliest cut.
        if (worst < best[k][i] - 1e-12 * std::max(1.0, prefix[n])) {
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
  std::vector<LayerRange> ranges(parts);
  for (int k = parts, i = n; k >= 1; --k) {
    ranges[k - 1] = {cut[k][i], i};
    i = cut[k][i];
  }
  return ranges;
}

std::vector<LayerRange> parse_split(const std::string& text, int layers, int parts) {
  std::vector<LayerRange> ranges;
  // (getline drops a last empty item: "0:2,2:4," was taken as two parts.)
  TRIREME_CHECK(text.empty() || text.back() != ',', "--pp-split '", text, "' ends with a comma; drop it");
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto colon = item.find(':');
    TRIREME_CHECK(colon != std::string::npos, "--pp-split item '", item,
                  "' is not BEGIN:END; write e.g. --pp-split 0:3,3:6");
    auto number = [&](const std::string& s) {
      // Digits only: strtol alone also takes leading spaces, a sign and "-0".
      errno = 0;
      char* end = nullptr;
      const long v = std::strtol(s.c_str(), &end, 10);
      TRIREME_CHECK(!s.empty() && std::isdigit(static_cast<unsigned char>(s[0])) && *end == '\0' && errno == 0 &&
                        v <= INT_MAX,
                    "--pp-split item '", item, "' is not BEGIN:END with layer numbers");
      return static_cast<int>(v);
    };
    ranges.push_back({number(item.substr(0, colon)), number(item.substr(colon + 1))});
  }
  TRIREME_CHECK(static_cast<int>(ranges.size()) == parts, "--pp-split names ", ranges.size(),
                " parts but the pipeline has ", parts, " (pp x chunks)");
  int expect = 0;
  for (const auto& r : ranges) {
    TRIREME_CHECK(r.begin == expect, "--pp-split part ", r.begin, ":", r.end, " should start at layer ",
                  expect, " (parts must be contiguous and in order)");
    TRIREME_CHECK(r.end > r.begin, "--pp-split part ", r.begin, ":", r.end, " is empty");
    expect = r.end;
  }
  TRIREME_CHECK(expect == layers, "--pp-split ends at layer ", expect, " but the model has ",
                layers, " layers");
  return ranges;
}

std::string format_split(const std::vector<LayerRange>& ranges) {
  std::ostringstream out;
  for (size_t i = 0; i < ranges.size(); ++i)
    out << (i ? "," : "") << ranges[i].begin << ":" << ranges[i].end;
  return out.str();
}

}  // namespace trireme::pipeline
