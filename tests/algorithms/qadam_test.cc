// QAdam with its default eps on elements that got no gradient through the warm-up (Bagua #654
// "QAdam NaN"): QAdamOptions::holdZeroVariance holds them in the compression stage. A 3-rank run
// of a separable quadratic whose "revived" elements (an embedding row no warm-up batch touched,
// a dead ReLU unit that comes back) get their first gradient after the warm-up: with the option
// on, the loss keeps falling, everything stays finite and rank-identical, and the held elements
// keep their warm-up values bit for bit; with it off the same run blows up (the test proves the
// option is what fixes it). Single steps from one state: elements with v != 0 are updated
// exactly as with the option off (and as an independent formula), the warm-up ignores the
// option, and the algorithm's hold_zero_variance argument reaches the optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/core/ddp.h"
#include "ddp_steps.h"
#include "multi_rank.h"

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;
using core::Parameter;

bool sameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

// ---- The problem -----------------------------------------------------------------------------

constexpr int kWorld = 3;
constexpr int kWarmup = 5;  // optimizer steps t = 1..4 are Adam, t >= 5 the compression stage
constexpr int kSteps = 20;
constexpr float kLr = 0.01f;
const size_t kSizes[2] = {40, 91};  // two tensors; 131 elements pad to 132 for 3 ranks

enum class Kind { kLive, kRevived, kDead };

// Every 10th element (offset 3) is revived: no gradient while step < kWarmup (0-based
// iteration), a gradient afterwards. Offset 7: never a gradient (dead for good). The rest: live.
Kind kindOf(size_t i) {
  if (i % 10 == 3) {
    return Kind::kRevived;
  }
  if (i % 10 == 7) {
    return Kind::kDead;
  }
  return Kind::kLive;
}

float target(size_t i) {
  return std::cos(static_cast<float>(i) * 0.3f);
}

// Start above the target by 0.5..1.0, so every gradient is positive for the whole run (Adam
// moves an element by about lr per step: 20 steps cannot cross the target).
float initWeight(size_t i) {
  return target(i) + 0.75f + 0.25f * std::sin(static_cast<float>(i) * 1.7f);
}

// Rank r's curvature of element i: the ranks' gradients differ, so the averages are not trivial.
float curvature(int rank, size_t i) {
  return 1.0f + 0.25f * static_cast<float>((static_cast<size_t>(rank) + i) % 3);
}

bool hasGradient(size_t i, int step) {
  const Kind k = kindOf(i);
  return k == Kind::kLive || (k == Kind::kRevived && step >= kWarmup);
}

// The objective after the warm-up (revived elements included): mean over ranks of
// 0.5 * sum_i a_ri (w_i - t_i)^2, in double.
double lossOf(const std::vector<float>& w) {
  double sum = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (kindOf(i) == Kind::kDead) {
      continue;
    }
    double a = 0.0;
    for (int r = 0; r < kWorld; ++r) {
      a += curvature(r, i);
    }
    const double d = static_cast<double>(w[i]) - static_cast<double>(target(i));
    sum += 0.5 * (a / kWorld) * d * d;
  }
  return sum;
}

struct RunResult {
  std::vector<std::vector<float>> weights;  // [rank][element] at the end
  std::vector<std::vector<float>> trace;    // rank 0's weights after each iteration
  std::vector<std::vector<float>> v;        // [rank][element] v at the end
};

// Trains kSteps iterations on kWorld ranks (threads, host backend over loopback), the qadam
// algorithm non-hierarchical, holdZeroVariance as given. Returns "" or the failures.
std::string train(bool hold, RunResult* out) {
  out->weights.assign(kWorld, {});
  out->v.assign(kWorld, {});
  out->trace.clear();
  const std::string failures = testing::runHostRanks(
      kWorld,
      [&](int r, core::ProcessGroup& group) -> std::string {
        std::vector<std::vector<float>> data(2), grad(2);
        std::vector<Parameter> params(2);
        size_t base = 0;
        for (size_t k = 0; k < 2; ++k) {
          grad[k].assign(kSizes[k], 0.0f);
          for (size_t i = 0; i < kSizes[k]; ++i) {
            // Rank-dependent start: the wrap's broadcast must make every rank rank 0's.
            data[k].push_back(initWeight(base + i) + 0.5f * static_cast<float>(r));
          }
          params[k].name = "emb" + std::to_string(k);
          params[k].data = data[k].data();
          params[k].grad = grad[k].data();
          params[k].numel = kSizes[k];
          base += kSizes[k];
        }
        QAdamOptions o;  // default eps (1e-8), betas, weight decay
        o.lr = kLr;
        o.warmupSteps = kWarmup;
        o.holdZeroVariance = hold;
        auto opt = QAdamOptimizer::create(params, o);
        if (!opt.isOk()) {
          return opt.status().toString();
        }
        auto algo = createAlgorithm("qadam", {{"hierarchical", "false"}}, opt->get());
        if (!algo.isOk()) {
          return algo.status().toString();
        }
        std::vector<Parameter> buffers;
        auto ddp = core::withBagua(params, buffers, {opt->get()}, *algo, group);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        for (int step = 0; step < kSteps; ++step) {
          Status s = (*ddp)->prepareForward();
          base = 0;
          for (size_t k = 0; k < 2; ++k) {
            for (size_t i = 0; i < kSizes[k]; ++i) {
              const size_t e = base + i;
              grad[k][i] = hasGradient(e, step) ? curvature(r, e) * (data[k][i] - target(e)) : 0.0f;
            }
            base += kSizes[k];
          }
          for (int k = 1; s.isOk() && k >= 0; --k) {
            s = (*ddp)->markGradReady(k);
          }
          if (s.isOk()) {
            s = (*ddp)->finishBackward();
          }
          if (s.isOk()) {
            s = (*ddp)->step();
          }
          if (!s.isOk()) {
            return strPrintf("rank %d step %d: %s", r, step, s.toString().c_str());
          }
          if (r == 0) {
            std::vector<float> flat = data[0];
            flat.insert(flat.end(), data[1].begin(), data[1].end());
            out->trace.push_back(std::move(flat));
          }
        }
        out->weights[r] = data[0];
        out->weights[r].insert(out->weights[r].end(), data[1].begin(), data[1].end());
        for (int k = 0; k < 2; ++k) {
          std::vector<float> v(kSizes[k]);
          Status s = (*opt)->readState(k, true, v.data());
          if (!s.isOk()) {
            return s.toString();
          }
          out->v[r].insert(out->v[r].end(), v.begin(), v.end());
        }
        return "";
      },
      60s);
  return failures;
}

TEST(QAdamZeroVariance, DefaultEpsTrainsWithHoldAndBlowsUpWithout) {
  RunResult on, off;
  ASSERT_EQ(train(true, &on), "");
  ASSERT_EQ(train(false, &off), "");
  ASSERT_EQ(on.trace.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(off.trace.size(), static_cast<size_t>(kSteps));
  const size_t n = kSizes[0] + kSizes[1];

  // The frozen v is exactly 0 on the revived and dead elements and only there.
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(on.v[0][i] == 0.0f, kindOf(i) != Kind::kLive) << "element " << i;
  }
  // Up to the last warm-up step (t = kWarmup - 1, iteration kWarmup - 2) both runs are Adam, so
  // they agree bit for bit; the option changes nothing there.
  const std::vector<float>& warmEnd = on.trace[kWarmup - 2];
  EXPECT_EQ(warmEnd, off.trace[kWarmup - 2]);
  const double lossWarm = lossOf(warmEnd);
  ASSERT_TRUE(std::isfinite(lossWarm));

  // On: every rank bitwise rank 0, all finite, the held elements are their warm-up values bit
  // for bit at every step, and the loss falls past the warm-up.
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(on.weights[r], on.weights[0]) << "rank " << r;
  }
  double prev = lossWarm;
  for (int step = kWarmup - 1; step < kSteps; ++step) {
    const std::vector<float>& w = on.trace[static_cast<size_t>(step)];
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(w[i])) << "step " << step << " element " << i;
      if (kindOf(i) != Kind::kLive) {
        ASSERT_TRUE(sameBits(w[i], warmEnd[i])) << "held element " << i << " moved at step " << step
                                                << ": " << warmEnd[i] << " -> " << w[i];
      }
    }
    const double loss = lossOf(w);
    EXPECT_LT(loss, prev) << "step " << step;
    prev = loss;
  }
  const double lossOn = lossOf(on.weights[0]);
  EXPECT_LT(lossOn, 0.9 * lossWarm) << "warm-up end " << lossWarm << ", end " << lossOn;
  // The live elements did move in the compression stage.
  EXPECT_FALSE(sameBits(on.weights[0][0], warmEnd[0]));

  // Off (Bagua's exact update): the revived elements' first compressed momentum is divided by
  // eps = 1e-8 and the loss explodes (or turns non-finite).
  double worst = 0.0;
  for (int step = kWarmup - 1; step < kSteps; ++step) {
    const double loss = lossOf(off.trace[static_cast<size_t>(step)]);
    worst = std::isfinite(loss) ? std::max(worst, loss) : std::numeric_limits<double>::infinity();
  }
  EXPECT_GT(worst, 1e6 * lossWarm) << "the off path did not reproduce the blow-up";
  double maxJump = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (kindOf(i) == Kind::kRevived) {
      const double d = std::fabs(static_cast<double>(off.trace[kWarmup][i]) - warmEnd[i]);
      maxJump = std::isfinite(d) ? std::max(maxJump, d) : std::numeric_limits<double>::infinity();
    }
  }
  // One compressed step with m ~ 0.1 * gradient: lr / (1 - 0.9^6) * m / 1e-8 ~ 1e5.
  EXPECT_GT(maxJump, 1e3) << "first compressed step after revival";
  // The elements that never get a gradient do not move even off: their m stays exactly 0 (the 0
  // makes its chunk straddle 0, and MinMaxUInt8 returns 0 exactly then), so 0 / eps = 0. The
  // blow-up comes from the elements that get a gradient after the warm-up.
  for (size_t i = 0; i < n; ++i) {
    if (kindOf(i) == Kind::kDead) {
      EXPECT_TRUE(sameBits(off.trace[kWarmup][i], warmEnd[i])) << "element " << i;
    }
  }
}

// ---- One step from a written state -----------------------------------------------------------

constexpr size_t kN = 64;

float mPattern(size_t i) {
  return 0.03f * std::sin(static_cast<float>(i) * 0.9f) + (i % 2 == 0 ? 0.002f : -0.001f);
}

// v: exact zeros at i % 5 == 2, a subnormal at i == 11 (not zero: Bagua's update), else a
// pattern.
float vPattern(size_t i) {
  if (i % 5 == 2) {
    return 0.0f;
  }
  if (i == 11) {
    return std::numeric_limits<float>::denorm_min();
  }
  return 1e-4f * (1.0f + static_cast<float>(i % 7));
}

float xPattern(size_t i) {
  return 0.5f - 0.01f * static_cast<float>(i);
}

struct OneStep {
  std::vector<float> x, g, m, v;
};

// A fresh optimizer over x (grad g), m and v written, one step; returns x, m, v after it.
OneStep stepOnce(bool hold, int warmupSteps, float weightDecay) {
  OneStep s;
  for (size_t i = 0; i < kN; ++i) {
    s.x.push_back(xPattern(i));
    // Zero gradient where v is zero (what a dead element sees), else a pattern.
    s.g.push_back(vPattern(i) == 0.0f ? 0.0f : 0.1f * std::cos(static_cast<float>(i)));
  }
  std::vector<Parameter> params(1);
  params[0].name = "w";
  params[0].data = s.x.data();
  params[0].grad = s.g.data();
  params[0].numel = kN;
  QAdamOptions o;
  o.lr = 0.01f;
  o.warmupSteps = warmupSteps;
  o.weightDecay = weightDecay;
  o.holdZeroVariance = hold;
  auto opt = QAdamOptimizer::create(params, o);
  EXPECT_TRUE(opt.isOk()) << opt.status().toString();
  if (!opt.isOk()) {
    return s;
  }
  std::vector<float> m(kN), v(kN);
  for (size_t i = 0; i < kN; ++i) {
    m[i] = mPattern(i);
    v[i] = vPattern(i);
  }
  EXPECT_TRUE((*opt)->writeState(0, false, m.data()).isOk());
  EXPECT_TRUE((*opt)->writeState(0, true, v.data()).isOk());
  EXPECT_TRUE((*opt)->step().isOk());
  s.m.resize(kN);
  s.v.resize(kN);
  EXPECT_TRUE((*opt)->readState(0, false, s.m.data()).isOk());
  EXPECT_TRUE((*opt)->readState(0, true, s.v.data()).isOk());
  return s;
}

TEST(QAdamZeroVariance, NonZeroVarianceUpdatedExactlyAsBagua) {
  // warmupSteps = 1: the first step (t = 1) is already the compression stage.
  const OneStep on = stepOnce(true, 1, 0.0f);
  const OneStep off = stepOnce(false, 1, 0.0f);
  ASSERT_EQ(on.x.size(), kN);
  ASSERT_EQ(off.x.size(), kN);
  // The compression-stage step reads m and v and leaves them (the algorithm updates m).
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_TRUE(sameBits(on.m[i], mPattern(i)) && sameBits(on.v[i], vPattern(i))) << i;
    EXPECT_TRUE(sameBits(off.m[i], mPattern(i)) && sameBits(off.v[i], vPattern(i))) << i;
  }
  // Bagua's update, written out here (t = 1: stepSize = lr / (1 - b1), bc2Sqrt = sqrt(1 - b2)).
  const float stepSize =
      static_cast<float>(static_cast<double>(0.01f) / (1.0 - static_cast<double>(0.9f)));
  const float bc2Sqrt = static_cast<float>(std::sqrt(1.0 - static_cast<double>(0.999f)));
  int held = 0;
  for (size_t i = 0; i < kN; ++i) {
    const float expect =
        xPattern(i) + (-stepSize) * (mPattern(i) / (std::sqrt(vPattern(i)) / bc2Sqrt + 1e-8f));
    EXPECT_TRUE(sameBits(off.x[i], expect)) << i << ": " << off.x[i] << " vs " << expect;
    if (vPattern(i) == 0.0f) {
      ++held;
      EXPECT_TRUE(sameBits(on.x[i], xPattern(i))) << "held element " << i << " moved";
      // Bagua's: m / eps.
      EXPECT_GT(std::fabs(off.x[i] - xPattern(i)), 0.5f * stepSize * std::fabs(mPattern(i)) / 1e-8f)
          << i;
    } else {
      EXPECT_TRUE(sameBits(on.x[i], off.x[i])) << i << ": " << on.x[i] << " vs " << off.x[i];
      EXPECT_FALSE(sameBits(on.x[i], xPattern(i))) << "element " << i << " did not move";
    }
  }
  EXPECT_EQ(held, 13);
}

TEST(QAdamZeroVariance, WarmupIgnoresTheOption) {
  // t = 1 < warmupSteps = 3: Adam, with weight decay, on a state where v = 0 but m != 0 (written):
  // m / eps is Adam's own answer there, and the option must not change it.
  const OneStep on = stepOnce(true, 3, 0.01f);
  const OneStep off = stepOnce(false, 3, 0.01f);
  ASSERT_EQ(on.x.size(), kN);
  ASSERT_EQ(off.x.size(), kN);
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_TRUE(sameBits(on.x[i], off.x[i])) << i;
    EXPECT_TRUE(sameBits(on.m[i], off.m[i])) << i;
    EXPECT_TRUE(sameBits(on.v[i], off.v[i])) << i;
    EXPECT_FALSE(sameBits(on.x[i], xPattern(i))) << "element " << i << " did not move";
  }
}

TEST(QAdamZeroVariance, AlgorithmArgumentSetsTheOption) {
  std::vector<Parameter> params;
  auto opt = QAdamOptimizer::create(params, {});
  ASSERT_TRUE(opt.isOk());
  EXPECT_TRUE((*opt)->options().holdZeroVariance) << "default on";
  ASSERT_TRUE(createAlgorithm("qadam", {{"hold_zero_variance", "false"}}, opt->get()).isOk());
  EXPECT_FALSE((*opt)->options().holdZeroVariance);
  // Absent: left as it is.
  ASSERT_TRUE(createAlgorithm("qadam", {}, opt->get()).isOk());
  EXPECT_FALSE((*opt)->options().holdZeroVariance);
  // A bad value, or a bad other key, is refused before anything changes.
  auto bad = createAlgorithm("qadam", {{"hold_zero_variance", "maybe"}}, opt->get());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hold_zero_variance"), std::string::npos)
      << bad.status().message();
  auto typo = createAlgorithm("qadam", {{"hold_zero_variance", "true"}, {"hierarchicl", "false"}},
                              opt->get());
  EXPECT_EQ(typo.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE((*opt)->options().holdZeroVariance);
  ASSERT_TRUE(createAlgorithm("qadam", {{"hold_zero_variance", "1"}}, opt->get()).isOk());
  EXPECT_TRUE((*opt)->options().holdZeroVariance);
}

}  // namespace
}  // namespace bagua::algo
