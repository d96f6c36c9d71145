// The algorithms on the host backend, ranks as threads over loopback: ByteGrad's communication
// result for world sizes 1-8 (bitwise equal to a step-by-step simulation of Bagua's op, bitwise
// identical across ranks, within a stated bound of the double-precision mean), hierarchical
// ByteGrad; QAdam equal to Adam during warm-up and finite, rank-identical weights after it; async
// model average (averaging, abort/resume sequences, bounded shutdown without abort); Bagua's
// gradient all-reduce and model-switch cases; gradient all-reduce's SUM + divide fallback against
// native AVG; CUDA tensors refused on the host backend; the factory. The decentralized
// algorithms: decentralized_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/compression.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/core/ddp.h"
#include "multi_rank.h"
#include "toy_training.h"

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;
using namespace toytest;

// ---- ByteGrad's communication ----------------------------------------------------------------

float input(int rank, size_t i) {
  return std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(rank)) *
             (1.0f + static_cast<float>(rank % 3)) +
         static_cast<float>((i / 50) % 4) - 0.1f * static_cast<float>(rank);
}

// Bagua's op step by step with the compression kernels: what chunk r ends as on every rank.
std::vector<float> simulateByteGrad(const std::vector<std::vector<float>>& in, size_t numel,
                                    bool average) {
  const size_t n = in.size();
  const size_t padded = (numel + n - 1) / n * n;
  const size_t c = padded / n;
  const size_t bytes = minMaxCompressedBytes(padded, n);
  std::vector<std::vector<float>> dq(n, std::vector<float>(padded));
  for (size_t s = 0; s < n; ++s) {
    std::vector<float> x(padded, 0.0f);
    std::copy(in[s].begin(), in[s].end(), x.begin());
    std::vector<uint8_t> buf(bytes);
    EXPECT_TRUE(minMaxCompress(x.data(), padded, n, buf.data(), bytes).isOk());
    EXPECT_TRUE(minMaxDecompress(buf.data(), bytes, padded, n, dq[s].data()).isOk());
  }
  std::vector<float> reduced(padded);
  for (size_t i = 0; i < padded; ++i) {
    float acc = dq[0][i];
    for (size_t s = 1; s < n; ++s) {
      acc += dq[s][i];
    }
    reduced[i] = average ? acc / static_cast<float>(n) : acc;
  }
  (void)c;
  std::vector<uint8_t> buf(bytes);
  std::vector<float> out(padded);
  EXPECT_TRUE(minMaxCompress(reduced.data(), padded, n, buf.data(), bytes).isOk());
  EXPECT_TRUE(minMaxDecompress(buf.data(), bytes, padded, n, out.data()).isOk());
  out.resize(numel);
  return out;
}

struct ByteGradCase {
  int world;
  int localWorld;  // < world: hierarchical over world / localWorld nodes
  bool average;
};

class ByteGradComm : public ::testing::TestWithParam<ByteGradCase> {};

TEST_P(ByteGradComm, BitwiseIdenticalAndWithinBound) {
  const ByteGradCase tc = GetParam();
  const bool hierarchical = tc.localWorld < tc.world;
  const size_t numel = 1000 + static_cast<size_t>(tc.world) * 3 + 1;  // needs padding
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<float>> in(tc.world), out(tc.world);
  for (int r = 0; r < tc.world; ++r) {
    for (size_t i = 0; i < numel; ++i) {
      in[r].push_back(input(r, i));
    }
  }
  auto res = testing::runRanks(
      tc.world,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, tc.world, tc.localWorld, hierarchical);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        auto algo = createAlgorithm("bytegrad", {{"hierarchical", hierarchical ? "true" : "false"},
                                                 {"average", tc.average ? "true" : "false"}});
        if (!algo.isOk()) {
          return algo.status().toString();
        }
        auto impl = (*algo)->reify(**pg);
        if (!impl.isOk()) {
          return impl.status().toString();
        }
        out[r] = in[r];
        core::Bucket b;
        b.index = 0;
        b.numel = numel;
        b.flat = out[r].data();
        Status s = (*impl)->initOperations(b);
        for (int round = 0; s.isOk() && round < 2; ++round) {
          out[r] = in[r];  // a second round reuses the scratch buffers
          s = (*impl)->runBucket(b, **pg);
        }
        return s.isOk() ? "" : s.toString();
      },
      60s);
  ASSERT_EQ(testing::joinFailures(res), "");
  for (int r = 1; r < tc.world; ++r) {
    ASSERT_EQ(std::memcmp(out[r].data(), out[0].data(), numel * 4), 0) << "rank " << r;
  }
  if (!hierarchical) {
    const auto want = simulateByteGrad(in, numel, tc.average);
    ASSERT_EQ(std::memcmp(out[0].data(), want.data(), numel * 4), 0);
  }
  // Bound: two quantisations, each at most half a step of its chunk's range (range <= R, the
  // spread of all inputs, times n when summing), plus float rounding.
  double lo = 1e300, hi = -1e300;
  for (const auto& v : in) {
    for (float f : v) {
      lo = std::min(lo, static_cast<double>(f));
      hi = std::max(hi, static_cast<double>(f));
    }
  }
  const double n = tc.world;
  const double range = (hi - lo) * (tc.average ? 1.0 : n);
  const double bound = range / 510.0 * (tc.average ? 2.0 : 1.0 + 1.0) + 1e-4 * (tc.average ? 1 : n);
  double maxErr = 0;
  for (size_t i = 0; i < numel; ++i) {
    double acc = 0;
    for (int r = 0; r < tc.world; ++r) {
      acc += in[r][i];
    }
    const double want = tc.average ? acc / n : acc;
    maxErr = std::max(maxErr, std::fabs(out[0][i] - want));
  }
  EXPECT_LE(maxErr, bound) << "max error " << maxErr;
  EXPECT_GT(maxErr, 0.0) << "8-bit compression cannot be exact on this data";
}

INSTANTIATE_TEST_SUITE_P(Worlds, ByteGradComm,
                         ::testing::Values(ByteGradCase{1, 1, true}, ByteGradCase{2, 2, true},
                                           ByteGradCase{3, 3, true}, ByteGradCase{4, 4, true},
                                           ByteGradCase{5, 5, true}, ByteGradCase{8, 8, true},
                                           ByteGradCase{4, 4, false}, ByteGradCase{4, 2, true},
                                           ByteGradCase{8, 4, true}, ByteGradCase{6, 2, false}));

// ---- QAdam -----------------------------------------------------------------------------------

// torch.optim.Adam's float32 update (scalars in double), written independently.
void adamStep(std::vector<float>& x, const std::vector<float>& g, std::vector<float>& m,
              std::vector<float>& v, int t, float lr, float wd) {
  const double bc1 = 1.0 - std::pow(0.9, t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(0.999f), t);
  const float stepSize =
      static_cast<float>(static_cast<double>(lr) / (1.0 - std::pow(static_cast<double>(0.9f), t)));
  (void)bc1;
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  for (size_t i = 0; i < x.size(); ++i) {
    const float gi = g[i] + x[i] * wd;
    m[i] = m[i] * 0.9f + gi * (1.0f - 0.9f);
    v[i] = v[i] * 0.999f + gi * gi * (1.0f - 0.999f);
    x[i] = x[i] + (-stepSize) * (m[i] / (std::sqrt(v[i]) / bc2Sqrt + 1e-8f));
  }
}

// Each rank's final toy weights and QAdam step count (trainQAdamToy).
struct QAdamToyRun {
  std::vector<std::vector<float>> weights;
  std::vector<int64_t> stepCounts;
};

// QAdam on the toy: `world` ranks (nodes of `localWorld`, sub-groups when `hierarchical`) train
// `steps` iterations with QAdamOptimizer(o) and the qadam algorithm built with `args`, the
// gradient of element i at a step being grad(rank, step, i).
std::string trainQAdamToy(int world, int localWorld, bool hierarchical, const QAdamOptions& o,
                          const AlgorithmArgs& args, int steps,
                          const std::function<float(int rank, int step, size_t i)>& grad,
                          QAdamToyRun* out) {
  auto store = std::make_shared<core::InMemoryStore>();
  out->weights.assign(world, {});
  out->stepCounts.assign(world, 0);
  auto res = testing::runRanks(
      world,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, world, localWorld, hierarchical);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        auto opt = QAdamOptimizer::create(toy.params, o);
        if (!opt.isOk()) {
          return opt.status().toString();
        }
        auto algo = createAlgorithm("qadam", args, opt->get());
        if (!algo.isOk()) {
          return algo.status().toString();
        }
        std::vector<Parameter> buffers;
        auto ddp = core::withBagua(toy.params, buffers, {opt->get()}, *algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        for (int step = 0; step < steps; ++step) {
          Status s = toyStep(**ddp, toy, [&](size_t i) { return grad(r, step, i); });
          if (!s.isOk()) {
            return strPrintf("step %d: %s", step, s.toString().c_str());
          }
        }
        out->weights[r] = toy.flat();
        out->stepCounts[r] = (*opt)->stepCount();
        return "";
      },
      60s);
  return testing::joinFailures(res);
}

TEST(QAdam, EqualsAdamDuringWarmup) {
  QAdamOptions o;
  o.warmupSteps = 2000;
  o.weightDecay = 0.1f;
  for (int world : {1, 2}) {
    // Identical on every rank, so the average is exact and Adam's input known.
    QAdamToyRun run;
    ASSERT_EQ(trainQAdamToy(
                  world, -1, false, o, {{"hierarchical", "false"}}, 30,
                  [](int, int step, size_t i) { return toyGrad(0, step, i); }, &run),
              "");
    std::vector<float> x(toyNumel()), m(toyNumel(), 0.0f), v(toyNumel(), 0.0f), g(toyNumel());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = initWeight(0, i);
    }
    for (int t = 1; t <= 30; ++t) {
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = toyGrad(0, t - 1, i);
      }
      adamStep(x, g, m, v, t, 1e-3f, 0.1f);
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(run.weights[r], x) << "world " << world << " rank " << r;
    }
  }
}

TEST(QAdam, CompressedStageKeepsRanksIdenticalAndFinite) {
  constexpr int kWorld = 4;
  QAdamOptions o;
  o.warmupSteps = 3;
  o.lr = 0.01f;
  // Two nodes of 2, the algorithm hierarchical by default. Element 5 never gets a gradient in
  // warm-up: v stays 0 there (Bagua #654's NaN).
  QAdamToyRun run;
  ASSERT_EQ(
      trainQAdamToy(
          kWorld, 2, true, o, {}, 10,
          [](int r, int step, size_t i) { return i == 5 && step < 3 ? 0.0f : toyGrad(r, step, i); },
          &run),
      "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.stepCounts[r], 10);
    EXPECT_EQ(run.weights[r], run.weights[0]) << "rank " << r;
    for (float f : run.weights[r]) {
      ASSERT_TRUE(std::isfinite(f));
    }
  }
}

TEST(QAdam, RejectsZeroWarmup) {
  std::vector<Parameter> params;
  QAdamOptions o;
  o.warmupSteps = 0;
  EXPECT_EQ(QAdamOptimizer::create(params, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(createAlgorithm("qadam", {}).status().code(), StatusCode::kInvalidArgument);
}

// ---- Async model average -----------------------------------------------------------------------

TEST(AsyncModelAverage, AveragesInTheBackgroundAndStopsTogether) {
  constexpr int kWorld = 3;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<float>> got(kWorld);
  std::vector<int64_t> rounds(kWorld);
  auto res = testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, kWorld, -1, false);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        core::Sgd opt(toy.params, 1.0f);
        auto algo = std::make_shared<AsyncModelAverage>(10, 0);
        std::vector<Parameter> buffers;
        auto ddp = core::withBagua(toy.params, buffers, {&opt}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        auto iterate = [&](bool perturb) -> Status {
          BAGUA_RETURN_IF_ERROR((*ddp)->prepareForward());
          if (perturb) {  // under the weight lock, as a forward/backward would change them
            for (auto& d : toy.data) {
              for (float& f : d) {
                f += static_cast<float>(r + 1);
              }
            }
          }
          for (int k = 1; k >= 0; --k) {
            BAGUA_RETURN_IF_ERROR((*ddp)->markGradReady(k));  // gradients stay zero
          }
          BAGUA_RETURN_IF_ERROR((*ddp)->finishBackward());
          return (*ddp)->step();
        };
        RETURN_IF_FAILED(iterate(true));
        const int64_t start = algo->rounds();
        const auto deadline = std::chrono::steady_clock::now() + 20s;
        while (algo->rounds() < start + 3) {
          if (std::chrono::steady_clock::now() > deadline) {
            return "no averaging rounds within 20 s";
          }
          RETURN_IF_FAILED(iterate(false));
          std::this_thread::sleep_for(2ms);
        }
        RETURN_IF_FAILED(algo->abort());
        RETURN_IF_FAILED(algo->abort());  // repeated abort: no-op
        rounds[r] = algo->rounds();
        got[r] = toy.flat();
        // resume / abort / resume, training in between, then the reducer goes away without
        // a final abort(): shutdown must be prompt.
        RETURN_IF_FAILED(algo->resume());
        for (int i = 0; i < 5; ++i) {
          RETURN_IF_FAILED(iterate(false));
        }
        RETURN_IF_FAILED(algo->abort());
        RETURN_IF_FAILED(algo->resume());
        RETURN_IF_FAILED(iterate(false));
        const auto t0 = std::chrono::steady_clock::now();
        ddp->reset();
        if (std::chrono::steady_clock::now() - t0 > 10s) {
          return "shutdown without abort() took more than 10 s";
        }
        return "";
      },
      90s);
  ASSERT_EQ(testing::joinFailures(res), "");
  // Every rank stopped in the same round.
  EXPECT_EQ(rounds[1], rounds[0]);
  EXPECT_EQ(rounds[2], rounds[0]);
  // Each rank added r + 1 to its weights: after averaging everyone holds w0 + mean = w0 + 2.
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < toyNumel(); ++i) {
      ASSERT_NEAR(got[r][i], initWeight(0, i) + 2.0f, 1e-4) << "rank " << r << " element " << i;
    }
  }
}

TEST(AsyncModelAverage, WarmupThenResumeAbortSequences) {
  TrainSpec spec;
  spec.world = 2;
  spec.steps = 12;
  spec.grad = toyGrad;
  spec.sleepPerStep = 3ms;
  spec.algorithm = [](int) {
    return createAlgorithm("async", {{"sync_interval_ms", "5"}, {"warmup_steps", "4"}});
  };
  std::vector<std::vector<float>> during(2);
  spec.after = [&](int r, int step, Toy& toy, core::Algorithm& a) -> std::string {
    auto& algo = static_cast<AsyncModelAverage&>(a);
    if (step == 2) {
      // Warm-up: gradient all-reduce keeps the ranks identical.
      during[r] = toy.flat();
      RETURN_IF_FAILED(algo.resume());
      RETURN_IF_FAILED(algo.abort());
      RETURN_IF_FAILED(algo.resume());
    }
    if (step == 8) {
      RETURN_IF_FAILED(algo.abort());
      RETURN_IF_FAILED(algo.abort());
      RETURN_IF_FAILED(algo.resume());
    }
    if (step == spec.steps - 1) {
      RETURN_IF_FAILED(algo.abort());
    }
    return "";
  };
  std::vector<std::vector<float>> got;
  ASSERT_EQ(train(spec, &got), "");
  EXPECT_EQ(during[0], during[1]);
  for (int r = 0; r < 2; ++r) {
    for (float f : got[r]) {
      ASSERT_TRUE(std::isfinite(f));
    }
  }
}

// ---- Bagua's test_gradient_allreduce and test_model_switch ------------------------------------

TEST(BaguaCases, GradientAllReduceRanksBitwiseEqual) {
  TrainSpec spec;
  spec.world = 4;
  spec.steps = 10;
  spec.grad = toyGrad;
  spec.algorithm = [](int) { return createAlgorithm("gradient_allreduce", {}); };
  std::vector<std::vector<float>> got;
  ASSERT_EQ(train(spec, &got), "");
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
  }
}

// One model re-wrapped through every algorithm in turn (bytegrad -> decentralized ->
// gradient_allreduce -> qadam -> async -> low_precision_decentralized), a few steps each; each
// wrap re-broadcasts rank 0's weights, so the ranks agree right after every switch.
TEST(BaguaCases, ModelSwitch) {
  constexpr int kWorld = 2;
  auto store = std::make_shared<core::InMemoryStore>();
  auto res = testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, kWorld, -1, false);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        std::vector<Parameter> buffers;
        const std::vector<std::pair<std::string, AlgorithmArgs>> order = {
            {"bytegrad", {{"hierarchical", "false"}}},
            {"decentralized", {{"hierarchical", "false"}}},
            {"gradient_allreduce", {}},
            {"qadam", {{"hierarchical", "false"}}},
            {"async", {{"sync_interval_ms", "2"}, {"warmup_steps", "2"}}},
            {"low_precision_decentralized", {{"hierarchical", "false"}}},
        };
        for (const auto& [name, args] : order) {
          core::Sgd sgd(toy.params, 0.1f);
          QAdamOptions qo;
          qo.warmupSteps = 2;
          auto qadam = QAdamOptimizer::create(toy.params, qo);
          if (!qadam.isOk()) {
            return qadam.status().toString();
          }
          core::Optimizer* opt = name == "qadam" ? static_cast<core::Optimizer*>(qadam->get())
                                                 : static_cast<core::Optimizer*>(&sgd);
          auto algo = createAlgorithm(name, args, qadam->get());
          if (!algo.isOk()) {
            return algo.status().toString();
          }
          auto ddp = core::withBagua(toy.params, buffers, {opt}, *algo, **pg);
          if (!ddp.isOk()) {
            return name + ": " + ddp.status().toString();
          }
          // Right after wrapping every rank holds rank 0's weights: report a checksum.
          double sum = 0;
          for (float f : toy.flat()) {
            sum += f;
          }
          double theirs = sum;
          auto w = (*pg)->global().broadcast(&theirs, 1, core::DataType::kF64, 0);
          RETURN_IF_FAILED(w->wait(20s));
          if (theirs != sum) {
            return name + ": weights differ from rank 0's right after wrapping";
          }
          for (int step = 0; step < 5; ++step) {
            RETURN_IF_FAILED(toyStep(**ddp, toy, [&](size_t i) { return toyGrad(r, step, i); }));
          }
          if (name == "async") {
            RETURN_IF_FAILED(static_cast<AsyncModelAverage&>(**algo).abort());
          }
          for (float f : toy.flat()) {
            if (!std::isfinite(f)) {
              return name + ": non-finite weight";
            }
          }
        }
        return "";
      },
      90s);
  EXPECT_EQ(testing::joinFailures(res), "");
}

// ---- Gradient AllReduce: native AVG against Bagua's SUM + divide fallback ----------------------

struct AllReduceCase {
  int world;
  int localWorld;
};

class GradientAllReduceModes : public ::testing::TestWithParam<AllReduceCase> {};

// The fallback for NCCL without ncclAvg (Bagua #363) must give the mean as the native AVG does:
// within float rounding of the double-precision mean, bitwise the same on every rank.
TEST_P(GradientAllReduceModes, SumThenDivideEqualsNativeAverage) {
  const AllReduceCase tc = GetParam();
  const bool hierarchical = tc.localWorld < tc.world;
  const size_t numel = 777;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<float>> in(tc.world);
  for (int r = 0; r < tc.world; ++r) {
    for (size_t i = 0; i < numel; ++i) {
      in[r].push_back(input(r, i));
    }
  }
  std::vector<std::vector<float>> native(tc.world), fallback(tc.world);
  auto res = testing::runRanks(
      tc.world,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, tc.world, tc.localWorld, hierarchical);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        for (AverageMode mode : {AverageMode::kNative, AverageMode::kSumThenDivide}) {
          GradientAllReduce algo(hierarchical, true, mode);
          auto impl = algo.reify(**pg);
          if (!impl.isOk()) {
            return impl.status().toString();
          }
          auto& out = mode == AverageMode::kNative ? native[r] : fallback[r];
          out = in[r];
          core::Bucket b;
          b.numel = numel;
          b.flat = out.data();
          RETURN_IF_FAILED((*impl)->initOperations(b));
          RETURN_IF_FAILED((*impl)->runBucket(b, **pg));
        }
        return "";
      },
      60s);
  ASSERT_EQ(testing::joinFailures(res), "");
  for (size_t i = 0; i < numel; ++i) {
    double acc = 0;
    for (int r = 0; r < tc.world; ++r) {
      acc += in[r][i];
    }
    const double want = acc / tc.world;
    const double tol = 1e-5 * (1.0 + std::fabs(want));
    ASSERT_NEAR(fallback[0][i], want, tol) << "element " << i;
    ASSERT_NEAR(native[0][i], want, tol) << "element " << i;
  }
  for (int r = 1; r < tc.world; ++r) {
    EXPECT_EQ(std::memcmp(fallback[r].data(), fallback[0].data(), numel * 4), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(native[r].data(), native[0].data(), numel * 4), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, GradientAllReduceModes,
                         ::testing::Values(AllReduceCase{1, 1}, AllReduceCase{2, 2},
                                           AllReduceCase{3, 3}, AllReduceCase{5, 5},
                                           AllReduceCase{8, 8}, AllReduceCase{4, 2},
                                           AllReduceCase{8, 4}));

// CUDA tensors on the host backend: refused up front with an error naming the tensor and what
// to do (NCCL backend, or a build with it), in builds with and without CUDA.
TEST(DeviceTensors, RefusedOnTheHostBackendWithAClearError) {
  auto store = std::make_shared<core::InMemoryStore>();
  auto pg = makeGroup(store, 0, 1, 1, false);
  ASSERT_TRUE(pg.isOk()) << pg.status().toString();
  float fake[4] = {};
  std::vector<Parameter> params(1);
  params[0].name = "fc.weight";
  params[0].data = fake;  // never dereferenced: the check comes first
  params[0].grad = fake;
  params[0].numel = 4;
  params[0].device = {core::DeviceType::kCuda, 0};
  std::vector<Parameter> buffers;
  core::Sgd sgd(params, 0.1f);
  for (const char* name : {"gradient_allreduce", "bytegrad", "decentralized"}) {
    auto algo = createAlgorithm(name, {{"hierarchical", "false"}});
    ASSERT_TRUE(algo.isOk());
    auto ddp = core::withBagua(params, buffers, {&sgd}, *algo, **pg);
    ASSERT_FALSE(ddp.isOk()) << name;
    const std::string msg = ddp.status().toString();
    EXPECT_NE(msg.find("fc.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NCCL"), std::string::npos) << msg;
  }
}

// ---- Factory -----------------------------------------------------------------------------------

TEST(Factory, NamesDefaultsAndStrictArguments) {
  std::vector<Parameter> params;
  auto opt = QAdamOptimizer::create(params, {});
  ASSERT_TRUE(opt.isOk());
  for (const std::string& name : algorithmNames()) {
    auto a = createAlgorithm(name, {}, opt->get());
    ASSERT_TRUE(a.isOk()) << name << ": " << a.status().toString();
    EXPECT_EQ((*a)->name(), name);
  }
  EXPECT_EQ(createAlgorithm("sgd").status().code(), StatusCode::kInvalidArgument);
  auto bad = createAlgorithm("bytegrad", {{"hierarchicl", "false"}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hierarchical"), std::string::npos)
      << "lists the accepted keys: " << bad.status().message();
  EXPECT_FALSE(createAlgorithm("decentralized", {{"peer_selection_mode", "ring"}}).isOk());
  EXPECT_FALSE(createAlgorithm("decentralized", {{"communication_interval", "0"}}).isOk());
  EXPECT_FALSE(createAlgorithm("async", {{"sync_interval_ms", "12x"}}).isOk());
  EXPECT_FALSE(createAlgorithm("async", {{"peer_selection_mode", "shift_one"}}).isOk());
  EXPECT_FALSE(createAlgorithm("bytegrad", {{"average", "yes"}}).isOk());
  EXPECT_TRUE(createAlgorithm("gradient_allreduce", {{"hierarchical", "true"}}).isOk());
}

}  // namespace
}  // namespace bagua::algo
