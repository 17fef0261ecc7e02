#include <gtest/gtest.h>

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
