// deferred_linear: the weight-gradient half of backward can run later (zero-bubble W) and
// then gives exactly what an ordinary linear layer gives.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "trireme/common/error.h"
#include "trireme/parallel/pipeline/deferred_linear.h"
#include "trireme/parallel/pipeline/executor.h"
#include "trireme/parallel/pipeline/stage.h"

#include <torch/nn/modules/linear.h>

using namespace trireme::pipeline;

namespace {
struct Case {
  at::Tensor x, w, b;
};
Case make_case() {
  at::manual_seed(3);
  return {at::randn({2, 5, 4}).requires_grad_(true), at::randn({3, 4}).requires_grad_(true),
          at::randn({3}).requires_grad_(true)};
}
}  // namespace

TEST(DeferredLinear, ImmediateModeMatchesAtLinear) {
  Case a = make_case(), b = make_case();
  at::linear(a.x, a.w, a.b).pow(2).sum().backward();
  deferred_linear(b.x, b.w, b.b).pow(2).sum().backward();
  EXPECT_TRUE(at::allclose(a.x.grad(), b.x.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(a.w.grad(), b.w.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(a.b.grad(), b.b.grad(), 1e-6, 1e-6));
}

TEST(DeferredLinear, WeightGradientsWaitForTheQueue) {
  Case ref = make_case(), c = make_case();
  at::linear(ref.x, ref.w, ref.b).pow(2).sum().backward();
  WeightGradQueue queue;
  {
    DeferWeightGrads defer(queue);
    deferred_linear(c.x, c.w, c.b).pow(2).sum().backward();
  }
  // B done: the input gradient is there, the weight gradients are not yet.
  EXPECT_TRUE(at::allclose(ref.x.grad(), c.x.grad(), 1e-6, 1e-6));
  EXPECT_FALSE(c.w.grad().defined());
  EXPECT_FALSE(c.b.grad().defined());
  EXPECT_EQ(queue.size(), 1u);
  queue.run_all();  // W
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_TRUE(at::allclose(ref.w.grad(), c.w.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(ref.b.grad(), c.b.grad(), 1e-6, 1e-6));
  // A second B + W accumulates, as AccumulateGrad would.
  {
    DeferWeightGrads defer(queue);
    deferred_linear(c.x, c.w, c.b).pow(2).sum().backward();
  }
  queue.run_all();
  EXPECT_TRUE(at::allclose(ref.w.grad() * 2, c.w.grad(), 1e-5, 1e-5));
}

TEST(DeferredLinear, WithoutBias) {
  Case ref = make_case(), c = make_case();
  at::linear(ref.x, ref.w).sum().backward();
  WeightGradQueue queue;
  {
    DeferWeightGrads defer(queue);
    deferred_linear(c.x, c.w, at::Tensor()).sum().backward();
  }
  EXPECT_FALSE(c.w.grad().defined());
  queue.run_all();
  EXPECT_TRUE(at::allclose(ref.w.grad(), c.w.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(ref.x.grad(), c.x.grad(), 1e-6, 1e-6));
}

TEST(DeferredLinear, AFrozenWeightGetsNoGradientAndIsNotReported) {
  // Fine-tuning freezes some weights: W must neither give them a gradient nor report them
  // (DataParallel knows only the parameters that require one, and would throw mid-step).
  for (const bool defer : {false, true}) {
    Case ref = make_case(), c = make_case();
    ref.w.requires_grad_(false);
    c.w.requires_grad_(false);
    at::linear(ref.x, ref.w, ref.b).pow(2).sum().backward();
    WeightGradQueue queue;
    {
      std::optional<DeferWeightGrads> scope;
      if (defer) scope.emplace(queue);
      deferred_linear(c.x, c.w, c.b).pow(2).sum().backward();
    }
    std::vector<std::string> reported;
    queue.run_all([&](const at::Tensor& p) { reported.push_back(p.is_same(c.b) ? "bias" : "other"); });
    EXPECT_FALSE(c.w.grad().defined()) << "defer " << defer;
    EXPECT_TRUE(at::allclose(ref.b.grad(), c.b.grad(), 1e-6, 1e-6)) << "defer " << defer;
    EXPECT_TRUE(at::allclose(ref.x.grad(), c.x.grad(), 1e-6, 1e-6)) << "defer " << defer;
    EXPECT_EQ(reported, defer ? std::vector<std::string>{"bias"} : std::vector<std::string>{});
  }
  // Weight and bias both frozen: nothing is queued.
  Case c = make_case();
  c.w.requires_grad_(false);
  c.b.requires_grad_(false);
  WeightGradQueue queue;
  {
    DeferWeightGrads scope(queue);
    deferred_linear(c.x, c.w, c.b).sum().backward();
  }
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_TRUE(c.x.grad().defined());
}

namespace {
// A backend that only names itself: enough for the executor's constructor to look at.
class NamedBackend : public c10d::Backend {
 public:
  NamedBackend(std::string name, int size) : c10d::Backend(0, size), name_(std::move(name)) {}
  const std::string getBackendName() const override { return name_; }

 private:
  std::string name_;
};
}  // namespace

TEST(StageExecutor, RefusesAnNcclPipelineGroup) {
  // The schedules post receives early and match them by tag: on NCCL they would deadlock,
  // so a library user handing it an NCCL group gets a typed error instead of a hang.
  const ScheduleSpec spec{ScheduleKind::kOneFOneB, 2, 4, 1};
  auto make = [&](const std::string& backend) {
    return StageExecutor(spec, 0, {[](const at::Tensor& x) { return x; }},
                         [](const at::Tensor& y, const at::Tensor&) { return y.sum(); }, ActivationSpec{{1, 4}},
                         c10::make_intrusive<NamedBackend>(backend, 2));
  };
  EXPECT_THROW(make("nccl"), trireme::InvalidArgument);
  EXPECT_NO_THROW(make("gloo"));
}

TEST(StageExecutor, RefusesAStageItsGroupDoesNotRun) {
  // A stage outside the schedule, a pipeline without a group, and a stage that is not its
  // rank in the group (it would exchange with the wrong neighbours until the time-out).
  const ScheduleSpec spec{ScheduleKind::kOneFOneB, 2, 4, 1};
  auto make = [&](int stage, trireme::dist::Group group) {
    return StageExecutor(spec, stage, {[](const at::Tensor& x) { return x; }},
                         [](const at::Tensor& y, const at::Tensor&) { return y.sum(); }, ActivationSpec{{1, 4}},
                         std::move(group));
  };
  const auto gloo = c10::make_intrusive<NamedBackend>("gloo", 2);  // rank 0 of 2
  auto refusal = [&](int stage, trireme::dist::Group group) -> std::string {
    try {
      make(stage, std::move(group));
    } catch (const trireme::InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal(2, gloo).find("pipeline stage 2 is not one of the schedule's 2 stages"), std::string::npos);
  EXPECT_NE(refusal(-1, gloo).find("pipeline stage -1 is not one of"), std::string::npos);
  EXPECT_NE(refusal(0, nullptr).find("needs a process group"), std::string::npos);
  EXPECT_NE(refusal(1, gloo).find("stage 1 runs as rank 0 of its pipeline group"), std::string::npos);
  EXPECT_EQ(refusal(0, gloo), "accepted");
}

TEST(StageModule, RefusesWeightsTiedAcrossLayers) {
  // One Linear in two layers (a tied embedding and head, say) would be stepped twice on a
  // stage holding both, and trained as two copies on two stages: refused with a message.
  torch::nn::Linear shared(4, 4), other(4, 4);
  auto identity = [](const at::Tensor& x) { return x; };
  const LayerList tied = {{"first", {{"a", shared.ptr()}}, identity}, {"second", {{"b", shared.ptr()}}, identity}};
  try {
    StageModule stage(tied, {{0, 1}});
    FAIL() << "tied weights accepted";
  } catch (const trireme::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layers first and second share parameter 'b.weight'"), std::string::npos)
        << e.what();
  }
  const LayerList untied = {{"first", {{"a", shared.ptr()}}, identity}, {"second", {{"b", other.ptr()}}, identity}};
  EXPECT_NO_THROW(StageModule(untied, {{0, 2}}));
}

TEST(WeightGradQueue, AWeightUsedTwiceIsReportedOnceAfterItsLastUse) {
  // DataParallel counts one contribution per report: a weight that two deferred linears
  // share must be reported once per micro-batch, when both have accumulated into it.
  at::Tensor shared = at::zeros({2}), other = at::zeros({2});
  WeightGradQueue queue;
  std::vector<std::string> log;
  queue.push([&] { log.push_back("work 1"); }, {shared, other});
  queue.push([&] { log.push_back("work 2"); }, {shared});
  queue.run_all([&](const at::Tensor& p) { log.push_back(p.is_same(shared) ? "shared" : "other"); });
  EXPECT_EQ(log, (std::vector<std::string>{"work 1", "other", "work 2", "shared"}));
}

TEST(DeferredLinear, QueuedWorkKeepsNoAutogradHistoryAlive) {
  // W needs the values of the linear's input and output gradient, not their graph: work
  // that kept the input's history would keep everything behind it (on a pipeline stage the
  // received activation and its gradient) alive until W.
  at::manual_seed(3);
  at::Tensor leaf = at::randn({2, 5, 4}).requires_grad_(true);
  const at::Tensor w = at::randn({3, 4}).requires_grad_(true), b = at::randn({3}).requires_grad_(true);
  const c10::weak_intrusive_ptr<c10::TensorImpl> leaf_impl(leaf.getIntrusivePtr());
  WeightGradQueue queue;
  {
    DeferWeightGrads defer(queue);
    const at::Tensor h = at::relu(leaf);  // not a leaf: its history leads to `leaf`
    deferred_linear(h, w, b).sum().backward();
  }
  ASSERT_EQ(queue.size(), 1u);
  leaf = at::Tensor();
  EXPECT_TRUE(leaf_impl.expired()) << "the queued weight-gradient work holds the input's autograd history";
  queue.run_all();
  EXPECT_TRUE(w.grad().defined());
}
