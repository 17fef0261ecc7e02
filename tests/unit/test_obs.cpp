// Metrics JSON, the progress line and timeline merging (obs/).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "trireme/obs/json.h"
#include "trireme/obs/metrics.h"
#include "trireme/obs/progress.h"
#include "trireme/common/error.h"
#include "trireme/obs/timeline.h"

using namespace trireme::obs;

TEST(Json, ObjectAndEscaping) {
  JsonObject o;
  o.add("step", 3).add("loss", 2.123456789012).add("name", "a\"b\n").add("ok", true);
  EXPECT_EQ(o.str(), R"({"step": 3, "loss": 2.123456789, "name": "a\"b\n", "ok": true})");
  EXPECT_EQ(json_number(1.0 / 0.0), "null");
  EXPECT_EQ(json_number(-1.0 / 0.0), "null");
  EXPECT_EQ(json_number(std::nan("")), "null");
}

TEST(Progress, Formats) {
  EXPECT_EQ(format_duration(191), "3m11s");
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_count(18300), "18.3k");
  EXPECT_EQ(format_count(1.2e6), "1.20M");
  // A value never prints as 1000 of a unit: it takes the next one.
  EXPECT_EQ(format_count(999.4), "999");
  EXPECT_EQ(format_count(999.6), "1.0k");
  EXPECT_EQ(format_count(999940), "999.9k");
  EXPECT_EQ(format_count(999960), "1.00M");
  EXPECT_EQ(format_duration(1e19), "?");  // past what a count of seconds holds
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

TEST(Timeline, RanksRoundTripThroughTheTsvFormIncludingEmptyRanks) {
  RankEvents ranks(3);  // rank 1 recorded nothing
  ranks[0].push_back({"F m3 c0", "pipeline", Lane::kCompute, 1712.25, 50,
                      R"({"micro": 3, "chunk": 0, "step": 2})", "3"});
  ranks[0].push_back({"send-act m3 c0 -> 1", "pipeline", Lane::kComm, 1762.5, 4.125, "", ""});
  ranks[2].push_back({"optimizer", "compute", Lane::kCompute, 1.0e15 + 0.5, 0, "", ""});
  const std::string text = serialize_ranks(ranks);
  EXPECT_EQ(text.rfind("# trireme timeline v1 ranks=3\n# rank 0\n"
                       "0\t1712.250\t50.000\tpipeline\tF m3 c0\t{\"micro\": 3", 0), 0u)
      << text;
  EXPECT_NE(text.find("# rank 1\n# rank 2\n"), std::string::npos) << text;

  const RankEvents back = parse_ranks(text);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_TRUE(back[1].empty());
  ASSERT_EQ(back[0].size(), 2u);
  EXPECT_EQ(back[0][0].name, "F m3 c0");
  EXPECT_EQ(back[0][0].category, "pipeline");
  EXPECT_EQ(back[0][0].args_json, R"({"micro": 3, "chunk": 0, "step": 2})");
  EXPECT_EQ(back[0][0].label, "3");
  EXPECT_DOUBLE_EQ(back[0][0].start_us, 1712.25);
  EXPECT_EQ(back[0][1].lane, Lane::kComm);
  EXPECT_DOUBLE_EQ(back[0][1].duration_us, 4.125);
  EXPECT_TRUE(back[0][1].label.empty());
  ASSERT_EQ(back[2].size(), 1u);
  EXPECT_DOUBLE_EQ(back[2][0].start_us, 1.0e15 + 0.5);  // wall-clock microseconds keep 0.5
  EXPECT_EQ(serialize_ranks(back), text);

  // A file saved with CRLF line endings reads the same.
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  EXPECT_EQ(serialize_ranks(parse_ranks(crlf)), text);

  EXPECT_TRUE(parse_ranks(serialize_ranks({})).empty());
  EXPECT_EQ(parse_ranks(serialize_ranks(RankEvents(2))).size(), 2u);
  // Separators inside a field cannot break the line structure.
  RankEvents odd(1);
  odd[0].push_back({"a\tb\nc", "compute", Lane::kCompute, 0, 1, "", "x\ty"});
  const RankEvents odd_back = parse_ranks(serialize_ranks(odd));
  ASSERT_EQ(odd_back[0].size(), 1u);
  EXPECT_EQ(odd_back[0][0].name, "a b c");
  EXPECT_EQ(odd_back[0][0].label, "x y");
}

TEST(Timeline, MalformedTsvIsRefusedNamingTheLine) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      parse_ranks(text);
    } catch (const trireme::InvalidArgument& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto has = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  const std::string header = "# trireme timeline v1 ranks=2\n";
  const std::string event = "0\t10.000\t5.000\tpipeline\tF m0 c0\t\t0\n";
  ASSERT_EQ(parse_ranks(header + "# rank 0\n" + event + "# rank 1\n").size(), 2u);

  EXPECT_TRUE(has(error_of(""), "no header")) << error_of("");
  EXPECT_TRUE(has(error_of("# rank 0\n"), "line 1: expected the header")) << error_of("# rank 0\n");
  EXPECT_TRUE(has(error_of("# trireme timeline v2 ranks=1\n"), "line 1"));
  const std::string no_rank = header + event;
  EXPECT_TRUE(has(error_of(no_rank), "line 2: expected '# rank 0'")) << error_of(no_rank);
  const std::string skipped = header + "# rank 1\n";
  EXPECT_TRUE(has(error_of(skipped), "line 2: expected '# rank 0'")) << error_of(skipped);
  const std::string too_many = header + "# rank 0\n# rank 1\n# rank 2\n";
  EXPECT_TRUE(has(error_of(too_many), "line 4")) << error_of(too_many);
  const std::string truncated = header + "# rank 0\n" + event;
  EXPECT_TRUE(has(error_of(truncated), "declares 2 ranks but 1 follow")) << error_of(truncated);
  const std::string few_fields = header + "# rank 0\n" + event + "0\t1\t2\n# rank 1\n";
  EXPECT_TRUE(has(error_of(few_fields), "line 4: expected 7 tab-separated fields"))
      << error_of(few_fields);
  const std::string bad_number = header + "# rank 0\n0\tten\t5\tcompute\tforward\n# rank 1\n";
  EXPECT_TRUE(has(error_of(bad_number), "line 3: start_us must be a number, got 'ten'"))
      << error_of(bad_number);
  const std::string bad_lane = header + "# rank 0\n# rank 1\n7\t1\t5\tcompute\tforward\n";
  EXPECT_TRUE(has(error_of(bad_lane), "line 4: lane must be 0")) << error_of(bad_lane);
  EXPECT_THROW(Timeline::parse("0\t1\t-5\tcompute\tforward\n"), trireme::InvalidArgument);
  // Times far past any wall clock would make the picture's axis inf or NaN.
  for (const char* times : {"1e308\t5", "-1e308\t5", "1e18\t5", "10\t1e18"}) {
    const std::string huge = header + "# rank 0\n# rank 1\n0\t" + times + "\tcompute\tforward\n";
    EXPECT_TRUE(has(error_of(huge), "line 4: start_us and duration_us must be at most 1e17"))
        << error_of(huge);
  }
  EXPECT_EQ(parse_ranks(header + "# rank 0\n# rank 1\n0\t-1e17\t1e17\tcompute\tforward\n")[1].size(), 1u);
  // Numbers are plain decimals (strtod alone would take " 10", "0x10" and "inf").
  for (const char* start : {" 10", "0x10", "inf", "+10"}) {
    const std::string odd = header + "# rank 0\n# rank 1\n0\t" + start + "\t5\tcompute\tforward\n";
    EXPECT_TRUE(has(error_of(odd), "line 4: start_us must be a number")) << error_of(odd);
  }
  // The args go into trace.json as they are: they must be a JSON object.
  for (const char* args : {"{\"bytes\": 6", "[1]", "7", "{} x"}) {
    const std::string bad = header + "# rank 0\n# rank 1\n0\t1\t5\tcompute\tforward\t" + args + "\n";
    EXPECT_TRUE(has(error_of(bad), "line 4: args_json must be a JSON object or empty")) << error_of(bad);
  }
}

TEST(Timeline, SvgRowsCanBeNamed) {
  RankEvents rows(2);
  rows[1].push_back({"F m0 c0", "pipeline", Lane::kCompute, 0, 1000, "", "0"});
  rows[1].push_back({"recv-act m0 c0 <- 0", "pipeline", Lane::kComm, 0, 10, "", ""});
  const std::string svg = timeline_svg("run <x>", rows, {"stage 0 (rank 0)", "stage 1 (rank 2)"});
  EXPECT_NE(svg.find("stage 1 (rank 2) compute"), std::string::npos);
  EXPECT_NE(svg.find("stage 1 (rank 2) comm"), std::string::npos);
  EXPECT_NE(svg.find("run &lt;x&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">0</text>"), std::string::npos);  // the label inside the F box
  EXPECT_THROW(timeline_svg("x", rows, {"one name"}), trireme::Error);
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
  // Points that cannot be placed (a coordinate not finite, or so large that the axis's
  // span overflows) are left out; the others are drawn where they would be without them.
  Series odd{"loss", {1, std::nan(""), 2, 3, 3.5, 4}, {5.5, 1.0, 4.0, 3.0, -1e308, 2.5}};
  const std::string drawn = line_chart_svg("t", "step", "loss", {odd});
  EXPECT_EQ(drawn.find("nan"), std::string::npos);
  EXPECT_EQ(drawn.find("inf"), std::string::npos);
  EXPECT_NE(drawn.find("points=\"70,40 "), std::string::npos) << drawn;
  EXPECT_NE(drawn.find(" 700,370 \""), std::string::npos) << drawn;
}

TEST(Json, XmlEscapeKeepsTheDocumentWellFormed) {
  EXPECT_EQ(xml_escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
  EXPECT_EQ(xml_escape("tab\tnl\ncr\r"), "tab\tnl\ncr\r");
  EXPECT_EQ(xml_escape(std::string("a\x01" "b\x1f", 4)), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(xml_escape("ünï"), "ünï");
}

TEST(Json, InvalidUtf8BecomesReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  // Well-formed sequences of 2, 3 and 4 bytes pass through.
  const std::string good = "\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
  EXPECT_EQ(xml_escape(good), good);
  EXPECT_EQ(json_escape(good), "\"" + good + "\"");
  // Latin-1 'é', a stray continuation byte, a cut sequence, an overlong '/', a surrogate,
  // a code point above U+10FFFF: one U+FFFD per byte.
  EXPECT_EQ(xml_escape("caf\xE9"), "caf" + fffd);
  EXPECT_EQ(xml_escape("\x80x"), fffd + "x");
  EXPECT_EQ(xml_escape("a\xE2\x82"), "a" + fffd + fffd);
  EXPECT_EQ(xml_escape("\xC0\xAF"), fffd + fffd);
  EXPECT_EQ(xml_escape("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(xml_escape("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(xml_escape("<\xFF>"), "&lt;" + fffd + "&gt;");
  // U+FFFE and U+FFFF are well-formed UTF-8 that XML 1.0 does not allow; JSON carries them.
  EXPECT_EQ(xml_escape("a\xEF\xBF\xBE" "b\xEF\xBF\xBF"), "a" + fffd + "b" + fffd);
  EXPECT_EQ(xml_escape("\xEF\xBF\xBD"), fffd);
  EXPECT_EQ(json_escape("\xEF\xBF\xBF"), "\"\xEF\xBF\xBF\"");
  EXPECT_EQ(json_escape("caf\xE9\n"), "\"caf" + fffd + "\\n\"");
  // Through timeline.svg, as a Latin-1 name in timeline.tsv would go.
  RankEvents rows(1);
  rows[0].push_back({"caf\xE9", "compute", Lane::kCompute, 0, 1000, "", "\xE9"});
  const std::string svg = timeline_svg("t\xE9", rows, {"r\xE9"});
  EXPECT_EQ(svg.find("\xE9"), std::string::npos);
  EXPECT_NE(svg.find("caf" + fffd), std::string::npos);
}

TEST(Plot, WriteTextFileReportsAFailedRenameAndLeavesNoTemporary) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("trireme-test-obs-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "taken");
  write_text_file((dir / "ok.svg").string(), "<svg/>\n");
  std::ifstream in(dir / "ok.svg");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "<svg/>");
  write_text_file((dir / "ok.svg").string(), "<svg/>\n");  // over the first, as a rerun does
  // A path that is an existing directory: the rename fails, and that is what is reported.
  const std::string taken = (dir / "taken").string();
  try {
    write_text_file(taken, "x", "give --out a file");
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const trireme::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot replace " + taken + " ("), std::string::npos) << what;
    EXPECT_NE(what.find("); give --out a file"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_TRUE(fs::is_directory(dir / "taken"));
  EXPECT_THROW(write_text_file((dir / "missing" / "x.svg").string(), "x"), trireme::InvalidArgument);
  // No temporary is left behind, neither by the writes nor by the failed one.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ok.svg", "taken"}));
  // With the umask's permissions, as any new file (the test runs on one thread here).
  const mode_t umask_now = ::umask(0);
  ::umask(umask_now);
  EXPECT_EQ(static_cast<mode_t>(fs::status(dir / "ok.svg").permissions()), 0666 & ~umask_now);
  fs::remove_all(dir);
}

TEST(Metrics, AFullDiskIsReportedNotIgnored) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  MetricsWriter writer("/dev/full");
  try {
    writer.write(JsonObject().add("step", 1));
    ADD_FAILURE() << "expected trireme::Error";
  } catch (const trireme::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/dev/full"), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(ENOSPC)), std::string::npos) << what;
  }
}
