// PowerSGD on the host backend, ranks as threads: every step of a 5-step run (rank- and
// index-dependent gradients, several buckets, a bucket rebuild after the first step) against a
// double-precision reference written from the paper (powersgd_reference.h): the reduced
// gradients, each rank's error (error feedback across steps) and the averaged Q carried to the
// next step (warm start), for world sizes 1-4, ranks 1-3, with and without error feedback and
// warm start, before and after start_iter; a vanishing gradient (Q redrawn); quantised factors
// within a stated bound of the unquantised step, with the error absorbing the quantisation;
// the compression rule and the elements per step; bad settings failing with errors that name
// the setting.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "bagua/algorithms/algorithms.h"
#include "ddp_steps.h"
#include "powersgd_reference.h"

namespace bagua::algo {
namespace {

using namespace psgdtest;

// Float against the double reference, relative to the tensor's largest value: float rounding
// through five steps of products, orthogonalisation and error feedback stays near 1e-6; 5e-5
// leaves room for it and still fails on any misplaced element or wrong factor.
constexpr double kTol = 5e-5;

using bagua::testing::hostGroup;

std::vector<RankRun> runHost(int world, int steps, const PowerSgdOptions& o, int resumeAfter = -1) {
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<RankRun> runs(world);
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        auto pg = hostGroup(store, r, world);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        return runRank(**pg, r, steps, std::make_shared<PowerSgd>(o), Memory{}, core::Device{},
                       runs[r], resumeAfter);
      },
      120s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
  return runs;
}

struct RefCase {
  const char* label;
  int world;
  int rank;
  bool errorFeedback;
  bool warmStart;
  int64_t startIter;
  float eps;
};

void PrintTo(const RefCase& c, std::ostream* os) {
  *os << c.label;
}

class PowerSgdReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(PowerSgdReference, EveryStepMatchesDoublePrecision) {
  const RefCase c = GetParam();
  PowerSgdOptions o;
  o.rank = c.rank;
  o.errorFeedback = c.errorFeedback;
  o.warmStart = c.warmStart;
  o.startIter = c.startIter;
  o.orthogonalizationEpsilon = c.eps;
  o.seed = 1234;
  constexpr int kSteps = 5;
  const std::vector<RankRun> runs = runHost(c.world, kSteps, o);
  ASSERT_EQ(runs[0].grads.size(), static_cast<size_t>(kSteps));
  // The reducer's rebuild after step 0 moved tensors between buckets (the state followed them).
  EXPECT_NE(runs[0].layouts[0], runs[0].layouts[1]);
  double worst = 0.0;
  EXPECT_EQ(checkReference(runs, o, kSteps, kTol, &worst), "") << c.label;
}

INSTANTIATE_TEST_SUITE_P(Cases, PowerSgdReference,
                         ::testing::Values(RefCase{"w2_r1", 2, 1, true, true, 0, 0.0f},
                                           RefCase{"w3_r2_start2", 3, 2, true, true, 2, 0.0f},
                                           RefCase{"w1_r2", 1, 2, true, true, 0, 0.0f},
                                           RefCase{"w3_r1_noef", 3, 1, false, true, 1, 0.0f},
                                           RefCase{"w2_r2_nowarm", 2, 2, true, false, 1, 0.0f},
                                           RefCase{"w4_r3_eps", 4, 3, true, true, 0, 1e-3f}),
                         [](const ::testing::TestParamInfo<RefCase>& i) {
                           return std::string(i.param.label);
                         });

// ---- Quantised factors -------------------------------------------------------------------------

TEST(PowerSgdQuantized, WithinBoundOfTheExactStepAndAbsorbedByTheError) {
  constexpr int kSteps = 5;
  PowerSgdOptions o;
  o.rank = 2;
  o.startIter = 1;
  o.quantizeFactors = true;
  o.seed = 99;
  const std::vector<RankRun> runs = runHost(3, kSteps, o);
  ASSERT_EQ(runs[0].grads.size(), static_cast<size_t>(kSteps));
  // Bound: the factors' columns are scaled to unit RMS before quantising, so each of ByteGrad's
  // two 8-bit stages errs by at most half a step, range / 510, on O(1) entries (summed over 3
  // ranks in the first): about 1% on P and on Q each, so 5% on P Q^T leaves room.
  double worst = 0.0;
  EXPECT_EQ(checkQuantized(runs, o, kSteps, kTol, 0.05, &worst), "");
  // Quantisation really happened (an exact step would be within kTol).
  EXPECT_GT(worst, 1e-4) << "worst relative error of P Q^T " << worst;
}

// ---- Exact resume ------------------------------------------------------------------------------

// A reducer rebuilt from a checkpoint after step 3 (step counter, every rank's error, the
// warm-start Q, the column norms) continues bit for bit as the run that was never interrupted
// (2 ranks: the all-reduce sums are order-free, so a new bucket layout changes nothing).
TEST(PowerSgdResume, ContinuesBitForBitFromTheCheckpoint) {
  for (bool quantize : {false, true}) {
    PowerSgdOptions o;
    o.rank = 2;
    o.startIter = 1;
    o.quantizeFactors = quantize;
    const std::vector<RankRun> whole = runHost(2, 6, o);
    const std::vector<RankRun> resumed = runHost(2, 6, o, 3);
    ASSERT_EQ(resumed[0].grads.size(), 6u);
    for (int w = 0; w < 2; ++w) {
      for (int step = 0; step < 6; ++step) {
        EXPECT_EQ(resumed[w].grads[step], whole[w].grads[step])
            << "quantize " << quantize << " rank " << w << " step " << step;
        EXPECT_EQ(resumed[w].snapshots[step].steps, step + 1);
        for (const auto& [name, st] : whole[w].snapshots[step].tensors) {
          const auto& other = resumed[w].snapshots[step].tensors.at(name);
          EXPECT_EQ(other.error, st.error) << name << " step " << step;
          EXPECT_EQ(other.q, st.q) << name << " step " << step;
        }
      }
    }
  }
  // Without the state (a fresh reducer), step 3 would differ: the resume is what carries it.
  PowerSgdOptions o;
  o.rank = 2;
  o.startIter = 1;
  const std::vector<RankRun> whole = runHost(2, 4, o);
  EXPECT_NE(whole[0].snapshots[2].tensors.at("a.weight").error, std::vector<float>(240, 0.0f));
}

// ---- Settings ----------------------------------------------------------------------------------

void expectBad(const AlgorithmArgs& args, const std::string& names) {
  auto a = createAlgorithm("powersgd", args);
  ASSERT_FALSE(a.isOk()) << names;
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find(names), std::string::npos) << a.status().toString();
}

TEST(PowerSgdSettings, DefaultsAndStrictParsing) {
  auto a = createAlgorithm("powersgd");
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ((*a)->name(), "powersgd");
  const PowerSgdOptions& d = static_cast<PowerSgd&>(**a).options();
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.startIter, 10);
  EXPECT_EQ(d.minCompressionRate, 2.0);
  EXPECT_TRUE(d.errorFeedback);
  EXPECT_TRUE(d.warmStart);
  EXPECT_EQ(d.orthogonalizationEpsilon, 0.0f);
  EXPECT_FALSE(d.quantizeFactors);

  auto b = createAlgorithm("powersgd", {{"rank", "4"},
                                        {"start_iter", "0"},
                                        {"min_compression_rate", "1.5"},
                                        {"error_feedback", "false"},
                                        {"warm_start", "0"},
                                        {"orthogonalization_epsilon", "1e-8"},
                                        {"seed", "12345678901"},
                                        {"quantize_factors", "true"}});
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  const PowerSgdOptions& e = static_cast<PowerSgd&>(**b).options();
  EXPECT_EQ(e.rank, 4);
  EXPECT_EQ(e.startIter, 0);
  EXPECT_EQ(e.minCompressionRate, 1.5);
  EXPECT_FALSE(e.errorFeedback);
  EXPECT_FALSE(e.warmStart);
  EXPECT_FLOAT_EQ(e.orthogonalizationEpsilon, 1e-8f);
  EXPECT_EQ(e.seed, 12345678901ull);
  EXPECT_TRUE(e.quantizeFactors);

  expectBad({{"rank", "0"}}, "rank=0");
  expectBad({{"rank", "-2"}}, "rank");
  expectBad({{"rank", "two"}}, "rank");
  expectBad({{"start_iter", "-1"}}, "start_iter");
  expectBad({{"min_compression_rate", "-1"}}, "min_compression_rate");
  expectBad({{"min_compression_rate", "nan"}}, "min_compression_rate");
  expectBad({{"min_compression_rate", "2x"}}, "min_compression_rate");
  expectBad({{"orthogonalization_epsilon", "-1e-8"}}, "orthogonalization_epsilon");
  expectBad({{"error_feedback", "maybe"}}, "error_feedback");
  expectBad({{"warm_start", "yes"}}, "warm_start");
  expectBad({{"quantize_factors", "2"}}, "quantize_factors");
  expectBad({{"seed", "-3"}}, "seed");
  expectBad({{"hierarchical", "true"}}, "hierarchical=true");
  EXPECT_TRUE(createAlgorithm("powersgd", {{"hierarchical", "false"}}).isOk());
  expectBad({{"rnak", "2"}}, "'rnak'");
  expectBad({{"rnak", "2"}}, "rank");  // the accepted keys are listed

  // Options built in C++ are checked when the reducer reifies them.
  PowerSgdOptions bad;
  bad.rank = 0;
  EXPECT_NE(validatePowerSgdOptions(bad).message().find("rank=0"), std::string::npos);
}

// A one-rank reducer over parameters of the given shapes: the error it fails with, if any.
Status wrap(const std::vector<TensorSpec>& spec, const PowerSgdOptions& o) {
  auto store = std::make_shared<core::InMemoryStore>();
  auto pg = hostGroup(store, 0, 1);
  if (!pg.isOk()) {
    return pg.status();
  }
  std::vector<std::vector<float>> mem(spec.size() * 2);
  std::vector<core::Parameter> params(spec.size()), buffers;
  for (size_t t = 0; t < spec.size(); ++t) {
    mem[2 * t].assign(spec[t].numel, 0.0f);
    mem[2 * t + 1].assign(spec[t].numel, 0.0f);
    params[t].name = spec[t].name;
    params[t].numel = spec[t].numel;
    params[t].shape = spec[t].shape;
    params[t].data = mem[2 * t].data();
    params[t].grad = mem[2 * t + 1].data();
  }
  auto ddp = core::DistributedDataParallel::create(params, buffers, {},
                                                   std::make_shared<PowerSgd>(o), **pg);
  return ddp.isOk() ? Status::ok() : ddp.status();
}

TEST(PowerSgdSettings, RankAgainstTheModel) {
  const std::vector<TensorSpec> spec = {
      {"fc.weight", {4, 16}, 64}, {"fc.bias", {4}, 4}, {"tiny.weight", {3, 3}, 9}};
  PowerSgdOptions o;
  o.rank = 4;  // fits fc.weight (min 4) though not tiny.weight, which is then not compressed
  o.minCompressionRate = 0.5;
  EXPECT_TRUE(wrap(spec, o).isOk()) << wrap(spec, o).toString();
  o.rank = 5;
  const Status s = wrap(spec, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank=5"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("fc.weight"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("rank <= 4"), std::string::npos) << s.toString();
  // Vectors only: nothing to compress, no rank to check (all-reduced uncompressed, a warning).
  EXPECT_TRUE(wrap({{"v", {8}, 8}}, o).isOk());
  // A shape that does not hold the tensor's elements.
  const Status bad = wrap({{"w", {3, 3}, 10}}, PowerSgdOptions{});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'w'"), std::string::npos) << bad.toString();
}

TEST(PowerSgdSettings, SnapshotNeedsAReducer) {
  PowerSgd a;
  EXPECT_EQ(a.snapshot().status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace bagua::algo
