// The generic fused optimizer: Bagua's calculate_mutual_groups cases, flattening (views, grads
// re-pointed through setGrad), fused == per-tensor bit for bit for every optimizer over many steps
// with mixed sizes, several groups and dtypes, fallbacks where nothing (or only part) is
// contiguous, a user-defined rule, thread-count independence, state save/load and its errors.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bagua/optimizer/elementwise.h"
#include "bagua/optimizer/thread_pool.h"
#include "optimizer_support.h"

namespace bagua::optim {
namespace {

using core::DataType;
using testing::Model;
using testing::Spec;
using Span = FusedOptimizer::Span;

// ---- calculate_mutual_groups -------------------------------------------------------------------

std::vector<Span> spans(const std::vector<std::pair<uintptr_t, size_t>>& v) {
  std::vector<Span> out;
  for (auto [a, b] : v) {
    out.push_back({a, b});
  }
  return out;
}

TEST(MutualRuns, AdjacentInAddressOrderNotListOrder) {
  // Tensors 3, 1, 2, 0 lie back to back in that address order in both lists.
  auto a = spans({{400, 8}, {108, 4}, {112, 288}, {100, 8}});
  auto b = spans({{1600, 16}, {1016, 8}, {1024, 576}, {1000, 16}});
  EXPECT_EQ(FusedOptimizer::mutualRuns({a, b}), (std::vector<std::vector<int>>{{3, 1, 2, 0}}));
}

TEST(MutualRuns, RunsAreWhereEveryListIsAdjacent) {
  // List a: one run 0..5; list b: runs [0,1,2] and [4,5] (3 elsewhere): both parts are kept
  // (Bagua's exact-equality rule would keep nothing here).
  auto a = spans({{0, 4}, {4, 4}, {8, 4}, {12, 4}, {16, 4}, {20, 4}});
  auto b = spans({{0, 4}, {4, 4}, {8, 4}, {100, 4}, {200, 4}, {204, 4}});
  EXPECT_EQ(FusedOptimizer::mutualRuns({a, b}), (std::vector<std::vector<int>>{{0, 1, 2}, {4, 5}}));
  // Same tensors adjacent in a different order in b: nothing lines up.
  auto c = spans({{4, 4}, {0, 4}, {12, 4}, {8, 4}, {20, 4}, {16, 4}});
  EXPECT_TRUE(FusedOptimizer::mutualRuns({a, c}).empty());
  // Sizes differ between lists (the f32 state of an f16 weight): adjacency uses each list's own
  // bytes.
  auto d = spans({{0, 8}, {8, 8}, {16, 8}, {24, 8}, {32, 8}, {40, 8}});
  EXPECT_EQ(FusedOptimizer::mutualRuns({a, d}),
            (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}}));
}

TEST(MutualRuns, ScatteredGivesNothing) {
  auto a = spans({{0, 4}, {100, 4}, {200, 4}});
  auto b = spans({{0, 4}, {4, 4}, {8, 4}});
  EXPECT_TRUE(FusedOptimizer::mutualRuns({a, b}).empty());
  EXPECT_TRUE(FusedOptimizer::mutualRuns({}).empty());
}

// ---- Thread pool -------------------------------------------------------------------------------

TEST(ThreadPool, EveryChunkRunsExactlyOnceAcrossManyJobs) {
  ThreadPool pool(4);
  for (int job = 0; job < 200; ++job) {
    const size_t n = 1 + static_cast<size_t>(job * 37 % 101);
    std::vector<std::atomic<int>> hits(n);
    ASSERT_TRUE(pool.parallelFor(n, [&](size_t c) { hits[c].fetch_add(1); }).isOk());
    for (size_t c = 0; c < n; ++c) {
      ASSERT_EQ(hits[c].load(), 1) << "job " << job << " chunk " << c;
    }
  }
}

// ---- Fixtures ----------------------------------------------------------------------------------

// Mixed sizes (1 element up to several chunks), every supported dtype.
std::vector<Spec> mixedSpecs() {
  return {{7, DataType::kF32},    {1, DataType::kF32},     {300, DataType::kF32},
          {5000, DataType::kF32}, {33, DataType::kF64},    {2, DataType::kF64},
          {129, DataType::kF16},  {1000, DataType::kF16},  {65, DataType::kBF16},
          {17, DataType::kBF16},  {40000, DataType::kF32}, {3, DataType::kF32}};
}

template <class Opt>
std::vector<typename Opt::Group> twoGroups(const typename Opt::Hyper& a,
                                           const typename Opt::Hyper& b, size_t n) {
  typename Opt::Group g0, g1;
  g0.hyper = a;
  g1.hyper = b;
  for (size_t i = 0; i < n; ++i) {
    (i % 3 == 1 ? g1 : g0).params.push_back(static_cast<int>(i));
  }
  return {g0, g1};
}

OptimizerOptions smallChunks(int threads = 2) {
  OptimizerOptions o;
  o.threads = threads;
  o.chunkElements = 1024;  // several chunks per large tensor and per run
  return o;
}

std::vector<uint8_t> stateBytes(FusedOptimizer& opt) {
  auto s = opt.saveState();
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  return s.isOk() ? *s : std::vector<uint8_t>{};
}

// Runs `steps` steps of a fused optimizer (fuse_step on even steps, step on odd ones, as Bagua's
// test does) and of a plain one on an identical model; parameters and states must be equal bit
// for bit after every step.
template <class Opt>
void expectFusedEqualsPlain(const typename Opt::Hyper& h0, const typename Opt::Hyper& h1,
                            int steps = 12, bool masterWeights = true) {
  Model fusedModel(mixedSpecs());
  Model plainModel(mixedSpecs());
  OptimizerOptions o = smallChunks();
  o.masterWeights = masterWeights;
  auto fused = Opt::create(fusedModel.params(), twoGroups<Opt>(h0, h1, mixedSpecs().size()), o);
  auto plain = Opt::create(plainModel.params(), twoGroups<Opt>(h0, h1, mixedSpecs().size()), o);
  ASSERT_TRUE(fused.isOk()) << fused.status().toString();
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  ASSERT_TRUE((*fused)->fuse().isOk());
  EXPECT_TRUE((*fused)->fuse().code() == StatusCode::kFailedPrecondition) << "fused twice";
  int fusedSteps = 0;
  for (int step = 0; step < steps; ++step) {
    fusedModel.fillGrads(static_cast<uint64_t>(step));
    plainModel.fillGrads(static_cast<uint64_t>(step));
    if (step % 2 == 0) {
      ASSERT_TRUE((*fused)->fuseStep().isOk());
      ++fusedSteps;
      // Every (group, dtype) partition with >= 2 tensors is one run.
      EXPECT_GT((*fused)->lastFusedRuns(), 0u);
    } else {
      ASSERT_TRUE((*fused)->plainStep().isOk());
    }
    ASSERT_TRUE((*plain)->plainStep().isOk());
    ASSERT_EQ(fusedModel.snapshot(), plainModel.snapshot())
        << Opt::RuleType::kName << " step " << step;
    ASSERT_EQ(stateBytes(**fused), stateBytes(**plain)) << "state after step " << step;
  }
  // Both groups had runs in every fused step (Bagua's fused_count = groups x fused steps).
  EXPECT_EQ((*fused)->fusedCount(), 2 * fusedSteps);
  EXPECT_TRUE((*fused)->flattenIntact());
}

TEST(FusedEqualsPlain, Sgd) {
  SgdRule::Hyper a, b;
  a.lr = 0.1;
  b.lr = 0.05;
  b.weightDecay = 0.1;
  expectFusedEqualsPlain<Sgd>(a, b);
  a.momentum = 0.9;
  a.nesterov = true;
  b.momentum = 1.0;
  b.dampening = 0.5;
  b.weightDecay = 1.0;
  expectFusedEqualsPlain<Sgd>(a, b);
}

TEST(FusedEqualsPlain, AdamAndAdamW) {
  AdamRule::Hyper a, b;
  b.weightDecay = 1.0;
  b.amsgrad = true;
  expectFusedEqualsPlain<Adam>(a, b);
  AdamWRule::Hyper c, d;
  d.amsgrad = true;
  d.weightDecay = 1.0;
  d.maximize = true;
  expectFusedEqualsPlain<AdamW>(c, d);
}

TEST(FusedEqualsPlain, Adagrad) {
  AdagradRule::Hyper a, b;
  b.lrDecay = 0.01;
  b.weightDecay = 0.1;
  b.initialAccumulatorValue = 0.1;
  expectFusedEqualsPlain<Adagrad>(a, b);
}

TEST(FusedEqualsPlain, Rmsprop) {
  RmspropRule::Hyper a, b;
  a.centered = true;
  b.momentum = 0.9;
  b.weightDecay = 0.1;
  expectFusedEqualsPlain<Rmsprop>(a, b);
  a.momentum = 0.5;
  b.centered = true;
  expectFusedEqualsPlain<Rmsprop>(a, b);
}

TEST(FusedEqualsPlain, Adadelta) {
  AdadeltaRule::Hyper a, b;
  b.weightDecay = 1.0;
  expectFusedEqualsPlain<Adadelta>(a, b);
}

TEST(FusedEqualsPlain, Adamax) {
  AdamaxRule::Hyper a, b;
  b.weightDecay = 0.5;
  expectFusedEqualsPlain<Adamax>(a, b);
}

TEST(FusedEqualsPlain, LambWithPerTensorNorms) {
  LambRule::Hyper a, b;
  b.weightDecay = 0.0;
  b.lr = 0.01;
  expectFusedEqualsPlain<Lamb>(a, b);
}

// LAMB tensors whose norm is 0 (weights all 0: |p| = 0; gradients always 0 and no weight decay:
// |u| = 0) take trust 1, fused as per tensor; the layout cuda_test.cc runs on the GPU.
void expectLambZeroNormsFusedEqualsPlain(bool masterWeights) {
  const std::vector<Spec> specs = testing::lambZeroNormSpecs();
  constexpr size_t kZeroWeights = testing::kLambZeroWeights;
  constexpr size_t kZeroGrads = testing::kLambZeroGrads;
  Model plain(specs), fused(specs);
  for (Model* m : {&plain, &fused}) {
    std::memset(m->params()[kZeroWeights].data, 0, m->params()[kZeroWeights].bytes());
  }
  OptimizerOptions o;
  o.threads = 2;
  o.masterWeights = masterWeights;
  const std::vector<Lamb::Group> groups = testing::lambZeroNormGroups();
  auto a = Lamb::create(plain.params(), groups, o);
  auto b = Lamb::create(fused.params(), groups, o);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_TRUE((*b)->fuse().isOk());
  const std::vector<uint8_t> zeroGradsBefore(
      static_cast<const uint8_t*>(fused.params()[kZeroGrads].data),
      static_cast<const uint8_t*>(fused.params()[kZeroGrads].data) +
          fused.params()[kZeroGrads].bytes());
  for (int step = 0; step < 8; ++step) {
    for (Model* m : {&plain, &fused}) {
      m->fillGrads(step);
      std::memset(m->params()[kZeroGrads].grad, 0, m->params()[kZeroGrads].bytes());
    }
    ASSERT_TRUE((*a)->plainStep().isOk());
    ASSERT_TRUE((*b)->step().isOk());
    EXPECT_GT((*b)->lastFusedRuns(), 0u);
    ASSERT_EQ(fused.snapshot(), plain.snapshot()) << "step " << step << " master " << masterWeights;
  }
  EXPECT_EQ(
      std::memcmp(fused.params()[kZeroGrads].data, zeroGradsBefore.data(), zeroGradsBefore.size()),
      0);
  const std::vector<uint8_t> zeros(fused.params()[kZeroWeights].bytes(), 0);
  EXPECT_NE(std::memcmp(fused.params()[kZeroWeights].data, zeros.data(), zeros.size()), 0);
}

TEST(FusedEqualsPlain, LambZeroNormTensorsTakeTrustOne) {
  expectLambZeroNormsFusedEqualsPlain(true);
  expectLambZeroNormsFusedEqualsPlain(false);
}

TEST(FusedEqualsPlain, HalfParametersWithoutMasterWeights) {
  AdamRule::Hyper a, b;
  b.weightDecay = 0.5;
  expectFusedEqualsPlain<Adam>(a, b, 8, /*masterWeights=*/false);
}

// ---- The generic path: a rule written in a test gets fusion with no extra code -----------------

// signSGD with decoupled decay: p = p * (1 - lr * wd) - lr * sign(g); the state counts how often
// each element moved up (to exercise a state).
struct SignSgdRule {
  static constexpr const char* kName = "sign_sgd";
  static constexpr int kStates = 1;
  static constexpr int kCudaId = -1;
  struct Hyper {
    double lr = 0.01;
    double weightDecay = 0.0;
  };
  static const char* validate(const Hyper& h) { return h.lr >= 0 ? nullptr : "lr must be >= 0"; }
  static unsigned stateMask(const Hyper& /*h*/) { return 1u; }
  static const char* stateName(int /*k*/) { return "ups"; }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    T lr, decay;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t /*step*/) {
    return {static_cast<T>(h.lr), static_cast<T>(1.0 - h.lr * h.weightDecay)};
  }
  template <class T>
  static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    const T sign = g > T(0) ? T(1) : (g < T(0) ? T(-1) : T(0));
    s[0] = s[0] + (sign < T(0) ? T(1) : T(0));
    p = p * c.decay - c.lr * sign;
  }
};

TEST(GenericRule, UserRuleIsFusedAndMatchesReference) {
  using SignSgd = ElementwiseOptimizer<SignSgdRule>;
  SignSgdRule::Hyper a, b;
  b.weightDecay = 0.5;
  expectFusedEqualsPlain<SignSgd>(a, b);

  // Against a direct computation for f64 parameters.
  Model m({{10, DataType::kF64}, {6, DataType::kF64}});
  std::vector<double> want;
  for (auto& p : m.params()) {
    for (size_t i = 0; i < p.numel; ++i) {
      want.push_back(static_cast<double*>(p.data)[i]);
    }
  }
  auto opt = SignSgd::create(m.params(), b, smallChunks());
  ASSERT_TRUE(opt.isOk());
  ASSERT_TRUE((*opt)->fuse().isOk());
  for (int step = 0; step < 3; ++step) {
    m.fillGrads(step);
    size_t k = 0;
    for (auto& p : m.params()) {
      for (size_t i = 0; i < p.numel; ++i, ++k) {
        const double g = static_cast<double*>(p.grad)[i];
        want[k] = want[k] * (1.0 - 0.01 * 0.5) - 0.01 * (g > 0 ? 1.0 : (g < 0 ? -1.0 : 0.0));
      }
    }
    ASSERT_TRUE((*opt)->step().isOk());
    EXPECT_EQ((*opt)->lastFusedTensors(), 2u);
  }
  size_t k = 0;
  for (auto& p : m.params()) {
    for (size_t i = 0; i < p.numel; ++i, ++k) {
      EXPECT_EQ(static_cast<double*>(p.data)[i], want[k]) << k;
    }
  }
}

// ---- Flattening
// ----------------------------------------------------------------------------------

TEST(Flatten, TensorsBecomeViewsOfOneStoragePerGroupAndDtype) {
  Model m(mixedSpecs());
  const auto before = m.snapshot();
  std::vector<std::vector<uint8_t>> grads;
  m.fillGrads(3);
  for (auto& p : m.params()) {
    const auto* g = static_cast<const uint8_t*>(p.grad);
    grads.emplace_back(g, g + p.bytes());
  }
  auto opt = Adam::create(m.params(), twoGroups<Adam>({}, {}, m.params().size()), smallChunks());
  ASSERT_TRUE(opt.isOk());
  ASSERT_TRUE((*opt)->fuse().isOk());
  EXPECT_EQ(m.snapshot(), before) << "flattening changed values";
  EXPECT_EQ(m.setGradCalls(), static_cast<int>(m.params().size()));
  for (size_t i = 0; i < m.params().size(); ++i) {
    const auto& p = m.params()[i];
    EXPECT_EQ(std::memcmp(p.grad, grads[i].data(), p.bytes()), 0) << "grad " << i;
  }
  // In each (group, dtype) partition, consecutive members are byte-adjacent in registration
  // order, for weights, gradients and each state.
  const auto& ps = m.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    for (size_t j = i + 1; j < ps.size(); ++j) {
      if ((i % 3 == 1) != (j % 3 == 1) || ps[i].dtype != ps[j].dtype) {
        continue;
      }
      const auto* pe = static_cast<const uint8_t*>(ps[i].data) + ps[i].bytes();
      const auto* ge = static_cast<const uint8_t*>(ps[i].grad) + ps[i].bytes();
      EXPECT_EQ(pe, ps[j].data) << i << " -> " << j;
      EXPECT_EQ(ge, ps[j].grad) << i << " -> " << j;
      const size_t ses = ps[i].dtype == DataType::kF64 ? 8 : 4;
      const auto* se = static_cast<const uint8_t*>((*opt)->stateData(static_cast<int>(i), 0)) +
                       ps[i].numel * ses;
      EXPECT_EQ(se, (*opt)->stateData(static_cast<int>(j), 0));
      break;  // only the next member of the same partition
    }
  }
  EXPECT_TRUE((*opt)->flattenIntact());
}

TEST(Flatten, NothingContiguousFallsBackToPlainStep) {
  Model a(mixedSpecs()), b(mixedSpecs());
  auto fa = Sgd::create(a.params(), SgdRule::Hyper{0.1, 0.9}, smallChunks());
  auto fb = Sgd::create(b.params(), SgdRule::Hyper{0.1, 0.9}, smallChunks());
  ASSERT_TRUE(fa.isOk() && fb.isOk());
  FuseOptions noFlatten;
  noFlatten.doFlatten = false;
  ASSERT_TRUE((*fa)->fuse(noFlatten).isOk());
  for (int step = 0; step < 4; ++step) {
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((*fa)->fuseStep().isOk());
    ASSERT_TRUE((*fb)->plainStep().isOk());
    EXPECT_EQ((*fa)->lastFusedRuns(), 0u);
    ASSERT_EQ(a.snapshot(), b.snapshot());
  }
  EXPECT_EQ((*fa)->fusedCount(), 0);
}

TEST(Flatten, MovedGradientSplitsTheRunAndStaysCorrect) {
  Model a(
      {{100, DataType::kF32}, {200, DataType::kF32}, {50, DataType::kF32}, {70, DataType::kF32}});
  Model b(
      {{100, DataType::kF32}, {200, DataType::kF32}, {50, DataType::kF32}, {70, DataType::kF32}});
  auto fa = Adam::create(a.params(), AdamRule::Hyper{}, smallChunks());
  auto fb = Adam::create(b.params(), AdamRule::Hyper{}, smallChunks());
  ASSERT_TRUE(fa.isOk() && fb.isOk());
  ASSERT_TRUE((*fa)->fuse().isOk());
  // The trainer re-points tensor 2's gradient to its own buffer: run [0,1]; 2 and 3 step alone
  // (3's gradient no longer follows 2's).
  std::vector<float> own(50);
  a.params()[2].grad = own.data();
  for (int step = 0; step < 3; ++step) {
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((*fa)->fuseStep().isOk());
    ASSERT_TRUE((*fb)->plainStep().isOk());
    EXPECT_EQ((*fa)->lastFusedRuns(), 1u);
    EXPECT_EQ((*fa)->lastFusedTensors(), 2u);
    ASSERT_EQ(a.snapshot(), b.snapshot());
  }
  EXPECT_FALSE((*fa)->flattenIntact());
}

// The step plan is cached after the first fuseStep; re-pointing a tensor's data out of the flat
// buffer afterwards must still be found at the next step (checkFlatten on): the tensor is then
// stepped where it now lives, the rest stays fused, and the result equals the plain step.
TEST(Flatten, DataRepointedAfterThePlanIsCachedIsDetectedAtTheNextStep) {
  const std::vector<Spec> specs = {
      {100, DataType::kF32}, {200, DataType::kF32}, {50, DataType::kF32}, {70, DataType::kF32}};
  Model a(specs), b(specs);
  auto fa = Adam::create(a.params(), AdamRule::Hyper{}, smallChunks());
  auto fb = Adam::create(b.params(), AdamRule::Hyper{}, smallChunks());
  ASSERT_TRUE(fa.isOk() && fb.isOk());
  ASSERT_TRUE((*fa)->fuse().isOk());
  int step = 0;
  for (; step < 3; ++step) {  // the plan is built and then reused
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((*fa)->fuseStep().isOk());
    ASSERT_TRUE((*fb)->plainStep().isOk());
    EXPECT_EQ((*fa)->lastFusedTensors(), 4u);
  }
  ASSERT_TRUE((*fa)->flattenIntact());
  // The trainer moves tensor 1's weights to its own buffer (same values).
  std::vector<float> own(200);
  std::memcpy(own.data(), a.params()[1].data, 200 * sizeof(float));
  float* flatPlace = static_cast<float*>(a.params()[1].data);
  const std::vector<float> flatBefore(flatPlace, flatPlace + 200);
  a.params()[1].data = own.data();
  for (; step < 6; ++step) {
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((*fa)->fuseStep().isOk());
    ASSERT_TRUE((*fb)->plainStep().isOk());
    // Tensor 1 splits the run: [0] alone, [1] alone, [2, 3] fused.
    EXPECT_EQ((*fa)->lastFusedRuns(), 1u) << "step " << step;
    EXPECT_EQ((*fa)->lastFusedTensors(), 2u) << "step " << step;
    ASSERT_EQ(a.snapshot(), b.snapshot()) << "step " << step;
  }
  EXPECT_FALSE((*fa)->flattenIntact());
  // The old place in the flat buffer was not written after the move.
  EXPECT_EQ(std::memcmp(flatPlace, flatBefore.data(), 200 * sizeof(float)), 0);
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ((*fa)->stepCount(t), 6) << t;
  }
  EXPECT_EQ(stateBytes(**fa), stateBytes(**fb));
}

// checkFlatten off: a step compares only a window of kWatchWindow tensors; a re-pointed tensor
// is found within ceil(n / window) steps, at once after invalidatePlan(); step counts stay right.
TEST(Flatten, WithoutCheckFlattenAMoveIsFoundWithinOneSweepOrAtOnceWhenTold) {
  const size_t n = 3 * FusedOptimizer::kWatchWindow + 10;  // a sweep takes 4 steps
  std::vector<Spec> specs(n, Spec{3, DataType::kF32});
  Model a(specs);
  auto opt = Sgd::create(a.params(), SgdRule::Hyper{0.5}, smallChunks());
  ASSERT_TRUE(opt.isOk());
  FuseOptions trust;
  trust.checkFlatten = false;
  ASSERT_TRUE((*opt)->fuse(trust).isOk());
  a.fillGrads(0);
  ASSERT_TRUE((*opt)->fuseStep().isOk());
  EXPECT_EQ((*opt)->lastFusedTensors(), n);
  // Move the last tensor's gradient: found within 4 steps, then it steps alone.
  std::vector<float> ownGrad(3, 0.25f);
  a.params()[n - 1].grad = ownGrad.data();
  int stepsToFind = 0;
  for (int s = 1; s <= 5 && (*opt)->lastFusedTensors() == n; ++s) {
    ASSERT_TRUE((*opt)->fuseStep().isOk());
    stepsToFind = s;
  }
  EXPECT_EQ((*opt)->lastFusedTensors(), n - 1);
  EXPECT_LE(stepsToFind, 4);
  // From now on the moved gradient is the one applied: p -= 0.5 * 0.25 per step.
  const float before = static_cast<float*>(a.params()[n - 1].data)[2];
  ASSERT_TRUE((*opt)->fuseStep().isOk());
  EXPECT_EQ(static_cast<float*>(a.params()[n - 1].data)[2], before - 0.5f * 0.25f);
  // Told: the very next step re-plans. Move the gradient back into the flat buffer.
  a.params()[n - 1].grad = static_cast<float*>(a.params()[n - 2].grad) + 3;
  (*opt)->invalidatePlan();
  ASSERT_TRUE((*opt)->fuseStep().isOk());
  EXPECT_EQ((*opt)->lastFusedTensors(), n);
  EXPECT_EQ((*opt)->stepCount(0), 3 + stepsToFind);
  EXPECT_EQ((*opt)->stepCount(static_cast<int>(n) - 1), 3 + stepsToFind);
}

// Changing a hyper-parameter that changes the state mask re-plans; plainStep between fused steps
// keeps the per-run step counts right.
TEST(Flatten, PlanFollowsMaskChangesAndPlainSteps) {
  Model a(mixedSpecs()), b(mixedSpecs());
  AdamRule::Hyper h;
  h.amsgrad = true;
  auto fa = Adam::create(a.params(), h, smallChunks());
  auto fb = Adam::create(b.params(), h, smallChunks());
  ASSERT_TRUE(fa.isOk() && fb.isOk());
  ASSERT_TRUE((*fa)->fuse().isOk());
  for (int step = 0; step < 8; ++step) {
    if (step == 4) {
      (*fa)->hyper(0).amsgrad = false;
      (*fb)->hyper(0).amsgrad = false;
    }
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((step % 3 == 2 ? (*fa)->plainStep() : (*fa)->fuseStep()).isOk());
    ASSERT_TRUE((*fb)->plainStep().isOk());
    ASSERT_EQ(a.snapshot(), b.snapshot()) << "step " << step;
    ASSERT_EQ(stateBytes(**fa), stateBytes(**fb)) << "step " << step;
  }
  EXPECT_EQ((*fa)->stepCount(0), 8);
}

TEST(Flatten, NullGradientIsSkippedByPlainStepAndZeroedByFuse) {
  Model a({{10, DataType::kF32}, {10, DataType::kF32}});
  a.params()[1].grad = nullptr;
  auto opt = Sgd::create(a.params(), SgdRule::Hyper{0.5}, smallChunks());
  ASSERT_TRUE(opt.isOk());
  const auto before = a.snapshot();
  a.fillGrads(0);
  ASSERT_TRUE((*opt)->plainStep().isOk());
  EXPECT_EQ((*opt)->stepCount(0), 1);
  EXPECT_EQ((*opt)->stepCount(1), 0);
  EXPECT_EQ(std::memcmp(a.snapshot().data() + 40, before.data() + 40, 40), 0);
  ASSERT_TRUE((*opt)->fuse().isOk());
  ASSERT_NE(a.params()[1].grad, nullptr);
  EXPECT_EQ(static_cast<float*>(a.params()[1].grad)[3], 0.0f);
}

TEST(Flatten, DifferentStepCountsAreNotFusedTogether) {
  Model a({{10, DataType::kF32}, {10, DataType::kF32}, {10, DataType::kF32}});
  auto opt = Adam::create(a.params(), AdamRule::Hyper{}, smallChunks());
  ASSERT_TRUE(opt.isOk());
  ASSERT_TRUE((*opt)->fuse().isOk());
  // Step only tensor 0 once (the others have no gradient that step).
  void* g1 = a.params()[1].grad;
  void* g2 = a.params()[2].grad;
  a.params()[1].grad = nullptr;
  a.params()[2].grad = nullptr;
  a.fillGrads(0);
  ASSERT_TRUE((*opt)->fuseStep().isOk());
  a.params()[1].grad = g1;
  a.params()[2].grad = g2;
  a.fillGrads(1);
  ASSERT_TRUE((*opt)->fuseStep().isOk());
  EXPECT_EQ((*opt)->lastFusedTensors(), 2u) << "tensors 1 and 2 (step 1) fused, 0 (step 2) alone";
  EXPECT_EQ((*opt)->stepCount(0), 2);
  EXPECT_EQ((*opt)->stepCount(1), 1);
}

// ---- Threads
// -------------------------------------------------------------------------------------

TEST(Threads, ResultDoesNotDependOnThreadCount) {
  Model a(mixedSpecs()), b(mixedSpecs());
  auto one = Lamb::create(a.params(), LambRule::Hyper{}, smallChunks(1));
  auto four = Lamb::create(b.params(), LambRule::Hyper{}, smallChunks(4));
  ASSERT_TRUE(one.isOk() && four.isOk());
  ASSERT_TRUE((*four)->fuse().isOk());
  for (int step = 0; step < 5; ++step) {
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((*one)->step().isOk());
    ASSERT_TRUE((*four)->step().isOk());
    ASSERT_EQ(a.snapshot(), b.snapshot()) << step;
  }
}

// ---- Save / load
// ---------------------------------------------------------------------------------

TEST(State, SurvivesSaveAndLoadIntoAFreshOptimizer) {
  Model a(mixedSpecs()), b(mixedSpecs());
  AdamRule::Hyper h;
  h.amsgrad = true;
  auto first = Adam::create(a.params(), twoGroups<Adam>(h, {}, a.params().size()), smallChunks());
  ASSERT_TRUE(first.isOk());
  ASSERT_TRUE((*first)->fuse().isOk());
  for (int step = 0; step < 4; ++step) {
    a.fillGrads(step);
    ASSERT_TRUE((*first)->step().isOk());
  }
  auto saved = (*first)->saveState();
  ASSERT_TRUE(saved.isOk());
  // Model b gets a's weights (as a checkpoint would), a fresh optimizer and the saved state.
  for (size_t i = 0; i < a.params().size(); ++i) {
    std::memcpy(b.params()[i].data, a.params()[i].data, a.params()[i].bytes());
  }
  auto second = Adam::create(b.params(), twoGroups<Adam>(h, {}, b.params().size()), smallChunks());
  ASSERT_TRUE(second.isOk());
  ASSERT_TRUE((*second)->loadState(*saved).isOk());
  EXPECT_EQ((*second)->stepCount(0), 4);
  for (int step = 4; step < 8; ++step) {
    a.fillGrads(step);
    b.fillGrads(step);
    ASSERT_TRUE((*first)->step().isOk());
    ASSERT_TRUE((*second)->step().isOk());  // plain (not fused): same result
    ASSERT_EQ(a.snapshot(), b.snapshot()) << step;
  }
}

TEST(State, LoadRejectsMismatchesWithoutChangingAnything) {
  Model a({{10, DataType::kF32}, {20, DataType::kF32}});
  auto opt = Adam::create(a.params(), AdamRule::Hyper{}, smallChunks());
  ASSERT_TRUE(opt.isOk());
  a.fillGrads(0);
  ASSERT_TRUE((*opt)->step().isOk());
  auto saved = (*opt)->saveState();
  ASSERT_TRUE(saved.isOk());
  // Another rule.
  Model b({{10, DataType::kF32}, {20, DataType::kF32}});
  auto sgd = Sgd::create(b.params(), SgdRule::Hyper{0.1, 0.9}, smallChunks());
  ASSERT_TRUE(sgd.isOk());
  Status s = (*sgd)->loadState(*saved);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("adam"), std::string::npos) << s.toString();
  // Other sizes.
  Model c({{10, DataType::kF32}, {21, DataType::kF32}});
  auto other = Adam::create(c.params(), AdamRule::Hyper{}, smallChunks());
  ASSERT_TRUE(other.isOk());
  s = (*other)->loadState(*saved);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer1.w"), std::string::npos) << s.toString();
  EXPECT_EQ((*other)->stepCount(0), 0) << "a failed load changed the state";
  // Truncated and trailing bytes.
  auto cut = *saved;
  ASSERT_GT(cut.size(), 3u);
  // erase, not resize(size() - 3): that trips g++ 12's -Wstringop-overflow at -O1 (sanitize)
  cut.erase(cut.end() - 3, cut.end());
  EXPECT_EQ((*opt)->loadState(cut).code(), StatusCode::kInvalidArgument);
  auto longer = *saved;
  longer.push_back(0);
  EXPECT_EQ((*opt)->loadState(longer).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*opt)->loadState(*saved).isOk());
}

// ---- Input errors
// --------------------------------------------------------------------------------

TEST(Errors, BadInputIsRejectedWithAClearMessage) {
  Model a({{10, DataType::kF32}, {4, DataType::kI32}});
  auto opt = Sgd::create(a.params(), SgdRule::Hyper{}, smallChunks());
  ASSERT_FALSE(opt.isOk());
  EXPECT_NE(opt.status().toString().find("layer1.w"), std::string::npos) << opt.status().toString();

  Model b({{10, DataType::kF32}});
  SgdRule::Hyper h;
  h.nesterov = true;
  auto nesterov = Sgd::create(b.params(), h, smallChunks());
  ASSERT_FALSE(nesterov.isOk());
  EXPECT_NE(nesterov.status().message().find("nesterov"), std::string::npos);

  std::vector<Sgd::Group> groups(2);
  groups[0].params = {0};
  groups[1].params = {0};
  auto twice = Sgd::create(b.params(), groups, smallChunks());
  ASSERT_FALSE(twice.isOk());
  EXPECT_NE(twice.status().message().find("two groups"), std::string::npos);

  // Turning momentum on after creation needs a state that was never allocated.
  auto plain = Sgd::create(b.params(), SgdRule::Hyper{}, smallChunks());
  ASSERT_TRUE(plain.isOk());
  (*plain)->hyper(0).momentum = 0.9;
  EXPECT_EQ((*plain)->step().code(), StatusCode::kFailedPrecondition);
}

TEST(Errors, CudaParametersNeedACudaKernel) {
  // A user rule without a CUDA kernel (kCudaId -1) over CUDA parameters: a clear error whether or
  // not bagua was built with CUDA.
  Model a({{10, DataType::kF32}});
  a.params()[0].device = core::Device{core::DeviceType::kCuda, 0};
  auto opt =
      ElementwiseOptimizer<SignSgdRule>::create(a.params(), SignSgdRule::Hyper{}, smallChunks());
  ASSERT_FALSE(opt.isOk());
  EXPECT_EQ(opt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("cuda:0"), std::string::npos) << opt.status().toString();
}

}  // namespace
}  // namespace bagua::optim
