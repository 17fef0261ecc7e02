// Metrics JSON, the progress line and timeline merging (obs/).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "trireme/obs/json.h"
#include "trireme/obs/progress.h"
#include "trireme/common/error.h"
#include "trireme/obs/timeline.h"

using namespace trireme::obs;

TEST(Json, ObjectAndEscaping) {
  JsonObject o;
  o.add("step", 3).add("loss", 2.123456789012).add("name", "a\"b\n").add("ok", true);
  EXPECT_EQ(o.str(), R"({"step": 3, "loss": 2.123456789, "name": "a\"b\n", "ok": true})");
  EXPECT_EQ(json_number(1.0 / 0.0), "null");
}

TEST(Progress, Formats) {
  EXPECT_EQ(format_duration(191), "3m11s");
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_count(18300), "18.3k");
  EXPECT_EQ(format_count(1.2e6), "1.20M");
  ProgressState s{42, 200, 2.41371, 18300, 1.21};
  EXPECT_EQ(format_progress(s), "step  42/200 | loss 2.4137 | 18.3k tok/s | 1.21 s/step | ETA 3m11s");
}

TEST(Timeline, SerializesAndRendersEveryRank) {
  RankEvents ranks;
  for (int rank = 0; rank < 2; ++rank) {
    Timeline t(rank);
    t.add({"forward", "compute", Lane::kCompute, 1000.0 + rank, 50, ""});
    t.add({"allreduce bucket 0", "comm", Lane::kComm, 1060, 20, R"({"bytes": 64})"});
    // Through the text form, as the ranks' timelines travel to rank 0.
    ranks.push_back(Timeline::parse(t.serialize()));
  }
  ASSERT_EQ(ranks[1].size(), 2u);
  EXPECT_EQ(ranks[1][0].name, "forward");
  EXPECT_DOUBLE_EQ(ranks[1][0].start_us, 1001.0);
  EXPECT_EQ(ranks[1][1].lane, Lane::kComm);
  EXPECT_EQ(ranks[1][1].args_json, R"({"bytes": 64})");

  const std::string s = chrome_trace_json(ranks);
  EXPECT_NE(s.find("\"name\": \"rank 1\""), std::string::npos);
  EXPECT_NE(s.find("\"ts\": 1001.000"), std::string::npos);
  EXPECT_NE(s.find("\"args\": {\"bytes\": 64}"), std::string::npos);
  size_t count = 0;  // 2 ranks x (3 metadata + 2 events)
  for (size_t at = s.find("\"ph\""); at != std::string::npos; at = s.find("\"ph\"", at + 1)) ++count;
  EXPECT_EQ(count, 10u);

  const std::string svg = timeline_svg("steps 2-4", ranks);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("rank 1 comm"), std::string::npos);
  size_t boxes = 0;
  for (size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) ++boxes;
  EXPECT_EQ(boxes, 4u);
  EXPECT_THROW(Timeline::parse("1\t2\n"), trireme::InvalidArgument);
}

#include "trireme/obs/plot.h"

TEST(Plot, LossCurveSvgHasTheSeriesAndLabels) {
  Series loss{"loss", {1, 2, 3, 4}, {5.5, 4.0, 3.0, 2.5}};
  const std::string svg = line_chart_svg("GPT <demo>", "step", "loss", {loss});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("GPT &lt;demo&gt;"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  // First point at the left edge and top (highest loss), last at the right and bottom.
  EXPECT_NE(svg.find("points=\"70,40 "), std::string::npos);
  EXPECT_NE(svg.find(" 700,370 \""), std::string::npos);
  EXPECT_NE(line_chart_svg("empty", "x", "y", {}).find("</svg>"), std::string::npos);
}
