#include <gtest/gtest.h>

#include <set>

#include "trireme/cli/flags.h"
#include "trireme/common/error.h"

using trireme::cli::FlagParser;

TEST(Flags, ParsesValuesSwitchesAndPositionals) {
  int64_t steps = 10;
  double lr = 0.1;
  std::string out = "runs";
  bool verbose = false;
  FlagParser p("trireme train");
  p.add("steps", &steps, "steps");
  p.add("lr", &lr, "learning rate");
  p.add("out", &out, "dir");
  p.add_switch("verbose", &verbose, "talk");
  auto rest = p.parse({"gpt", "--steps", "7", "--lr=0.5", "--verbose", "--", "--x"});
  EXPECT_EQ(steps, 7);
  EXPECT_DOUBLE_EQ(lr, 0.5);
  EXPECT_TRUE(verbose);
  EXPECT_EQ(out, "runs");
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0], "gpt");
  EXPECT_EQ(rest[1], "--x");
}

TEST(Flags, RefusesUnknownAndNonNumeric) {
  int64_t steps = 0;
  FlagParser p("trireme train");
  p.add("steps", &steps, "steps");
  try {
    p.parse({"--stepz", "3"});
    FAIL() << "unknown flag accepted";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown flag --stepz"), std::string::npos) << e.what();
  }
  try {
    p.parse({"--steps", "ten"});
    FAIL() << "non-numeric accepted";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expects an integer, got 'ten'"), std::string::npos);
  }
  EXPECT_THROW(p.parse({"--steps"}), trireme::InvalidArgument);
}

// The message of the InvalidArgument that parsing `args` throws ("" if none).
static std::string parse_error(const FlagParser& p, const std::vector<std::string>& args) {
  try {
    p.parse(args);
  } catch (const trireme::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Flags, AMissingValueDoesNotTakeTheNextFlag) {
  std::string dump, dir;
  bool quiet = false, resume = false;
  FlagParser p("trireme train");
  p.add("dump-params", &dump, "file");
  p.add("checkpoint-dir", &dir, "dir");
  p.add_switch("quiet", &quiet, "quiet");
  p.add_switch("resume", &resume, "resume");
  EXPECT_NE(parse_error(p, {"--dump-params", "--quiet"})
                .find("--dump-params needs a value but is followed by --quiet; give the value (for one that "
                      "starts with --, write --dump-params=VALUE)"),
            std::string::npos);
  EXPECT_NE(parse_error(p, {"--checkpoint-dir", "--resume"}).find("--checkpoint-dir needs a value"),
            std::string::npos);
  EXPECT_EQ(dump, "");
  // Written with '=', such a value is taken as it is; a single dash is a value (-1, -x).
  p.parse({"--dump-params=--quiet", "--checkpoint-dir", "-x"});
  EXPECT_EQ(dump, "--quiet");
  EXPECT_EQ(dir, "-x");
  EXPECT_FALSE(quiet);
}

TEST(Flags, ARepeatedFlagTakesItsLastValue) {
  // A script's base flags, then its overrides: the last value wins, for every parse.
  int dp = 0;
  bool quiet = false;
  FlagParser p("trireme train");
  p.add("dp", &dp, "dp");
  p.add_switch("quiet", &quiet, "quiet");
  p.parse({"--dp", "2", "--quiet", "--dp=4"});
  EXPECT_EQ(dp, 4);
  EXPECT_TRUE(quiet);
  p.parse({"--dp", "2", "--nproc-per-node", "2", "--dp", "3"}, /*allow_unknown=*/true);
  EXPECT_EQ(dp, 3);
}

TEST(Flags, AnIntOutOfRangeNamesTheRange) {
  int dp = 0;
  FlagParser p("trireme train");
  p.add("dp", &dp, "dp");
  EXPECT_NE(parse_error(p, {"--dp", "99999999999"})
                .find("--dp is out of range: 99999999999; give an integer in -2147483648..2147483647"),
            std::string::npos);
}

TEST(Flags, HostPort) {
  std::string host;
  int port = -1;
  trireme::cli::parse_host_port("rdzv", "10.0.0.1:29500", &host, &port);
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 29500);
  EXPECT_THROW(trireme::cli::parse_host_port("rdzv", "nohost", &host, &port),
               trireme::InvalidArgument);
  EXPECT_THROW(trireme::cli::parse_host_port("rdzv", "h:70000", &host, &port),
               trireme::InvalidArgument);
}

TEST(Flags, RecordsWhichFlagsWereGivenAtTheirDefaultToo) {
  // A flag given at its default value is given: --plan and mode checks refuse it.
  int layers = 4, dp = 0;
  bool quiet = false;
  std::set<std::string> recorded = {"stale"};
  FlagParser p("trireme train");
  p.add("layers", &layers, "blocks");
  p.add("dp", &dp, "dp");
  p.add_switch("quiet", &quiet, "quiet");
  p.record_given(&recorded);
  p.parse({"--layers", "4", "--quiet"});
  EXPECT_TRUE(p.given("layers"));
  EXPECT_TRUE(p.given("quiet"));
  EXPECT_FALSE(p.given("dp"));
  EXPECT_EQ(recorded, (std::set<std::string>{"layers", "quiet"}));
  p.parse({"--dp=2"});  // each parse starts afresh
  EXPECT_FALSE(p.given("layers"));
  EXPECT_EQ(recorded, (std::set<std::string>{"dp"}));
}

TEST(Flags, AnEmptyValueIsRefused) {
  // An empty value read as the flag not given (--data '' trained on the bundled corpus).
  std::string data = "";
  int64_t steps = 1;
  FlagParser p("trireme train");
  p.add("data", &data, "file");
  p.add("steps", &steps, "steps");
  for (const auto& args : {std::vector<std::string>{"--data", ""}, std::vector<std::string>{"--data="}})
    EXPECT_EQ(parse_error(p, args),
              "--data needs a value, got an empty one; give --data VALUE, or leave the flag out for its default");
  EXPECT_NE(parse_error(p, {"--steps="}).find("--steps needs a value"), std::string::npos);
}

TEST(Flags, NumbersAreWrittenPlainly) {
  // strtoll/strtod took leading spaces, '+' and hexadecimal: refused.
  int64_t steps = 0;
  int dp = 0;
  double lr = 0;
  FlagParser p("trireme train");
  p.add("steps", &steps, "steps");
  p.add("dp", &dp, "dp");
  p.add("lr", &lr, "lr");
  for (const char* bad : {" 5", "+5", "\t5", "0x10", "5 "})
    EXPECT_EQ(parse_error(p, {"--steps", bad}), std::string("--steps expects an integer, got '") + bad + "'");
  for (const char* bad : {"0x10", "0X1p3", " 1", "+1", "inf", "nan", "-inf", "1e5x"})
    EXPECT_EQ(parse_error(p, {"--lr", bad}), std::string("--lr expects a finite number, got '") + bad + "'");
  p.parse({"--steps", "-1", "--dp", "007", "--lr", ".5"});
  EXPECT_EQ(steps, -1);
  EXPECT_EQ(dp, 7);
  EXPECT_DOUBLE_EQ(lr, 0.5);
  p.parse({"--lr", "-2.5e-3"});
  EXPECT_DOUBLE_EQ(lr, -2.5e-3);
  // Too long: the message states the limit.
  EXPECT_EQ(parse_error(p, {"--steps", "99999999999999999999"}),
            "--steps is out of range: 99999999999999999999; give an integer in "
            "-9223372036854775808..9223372036854775807");
  EXPECT_EQ(parse_error(p, {"--dp", "99999999999999999999"}),
            "--dp is out of range: 99999999999999999999; give an integer in -2147483648..2147483647");
  EXPECT_EQ(parse_error(p, {"--lr", "1e999"}),
            "--lr is out of range: 1e999; give a number of magnitude from 1e-307 to 1e308, or 0");
  std::string host;
  int port = 0;
  EXPECT_THROW(trireme::cli::parse_host_port("rdzv", "h:+80", &host, &port), trireme::InvalidArgument);
}
