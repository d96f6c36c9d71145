// The fused optimizer beside the reducer: 3 ranks over the host backend train an MLP with
// gradient_as_bucket_view; the optimizer reuses the reducer's bucket layout (gradients stay in
// the buckets, parameters and state are laid out in bucket order, and again after the reducer
// rebuilds its buckets), fuses every bucket's tensors, and ends bit for bit where the same run
// with the per-tensor step ends; every rank holds the same model. Stepping inside the backward
// pass (core::BucketStepper, with BAGUA_OPTIM_STEP_IN_BACKWARD on): every bucket stepped as it
// is reduced, and the weights the same bits as stepping after backward, with and without bucket
// views, fused or not; with an enabled GradScaler, or the parameter at its default (off), the
// optimizer declines and steps after backward.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bagua/core/ddp.h"
#include "bagua/optimizer/elementwise.h"
#include "bagua/optimizer/grad_scaler.h"
#include "bagua/optimizer/params.h"
#include "ddp_steps.h"
#include "example_mlp.h"
#include "multi_rank.h"

namespace bagua::optim {
namespace {

using namespace std::chrono_literals;
using example::Mlp;

constexpr int kWorld = 3;
constexpr int kBatch = 6;
constexpr int kIn = 10;
constexpr int kClasses = 4;

struct RankOut {
  std::vector<float> weights;
  size_t fusedTensors = 0;
  int64_t fusedCount = 0;
  size_t numParams = 0;
  bool rebuilt = false;
  size_t buckets = 0;
  int steppedInBackward = 0;           // the reducer's count in the last step
  int optimizerSteppedInBackward = 0;  // the optimizer's
};

struct TrainSpec {
  bool fused = true;
  bool bucketView = true;
  bool stepInBackward = true;  // DdpOptions::stepInBackward
  bool scaler = false;         // an enabled GradScaler
  int steps = 5;
};

std::string train(const TrainSpec& run, std::vector<RankOut>* out) {
  const bool fused = run.fused;
  const bool bucketView = run.bucketView;
  auto store = std::make_shared<core::InMemoryStore>();
  out->assign(kWorld, {});
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = bagua::testing::hostGroup(store, r, kWorld, 30000ms);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        example::MlpConfig mc;
        mc.sizes = {kIn, 24, 20, kClasses};
        mc.seed = 7 + static_cast<uint64_t>(r);  // differs per rank: DDP broadcasts rank 0's
        Mlp m(mc);
        AdamRule::Hyper h;
        h.lr = 0.01;
        h.weightDecay = 0.01;
        OptimizerOptions oo;
        oo.threads = 1;
        auto opt = Adam::create(m.parameters(), h, oo);
        if (!opt.isOk()) {
          return opt.status().toString();
        }
        auto scaler = GradScaler::create();
        if (!scaler.isOk()) {
          return scaler.status().toString();
        }
        if (run.scaler) {
          (*opt)->setGradScaler(&*scaler);
        }
        core::DdpOptions dopt;
        dopt.stepInBackward = run.stepInBackward;
        dopt.gradientAsBucketView = bucketView;
        dopt.firstBucketBytes = 1024;  // several buckets
        dopt.bucketCapMb = 2048.0 / (1 << 20);
        auto ddp = core::withBagua(m.parameters(), m.buffers(), {opt->get()},
                                   std::make_shared<core::GradientAllReduce>(), **pg, dopt);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        if (fused) {
          Status s = (*opt)->attachReducer(**ddp);
          if (s.isOk()) {
            s = (*opt)->fuse();
          }
          if (!s.isOk()) {
            return s.toString();
          }
        }
        std::vector<float> x(kBatch * kIn);
        std::vector<int32_t> y(kBatch);
        for (int step = 0; step < run.steps; ++step) {
          (*opt)->zeroGrad();
          for (int k = 0; k < kBatch; ++k) {
            for (int i = 0; i < kIn; ++i) {
              x[k * kIn + i] =
                  static_cast<float>(((step * 31 + r * 17 + k * 7 + i * 3) % 23) - 11) / 11.0f;
            }
            y[k] = (step + r + k) % kClasses;
          }
          Status s = (*ddp)->prepareForward();
          if (!s.isOk()) {
            return s.toString();
          }
          m.forward(x.data(), y.data(), kBatch);
          Status ready;
          m.backward([&](int p) {
            if (ready.isOk()) {
              ready = (*ddp)->markGradReady(p);
            }
          });
          if (!ready.isOk()) {
            return ready.toString();
          }
          s = (*ddp)->finishBackward();
          if (s.isOk()) {
            s = (*ddp)->step();
          }
          if (!s.isOk()) {
            return s.toString();
          }
        }
        RankOut& o = (*out)[r];
        for (auto& p : m.parameters()) {
          const auto* d = static_cast<const float*>(p.data);
          o.weights.insert(o.weights.end(), d, d + p.numel);
        }
        o.fusedTensors = (*opt)->lastFusedTensors();
        o.fusedCount = (*opt)->fusedCount();
        o.numParams = m.parameters().size();
        o.rebuilt = (*ddp)->bucketsRebuilt();
        o.buckets = (*ddp)->buckets().size();
        o.steppedInBackward = (*ddp)->bucketsSteppedInBackward();
        o.optimizerSteppedInBackward = (*opt)->bucketsSteppedInBackward();
        return "";
      },
      120s);
  return bagua::testing::joinFailures(res);
}

// Stepping inside backward needs BAGUA_OPTIM_STEP_IN_BACKWARD on (off by default): each case
// turns it on through the catalogue's API, but OffByDefault.
class FusedWithReducer : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    optimizerParams().stepInBackward.resetForTesting();
    ASSERT_TRUE(optimizerParams().stepInBackward.setOverride(true).isOk());
  }
  void TearDown() override { optimizerParams().stepInBackward.resetForTesting(); }
};

TEST_P(FusedWithReducer, FusesBucketsAndMatchesThePerTensorStep) {
  const bool bucketView = GetParam();
  std::vector<RankOut> fused, plain;
  TrainSpec f;
  f.bucketView = bucketView;
  f.stepInBackward = false;
  TrainSpec p = f;
  p.fused = false;
  ASSERT_EQ(train(f, &fused), "");
  ASSERT_EQ(train(p, &plain), "");
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(fused[r].weights.size(), plain[0].weights.size());
    EXPECT_EQ(
        std::memcmp(fused[r].weights.data(), plain[0].weights.data(), plain[0].weights.size() * 4),
        0)
        << "rank " << r << ": fused differs from the per-tensor step";
    EXPECT_EQ(
        std::memcmp(fused[r].weights.data(), fused[0].weights.data(), fused[0].weights.size() * 4),
        0)
        << "rank " << r << " diverged from rank 0";
    EXPECT_TRUE(fused[r].rebuilt);
    // After the rebuild every parameter sits in a fused run (no bucket holds a single tensor
    // here: 6 parameters, buckets of >= 1 KiB hold a weight and its bias at least).
    EXPECT_GT(fused[r].fusedTensors, 0u);
    EXPECT_EQ(fused[r].fusedCount, 5) << "one group, fused in each of 5 steps";
  }
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_P(FusedWithReducer, StepsInsideBackwardToTheSameBitsAsAfterBackward) {
  const bool bucketView = GetParam();
  TrainSpec after;
  after.bucketView = bucketView;
  after.fused = false;
  after.stepInBackward = false;
  after.steps = 12;
  std::vector<RankOut> ref;
  ASSERT_EQ(train(after, &ref), "");
  EXPECT_EQ(ref[0].steppedInBackward, 0);
  for (bool fused : {true, false}) {
    TrainSpec in = after;
    in.fused = fused;
    in.stepInBackward = true;
    std::vector<RankOut> got;
    ASSERT_EQ(train(in, &got), "");
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(sameBits(got[r].weights, ref[0].weights))
          << "rank " << r << (fused ? " fused" : " not fused")
          << ": stepping inside backward differs from stepping after it";
      // Every bucket of the last backward was stepped inside it, by the reducer and the optimizer.
      EXPECT_GT(got[r].buckets, 1u);
      EXPECT_EQ(got[r].steppedInBackward, static_cast<int>(got[r].buckets)) << "rank " << r;
      EXPECT_EQ(got[r].optimizerSteppedInBackward, static_cast<int>(got[r].buckets));
    }
    if (fused) {
      EXPECT_EQ(got[0].fusedCount, 12) << "one group, fused in each of 12 steps";
    }
  }
}

// Trains `in` (the reducer offering each bucket inside backward) and the same run stepping after
// backward; expects no bucket stepped inside backward and the same weights. `got` gets `in`'s.
void expectStepsAfterBackward(const TrainSpec& in, std::vector<RankOut>* got) {
  TrainSpec after = in;
  after.stepInBackward = false;
  std::vector<RankOut> ref;
  ASSERT_EQ(train(in, got), "");
  ASSERT_EQ(train(after, &ref), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ((*got)[r].steppedInBackward, 0) << "rank " << r;
    EXPECT_TRUE(sameBits((*got)[r].weights, ref[0].weights)) << "rank " << r;
  }
}

TEST_P(FusedWithReducer, AGradScalerStepsAfterBackward) {
  // The scaler's inf/NaN check needs every gradient before any step: the optimizer declines,
  // and the run equals the one that never stepped inside backward.
  TrainSpec in;
  in.bucketView = GetParam();
  in.scaler = true;
  in.steps = 6;
  std::vector<RankOut> got;
  expectStepsAfterBackward(in, &got);
}

TEST_P(FusedWithReducer, OffByDefault) {
  // With the parameter at its default the optimizer declines, though the reducer offers each
  // bucket (DdpOptions::stepInBackward), and the run equals the one stepping after backward.
  optimizerParams().stepInBackward.resetForTesting();
  TrainSpec in;
  in.bucketView = GetParam();
  in.steps = 6;
  std::vector<RankOut> got;
  expectStepsAfterBackward(in, &got);
  for (int r = 0; r < static_cast<int>(got.size()); ++r) {
    EXPECT_EQ(got[r].optimizerSteppedInBackward, 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(BucketView, FusedWithReducer, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "bucket_view" : "copy";
                         });

}  // namespace
}  // namespace bagua::optim
