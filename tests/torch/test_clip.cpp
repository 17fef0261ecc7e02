// Global gradient-norm clipping (optim/clip.h): the norm and the scaled gradients against a
// hand computation, parameters that do not count or have no gradient, a rank that holds no
// gradient at all, and a NaN or infinite norm, which must throw before any gradient changes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ranks.h"
#include "trireme/common/error.h"
#include "trireme/optim/clip.h"

using trireme::optim::clip_grad_norm;
using trireme::optim::NormSharing;
using trireme::testing::run_ranks;

namespace {

// A double parameter whose gradient is `grad` (double, so the hand computation is exact to
// far below the 1e-6 the tests allow).
at::Tensor param_with_grad(const std::vector<double>& grad) {
  at::Tensor p = at::zeros({static_cast<int64_t>(grad.size())}, at::kDouble).requires_grad_();
  p.mutable_grad() = at::tensor(grad, at::kDouble);
  return p;
}

void expect_grad(const at::Tensor& p, const std::vector<double>& want) {
  ASSERT_EQ(p.grad().numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(p.grad()[static_cast<int64_t>(i)].item<double>(), want[i], 1e-6) << "entry " << i;
}

}  // namespace

TEST(Clip, ScalesToMaxNormAndSkipsUncountedInTheNorm) {
  // Counted: (3, 4) and (12): norm sqrt(9 + 16 + 144) = 13. The uncounted (100) (a copy held
  // by another rank) is scaled but not summed; a parameter without a gradient is skipped.
  const at::Tensor a = param_with_grad({3, 4}), b = param_with_grad({12}), copy = param_with_grad({100});
  const at::Tensor frozen = at::zeros({2}, at::kDouble).requires_grad_();
  const std::vector<at::Tensor> params{a, frozen, b, copy};
  const double norm = clip_grad_norm(params, 6.5, NormSharing{{}, {true, true, true, false}});
  EXPECT_NEAR(norm, 13.0, 1e-6);
  const double scale = 6.5 / (13.0 + 1e-6);  // clip.cpp's guard against a zero norm
  expect_grad(a, {3 * scale, 4 * scale});
  expect_grad(b, {12 * scale});
  expect_grad(copy, {100 * scale});
  EXPECT_FALSE(frozen.grad().defined());
}

TEST(Clip, LeavesGradientsUnderTheLimitOrWhenOff) {
  const at::Tensor a = param_with_grad({3, 4});
  EXPECT_NEAR(clip_grad_norm({a}, 5.0, {}), 5.0, 1e-6);  // at the limit: not scaled
  expect_grad(a, {3, 4});
  EXPECT_NEAR(clip_grad_norm({a}, 0.0, {}), 5.0, 1e-6);  // 0: clipping off, norm still given
  expect_grad(a, {3, 4});
  EXPECT_EQ(clip_grad_norm({}, 1.0, {}), 0.0);
}

TEST(Clip, NonFiniteNormThrowsAndLeavesGradients) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf}) {
    for (double max_norm : {1.0, 0.0}) {
      const at::Tensor a = param_with_grad({bad, 1}), b = param_with_grad({2});
      try {
        clip_grad_norm({a, b}, max_norm, {});
        ADD_FAILURE() << "no error for a gradient holding " << bad << ", max_norm " << max_norm;
      } catch (const trireme::Unrecoverable& e) {  // (a restart would replay the same step)
        EXPECT_NE(std::string(e.what()).find(std::isnan(bad) ? "norm is nan" : "norm is inf"),
                  std::string::npos)
            << e.what();
      }
      expect_grad(b, {2});  // nothing scaled (an infinite norm used to scale to 0)
    }
  }
}

TEST(Clip, RankWithoutGradientsJoinsTheSum) {
  // Rank 0 holds (3, 4), rank 1 no gradient at all (a ZeRO rank that owns no piece): both
  // get the global norm 5, and rank 0's gradients are scaled.
  std::vector<double> norms(2, -1);
  run_ranks(2, [&](int rank, const trireme::dist::Group& group) {
    const std::vector<at::Tensor> params =
        rank == 0 ? std::vector<at::Tensor>{param_with_grad({3, 4})} : std::vector<at::Tensor>{};
    norms[rank] = clip_grad_norm(params, 2.5, NormSharing{{group}, {}});
    if (rank == 0) expect_grad(params[0], {3 * 2.5 / (5 + 1e-6), 4 * 2.5 / (5 + 1e-6)});
  });
  EXPECT_NEAR(norms[0], 5.0, 1e-6);
  EXPECT_NEAR(norms[1], 5.0, 1e-6);
}

TEST(Clip, NonFiniteNormThrowsOnEveryRank) {
  // The sum is all-reduced first, so the rank without the NaN throws too and none hangs.
  std::vector<int> threw(2, 0);
  EXPECT_THROW(run_ranks(2,
                         [&](int rank, const trireme::dist::Group& group) {
                           const at::Tensor p = param_with_grad({rank == 0 ? std::nan("") : 1.0});
                           try {
                             clip_grad_norm({p}, 1.0, NormSharing{{group}, {}});
                           } catch (const trireme::Error&) {
                             threw[rank] = 1;
                             throw;
                           }
                         }),
               trireme::Error);
  EXPECT_EQ(threw, (std::vector<int>{1, 1}));
}
