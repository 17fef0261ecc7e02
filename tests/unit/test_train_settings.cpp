// Settings checked and derived before training starts, without libtorch: the learning-rate
// schedule (optim/lr_schedule.h) against hand-computed values, its edge cases and its
// purity (a resumed run replays it from the step alone), the GPT shape checks
// (models/gpt_config.h), and the refusals of `trireme train gpt`'s flags
// (cli/train_options.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "trireme/cli/flags.h"
#include "trireme/cli/train_options.h"
#include "trireme/common/error.h"
#include "trireme/models/gpt_config.h"
#include "trireme/optim/lr_schedule.h"
#include "trireme/plan/plan.h"

using trireme::InvalidArgument;
using trireme::cli::TrainOptions;
using trireme::models::GptConfig;
using trireme::optim::LrSchedule;

namespace {

constexpr double kTol = 1e-15;

std::string validate_error(const GptConfig& c) {
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LrScheduleTest, WarmUpRampsLinearlyToPeak) {
  const LrSchedule s{1e-3, 1e-4, 4, 12};
  EXPECT_NEAR(s.at(0), 2.5e-4, kTol);
  EXPECT_NEAR(s.at(1), 5.0e-4, kTol);
  EXPECT_NEAR(s.at(2), 7.5e-4, kTol);
  EXPECT_NEAR(s.at(3), 1.0e-3, kTol);
}

TEST(LrScheduleTest, CosineDecayAtKnownPoints) {
  // Decay over the 8 steps after warm-up: p = (s - 4) / 8.
  const LrSchedule s{1e-3, 1e-4, 4, 12};
  EXPECT_NEAR(s.at(4), 1e-3, kTol);                                                // p = 0
  EXPECT_NEAR(s.at(6), 1e-4 + 9e-4 * (1 + std::sqrt(0.5)) / 2, kTol);              // p = 1/4
  EXPECT_NEAR(s.at(8), 5.5e-4, kTol);                                              // p = 1/2
  EXPECT_NEAR(s.at(10), 1e-4 + 9e-4 * (1 - std::sqrt(0.5)) / 2, kTol);             // p = 3/4
  EXPECT_NEAR(s.at(11), 1e-4 + 9e-4 * (1 + std::cos(M_PI * 7 / 8)) / 2, kTol);     // the last step
  EXPECT_NEAR(s.at(12), 1e-4, kTol);                                               // p = 1: floor
  EXPECT_NEAR(s.at(1000), 1e-4, kTol);                                             // stays there
  for (int64_t step = 4; step < 12; ++step) EXPECT_GT(s.at(step), s.at(step + 1)) << step;
}

TEST(LrScheduleTest, NoWarmUpStartsAtPeak) {
  const LrSchedule s{2e-3, 0, 0, 4};
  EXPECT_NEAR(s.at(0), 2e-3, kTol);
  EXPECT_NEAR(s.at(1), 2e-3 * (1 + std::sqrt(0.5)) / 2, kTol);
  EXPECT_NEAR(s.at(2), 1e-3, kTol);
  EXPECT_NO_THROW(s.validate());
}

TEST(LrScheduleTest, WarmUpAsLongAsTheRun) {
  const LrSchedule s{1e-3, 1e-4, 5, 5};
  for (int64_t step = 0; step < 5; ++step) EXPECT_NEAR(s.at(step), 1e-3 * (step + 1) / 5, kTol);
  EXPECT_NO_THROW(s.validate());
}

TEST(LrScheduleTest, SingleStepRunsAtPeak) {
  EXPECT_NEAR((LrSchedule{1e-3, 1e-4, 0, 1}.at(0)), 1e-3, kTol);
  EXPECT_NEAR((LrSchedule{1e-3, 1e-4, 1, 1}.at(0)), 1e-3, kTol);
  EXPECT_NO_THROW((LrSchedule{1e-3, 1e-4, 0, 1}.validate()));
  EXPECT_NO_THROW((LrSchedule{1e-3, 1e-4, 1, 1}.validate()));
}

TEST(LrScheduleTest, FloorEqualToPeakIsConstant) {
  const LrSchedule s{3e-4, 3e-4, 2, 10};
  for (int64_t step = 2; step < 10; ++step) EXPECT_DOUBLE_EQ(s.at(step), 3e-4) << step;
}

TEST(LrScheduleTest, ValueDependsOnTheStepAlone) {
  // A resumed run asks for its first step without having asked for the earlier ones: the
  // values must be bit for bit those of the uninterrupted run, in any order, from a copy.
  const LrSchedule s{6e-4, 6e-5, 7, 50};
  std::vector<double> forward;
  for (int64_t step = 0; step < 50; ++step) forward.push_back(s.at(step));
  const LrSchedule resumed = s;
  for (int64_t step = 49; step >= 0; --step) EXPECT_EQ(resumed.at(step), forward[step]) << step;
  for (int64_t step : {31, 3, 49, 7, 0, 31}) EXPECT_EQ(s.at(step), forward[step]) << step;
}

TEST(LrScheduleTest, ValidateNamesTheFlag) {
  auto error = [](const LrSchedule& s) {
    try {
      s.validate();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({1e-3, 1e-4, 11, 10}), "--warmup 11 must be between 0 and --steps 10");
  EXPECT_EQ(error({1e-3, 1e-4, -1, 10}), "--warmup -1 must be between 0 and --steps 10");
  EXPECT_EQ(error({0, 0, 0, 10}), "--lr must be positive, got 0");
  EXPECT_NE(error({1e-3, 2e-3, 0, 10}).find("--min-lr 0.002 is outside [0, --lr 0.001]"), std::string::npos);
  EXPECT_NE(error({1e-3, -1e-4, 0, 10}).find("--min-lr"), std::string::npos);
  EXPECT_NE(error({std::nan(""), 0, 0, 10}).find("--lr"), std::string::npos);
  EXPECT_EQ(error({1e-3, 1e-4, 1, 10}), "");
}

TEST(GptConfigTest, EveryBadShapeGetsOneLine) {
  auto with = [](auto field, int64_t value) {
    GptConfig c;
    c.*field = value;
    return validate_error(c);
  };
  EXPECT_EQ(validate_error(GptConfig{}), "");
  for (int64_t bad : {0, -3}) {
    const std::string got = std::to_string(bad);
    EXPECT_EQ(with(&GptConfig::vocab, bad), "--vocab must be positive, got " + got);
    EXPECT_EQ(with(&GptConfig::seq_len, bad), "--seq must be positive, got " + got);
    EXPECT_EQ(with(&GptConfig::layers, bad), "--layers must be positive, got " + got);
    EXPECT_EQ(with(&GptConfig::dim, bad), "--dim must be positive, got " + got);
    EXPECT_EQ(with(&GptConfig::heads, bad), "--heads must be positive, got " + got);
    EXPECT_EQ(with(&GptConfig::mlp_ratio, bad), "--mlp-ratio must be positive, got " + got);
  }
  EXPECT_EQ(with(&GptConfig::dim, 130),
            "--dim 130 is not divisible by --heads 4; choose a dim that is a multiple of heads");
  EXPECT_EQ(with(&GptConfig::heads, 256),  // more heads than dimensions
            "--dim 128 is not divisible by --heads 256; choose a dim that is a multiple of heads");
  for (double bad : {-0.1, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
    GptConfig c;
    c.dropout = bad;
    EXPECT_NE(validate_error(c).find("--dropout"), std::string::npos) << bad;
  }
  for (const std::string& error : {validate_error(GptConfig{}), with(&GptConfig::dim, 130)})
    EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(GptConfigTest, SizesBeyondCountingAreRejected) {
  // --dim 10^11 would overflow num_parameters() (C*C alone is 10^22).
  GptConfig huge;
  huge.dim = 100000000000;
  huge.heads = 1;
  const std::string error = validate_error(huge);
  EXPECT_EQ(error.find("the model --vocab 256 --seq 128 --layers 4 --dim 100000000000 --heads 1 "
                       "--mlp-ratio 4 has "),
            0u)
      << error;
  EXPECT_NE(error.find("choose smaller sizes"), std::string::npos) << error;
  // A 175-billion-parameter GPT-3 is well inside the limit, and counted exactly.
  GptConfig gpt3;
  gpt3.vocab = 50257;
  gpt3.seq_len = 2048;
  gpt3.layers = 96;
  gpt3.dim = 12288;
  gpt3.heads = 96;
  EXPECT_EQ(validate_error(gpt3), "");
  EXPECT_GT(gpt3.num_parameters(), 174000000000);
  EXPECT_LT(gpt3.num_parameters(), 177000000000);
}

namespace {

// The options `trireme train gpt ARGS` parses (FlagParser records which flags were given).
TrainOptions parsed(const std::vector<std::string>& args) {
  TrainOptions o;
  trireme::cli::FlagParser parser("trireme train");
  trireme::cli::add_train_flags(parser, &o);
  parser.parse(args);
  return o;
}

// The message validate_train_options throws for `args` on `world` ranks ("" if none).
std::string train_error(const std::vector<std::string>& args, int world = 1) {
  TrainOptions o = parsed(args);
  try {
    trireme::cli::validate_train_options(&o, world);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// A plan of dp 2 for a 2-block model (as `trireme plan --evaluate --dp 2` writes).
trireme::plan::Plan dp2_plan() {
  trireme::plan::Plan p;
  p.model.layers = 2;
  p.global_batch = 8;
  p.dp = 2;
  return p;
}

std::string plan_error(const std::vector<std::string>& args) {
  TrainOptions o = parsed(args);
  try {
    trireme::cli::apply_plan(dp2_plan(), "p.json", &o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainOptionsTest, AFlagGivenAtItsDefaultStillContradictsAPlan) {
  // --layers 4 is the default: it was taken as not given, and the plan's 2 layers ran.
  EXPECT_EQ(plan_error({"--layers", "4"}),
            "--layers 4 contradicts the plan p.json, which sets 2; drop --layers (the plan fixes the layout, batch "
            "and model) or plan again");
  EXPECT_NE(plan_error({"--dp", "0"}).find("--dp 0 contradicts the plan p.json, which sets 2"), std::string::npos);
  EXPECT_NE(plan_error({"--pp", "1", "--tp", "1", "--batch", "16"}).find("--batch 16 contradicts"), std::string::npos);
  // The plan's own values, and flags left out, are fine.
  EXPECT_EQ(plan_error({"--layers", "2", "--dp", "2", "--pp", "1", "--batch", "8"}), "");
  EXPECT_EQ(plan_error({}), "");
  // Options built in code (nothing parsed) count a value apart from the default as given.
  TrainOptions o;
  o.tp = 2;
  EXPECT_THROW(trireme::cli::apply_plan(dp2_plan(), "p.json", &o), InvalidArgument);
}

TEST(TrainOptionsTest, ReplicaBatchesAreCheckedBeforeTheySum) {
  // Values past 64 bits were saturated by strtoll, and two of 2^62 summed past int64_t.
  const std::vector<std::string> base = {"--batch", "8", "--dp", "2", "--replica-batches"};
  auto with = [&](const std::string& batches) {
    auto args = base;
    args.push_back(batches);
    return train_error(args, 2);
  };
  EXPECT_EQ(with("99999999999999999999,1"),
            "--replica-batches 99999999999999999999,1: 99999999999999999999 sequences are more than --batch 8; give "
            "each replica a share of the batch");
  EXPECT_NE(with("4611686018427387904,4611686018427387904").find("sequences are more than --batch 8"),
            std::string::npos);
  EXPECT_NE(with("9,1").find("9 sequences are more than --batch 8"), std::string::npos);
  for (const char* bad : {"+6,2", " 6,2", "6, 2"})
    EXPECT_NE(with(bad).find("is not a positive number of sequences"), std::string::npos) << bad;
  EXPECT_EQ(with("6,2"), "");
}

TEST(TrainOptionsTest, EachCountNamesItsOwnFlagAndValue) {
  EXPECT_EQ(train_error({"--warmup", "-7"}), "--warmup must be >= 0 steps (or -1: a tenth of --steps), got -7");
  EXPECT_EQ(train_error({"--warmup", "-1"}), "");  // the documented "a tenth of --steps"
  EXPECT_EQ(train_error({"--log-every", "0"}),
            "--log-every must be at least 1 (a progress line every N steps), got 0");
  EXPECT_EQ(train_error({"--bucket-mb", "0"}), "--bucket-mb must be in (0, 1048576] MiB, got 0");
  EXPECT_EQ(train_error({"--first-bucket-mb", "-1"}), "--first-bucket-mb must be in (0, 1048576] MiB, got -1");
  EXPECT_EQ(train_error({"--trace-steps", "-1"}), "--trace-steps must be >= 0 (0: no trace), got -1");
  EXPECT_EQ(train_error({"--sample-tokens", "-1"}), "--sample-tokens must be >= 0 (0: no sample), got -1");
}

TEST(TrainOptionsTest, FlagsThatWouldBeIgnoredAreRefused) {
  EXPECT_EQ(train_error({"--keep-checkpoints", "3"}),
            "--keep-checkpoints applies only with --checkpoint-every N (no checkpoints are written without it); add "
            "--checkpoint-every or drop --keep-checkpoints");
  EXPECT_EQ(train_error({"--keep-checkpoints", "3", "--checkpoint-every", "5"}), "");
  EXPECT_EQ(train_error({"--pp-balance", "time"}),
            "--pp-balance applies only to a pipeline split by measurement: there is no pipeline (pp 1); drop "
            "--pp-balance");
  EXPECT_NE(train_error({"--pp", "2", "--pp-split", "0:3,3:6", "--pp-balance", "params"}, 2)
                .find("--pp-split gives the split; drop --pp-balance"),
            std::string::npos);
  EXPECT_EQ(train_error({"--pp", "2", "--pp-balance", "params"}, 2), "");
}

TEST(TrainOptionsTest, EmulatedSlowdownRanksAreCheckedInFull) {
  auto error = [](const std::string& flag, int world) {
    try {
      trireme::plan::check_slowdown(flag, world);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // atoi read 4294967297 as 1 (and 2^63 as -1, which passed "rank < world").
  EXPECT_EQ(error("4294967297:2", 2), "--emulate-slowdown '4294967297:2' names a rank past any job's; name ranks "
                                      "from 0");
  EXPECT_NE(error("9223372036854775808:2", 2).find("names a rank past any job's"), std::string::npos);
  EXPECT_EQ(error("1:2,1:3", 2), "--emulate-slowdown names rank 1 twice; give each rank once");
  EXPECT_EQ(error("2:2", 2), "--emulate-slowdown names rank 2 but the job has 2 ranks; name ranks 0..1");
  for (const char* bad : {"-1:2", "+1:2", " 1:2", "1:0x2", "1: 2", "1:+2", "1:", ":2"})
    EXPECT_NE(error(bad, 2).find("is not RANK:FACTOR"), std::string::npos) << bad;
  EXPECT_EQ(error("0:1.5,1:2", 2), "");
  EXPECT_DOUBLE_EQ(trireme::plan::slowdown_of("0:1.5,1:2", 1), 2);
}
