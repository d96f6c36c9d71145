// The algorithms on the host backend, ranks as threads over loopback: ByteGrad's communication
// result for world sizes 1-8 (bitwise equal to a step-by-step simulation of Bagua's op, bitwise
// identical across ranks, within a stated bound of the double-precision mean), hierarchical
// ByteGrad; decentralized SGD against a double-precision simulation (all, shift_one, intervals,
// one node with hierarchical=true: Bagua #380); the shift_one schedule; low-precision
// decentralized against a simulation and its exact replica invariant; QAdam equal to Adam
// during warm-up and finite, rank-identical weights after it; async model average (averaging,
// abort/resume sequences, bounded shutdown without abort); gradient all-reduce's SUM + divide
// fallback against native AVG; CUDA tensors refused on the host backend; the factory.
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

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;

// In a rank body (which returns its failure text).
#define RETURN_IF_FAILED(expr) \
  do {                         \
    Status s_ = (expr);        \
    if (!s_.isOk()) {          \
      return s_.toString();    \
    }                          \
  } while (0)
using core::Parameter;
using core::ProcessGroup;

Result<std::unique_ptr<ProcessGroup>> makeGroup(std::shared_ptr<core::Store> store, int rank,
                                                int world, int localWorld, bool hierarchical) {
  core::ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = world;
  po.localWorldSize = localWorld;
  po.hierarchical = hierarchical;
  po.rendezvousTimeout = 20000ms;
  po.collectiveTimeout = 20000ms;
  return ProcessGroup::create(std::move(store), po);
}

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

// ---- Training harness on a toy model whose gradients the test dictates ------------------------

const std::vector<size_t> kSizes = {37, 101};

float initWeight(int rank, size_t i) {
  return std::cos(static_cast<float>(i) * 0.21f) + 100.0f * static_cast<float>(rank);
}

struct Toy {
  std::vector<std::vector<float>> data, grad;
  std::vector<Parameter> params;
  explicit Toy(int rank) {
    size_t base = 0;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      data.emplace_back(kSizes[k]);
      grad.emplace_back(kSizes[k], 0.0f);
      for (size_t i = 0; i < kSizes[k]; ++i) {
        data[k][i] = initWeight(rank, base + i);
      }
      base += kSizes[k];
    }
    for (size_t k = 0; k < kSizes.size(); ++k) {
      Parameter p;
      p.name = "p" + std::to_string(k);
      p.data = data[k].data();
      p.grad = grad[k].data();
      p.numel = kSizes[k];
      params.push_back(p);
    }
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& d : data) {
      out.insert(out.end(), d.begin(), d.end());
    }
    return out;
  }
};

size_t toyNumel() {
  return kSizes[0] + kSizes[1];
}

struct TrainSpec {
  int world = 4;
  int localWorld = -1;
  bool hierarchicalGroup = false;
  int steps = 6;
  std::function<Result<std::shared_ptr<core::Algorithm>>(int rank)> algorithm;
  std::function<float(int rank, int step, size_t i)> grad;
  // Optional: called after each step (rank, step, toy, algorithm); non-empty fails the rank.
  std::function<std::string(int, int, Toy&, core::Algorithm&)> after;
  std::chrono::milliseconds sleepPerStep{0};
  // Optional: per rank, the operations run on the training group (all its communicators) from
  // the end of the second step (the wrap's broadcast and the reducer's one rebuild behind) to
  // the end.
  std::vector<uint64_t>* trainingGroupOps = nullptr;
};

// SGD with lr 1 and no momentum: x <- x - g.
std::string train(const TrainSpec& spec, std::vector<std::vector<float>>* weights) {
  auto store = std::make_shared<core::InMemoryStore>();
  weights->assign(spec.world, {});
  if (spec.trainingGroupOps != nullptr) {
    spec.trainingGroupOps->assign(spec.world, 0);
  }
  auto res = testing::runRanks(
      spec.world,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, spec.world, spec.localWorld, spec.hierarchicalGroup);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        core::Sgd opt(toy.params, 1.0f);
        std::vector<core::Parameter> buffers;
        auto algo = spec.algorithm(r);
        if (!algo.isOk()) {
          return algo.status().toString();
        }
        auto ddp = core::withBagua(toy.params, buffers, {&opt}, *algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        core::DistributedDataParallel& d = **ddp;
        uint64_t opsAfterSecondStep = 0;
        for (int step = 0; step < spec.steps; ++step) {
          RETURN_IF_FAILED(d.prepareForward());
          size_t base = 0;
          for (size_t k = 0; k < kSizes.size(); ++k) {
            for (size_t i = 0; i < kSizes[k]; ++i) {
              toy.grad[k][i] = spec.grad(r, step, base + i);
            }
            base += kSizes[k];
          }
          for (int k = static_cast<int>(kSizes.size()) - 1; k >= 0; --k) {
            Status s = d.markGradReady(k);
            if (!s.isOk()) {
              return s.toString();
            }
          }
          Status s = d.finishBackward();
          if (s.isOk()) {
            s = d.step();
          }
          if (!s.isOk()) {
            return strPrintf("step %d: %s", step, s.toString().c_str());
          }
          if (spec.after) {
            std::string e = spec.after(r, step, toy, **algo);
            if (!e.empty()) {
              return e;
            }
          }
          if (spec.sleepPerStep.count() > 0) {
            std::this_thread::sleep_for(spec.sleepPerStep);
          }
          if (step == 1) {
            opsAfterSecondStep = (*pg)->stats().operations;
          }
        }
        if (spec.trainingGroupOps != nullptr) {
          (*spec.trainingGroupOps)[r] = (*pg)->stats().operations - opsAfterSecondStep;
        }
        (*weights)[r] = toy.flat();
        return "";
      },
      90s);
  return testing::joinFailures(res);
}

float toyGrad(int rank, int step, size_t i) {
  return 0.05f * std::sin(static_cast<float>(i) * 0.13f + static_cast<float>(step)) *
             static_cast<float>(rank + 1) +
         0.01f * static_cast<float>(rank) - 0.002f * static_cast<float>(step);
}

// ---- Decentralized -----------------------------------------------------------------------------

TEST(ShiftOne, BaguaScheduleIsAPairingAcrossHalves) {
  // Hand-computed with Bagua's formula for n = 4.
  EXPECT_EQ(Decentralized::shiftOnePeer(0, 4, 0), 2);
  EXPECT_EQ(Decentralized::shiftOnePeer(1, 4, 0), 3);
  EXPECT_EQ(Decentralized::shiftOnePeer(0, 4, 1), 3);
  EXPECT_EQ(Decentralized::shiftOnePeer(1, 4, 1), 2);
  EXPECT_EQ(Decentralized::shiftOnePeer(2, 4, 1), 1);
  EXPECT_EQ(Decentralized::shiftOnePeer(3, 4, 1), 0);
  for (int n : {2, 4, 6, 8}) {
    for (int64_t s = 0; s < 9; ++s) {
      std::vector<int> seen(n, 0);
      for (int r = 0; r < n; ++r) {
        const int p = Decentralized::shiftOnePeer(r, n, s);
        ASSERT_GE(p, 0);
        ASSERT_LT(p, n);
        EXPECT_EQ((r < n / 2), (p >= n / 2)) << "pairs cross the halves";
        EXPECT_EQ(Decentralized::shiftOnePeer(p, n, s), r) << "n " << n << " step " << s;
        ++seen[p];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
    }
    // Over n/2 steps rank 0 meets every rank of the other half.
    std::vector<int> met;
    for (int64_t s = 0; s < n / 2; ++s) {
      met.push_back(Decentralized::shiftOnePeer(0, n, s));
    }
    std::sort(met.begin(), met.end());
    EXPECT_EQ(std::unique(met.begin(), met.end()) - met.begin(), n / 2);
  }
}

// Double-precision D-PSGD: x_{t+1} = mix(x_t) - g_t(x_t), mixing when t % interval == 0.
std::vector<std::vector<double>> simulateDecentralized(int world, bool shiftOne, int interval,
                                                       int steps) {
  std::vector<std::vector<double>> x(world, std::vector<double>(toyNumel()));
  for (auto& v : x) {
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = initWeight(0, i);  // rank 0's weights after the broadcast
    }
  }
  int64_t comm = 0;
  for (int t = 0; t < steps; ++t) {
    if (t % interval == 0) {
      auto y = x;
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < toyNumel(); ++i) {
          if (shiftOne) {
            y[r][i] = (x[r][i] + x[Decentralized::shiftOnePeer(r, world, comm)][i]) / 2;
          } else {
            double acc = 0;
            for (int q = 0; q < world; ++q) {
              acc += x[q][i];
            }
            y[r][i] = acc / world;
          }
        }
      }
      x = y;
      ++comm;
    }
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < toyNumel(); ++i) {
        x[r][i] -= toyGrad(r, t, i);
      }
    }
  }
  return x;
}

struct DecentralizedCase {
  const char* mode;
  int interval;
  bool hierarchical;  // on one node: Bagua #380's configuration
};

class DecentralizedTrain : public ::testing::TestWithParam<DecentralizedCase> {};

TEST_P(DecentralizedTrain, MatchesDoublePrecisionSimulation) {
  const auto tc = GetParam();
  TrainSpec spec;
  spec.world = 4;
  spec.hierarchicalGroup = tc.hierarchical;
  spec.steps = 7;
  spec.grad = toyGrad;
  spec.algorithm = [&](int) {
    return createAlgorithm("decentralized",
                           {{"hierarchical", tc.hierarchical ? "true" : "false"},
                            {"peer_selection_mode", tc.mode},
                            {"communication_interval", std::to_string(tc.interval)}});
  };
  std::vector<uint64_t> ops;
  spec.trainingGroupOps = &ops;
  std::vector<std::vector<float>> got;
  ASSERT_EQ(train(spec, &got), "");
  // The exchanges ran on the worker's own group: none on the training group, where the
  // trainer's collectives (a SyncBatchNorm's) would otherwise race them for the order.
  EXPECT_EQ(ops, std::vector<uint64_t>(4, 0));
  const auto want = simulateDecentralized(4, std::string(tc.mode) == "shift_one", tc.interval, 7);
  for (int r = 0; r < 4; ++r) {
    for (size_t i = 0; i < toyNumel(); ++i) {
      ASSERT_NEAR(got[r][i], want[r][i], 1e-5 * std::max(1.0, std::fabs(want[r][i])))
          << "rank " << r << " element " << i;
    }
  }
  // Ranks really differ (gradients are rank-dependent): the comparison is not vacuous.
  EXPECT_NE(got[0], got[1]);
}

INSTANTIATE_TEST_SUITE_P(Modes, DecentralizedTrain,
                         ::testing::Values(DecentralizedCase{"all", 1, false},
                                           DecentralizedCase{"shift_one", 1, false},
                                           DecentralizedCase{"shift_one", 2, false},
                                           DecentralizedCase{"all", 3, false},
                                           DecentralizedCase{"shift_one", 1, true}));

TEST(DecentralizedTrainHierarchical, TwoNodesAverageNodeMeans) {
  TrainSpec spec;
  spec.world = 4;
  spec.localWorld = 2;
  spec.hierarchicalGroup = true;
  spec.steps = 5;
  spec.grad = toyGrad;
  spec.algorithm = [](int) { return createAlgorithm("decentralized", {}); };
  std::vector<std::vector<float>> got;
  ASSERT_EQ(train(spec, &got), "");
  // Equal node sizes: the mean of node means is the global mean, so "all" equals the flat run.
  const auto want = simulateDecentralized(4, false, 1, 5);
  for (int r = 0; r < 4; ++r) {
    for (size_t i = 0; i < toyNumel(); ++i) {
      ASSERT_NEAR(got[r][i], want[r][i], 1e-5 * std::max(1.0, std::fabs(want[r][i])));
    }
  }
}

// Gradient accumulation: the first micro-batch of each step runs inside noSync(), where the
// reducer skips post-backward; the exchange started at its forward is applied once, at the end.
TEST(DecentralizedTrain, NoSyncMicroBatches) {
  constexpr int kWorld = 4;
  constexpr int kSteps = 4;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<float>> got(kWorld);
  auto res = testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, kWorld, -1, false);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        core::Sgd opt(toy.params, 1.0f);
        std::vector<Parameter> buffers;
        auto algo = createAlgorithm("decentralized", {{"hierarchical", "false"}});
        auto ddp = core::withBagua(toy.params, buffers, {&opt}, *algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        core::DistributedDataParallel& d = **ddp;
        for (int step = 0; step < kSteps; ++step) {
          for (int micro = 0; micro < 2; ++micro) {
            std::optional<core::DistributedDataParallel::NoSyncGuard> guard;
            if (micro == 0) {
              guard.emplace(&d);
            }
            RETURN_IF_FAILED(d.prepareForward());
            size_t base = 0;
            for (size_t k = 0; k < kSizes.size(); ++k) {
              for (size_t i = 0; i < kSizes[k]; ++i) {
                // Overwritten, not accumulated: the step uses the last micro-batch's gradient.
                toy.grad[k][i] = micro == 0 ? 1e3f : toyGrad(r, step, base + i);
              }
              base += kSizes[k];
            }
            for (int k = 1; k >= 0; --k) {
              RETURN_IF_FAILED(d.markGradReady(k));
            }
            RETURN_IF_FAILED(d.finishBackward());
          }
          RETURN_IF_FAILED(d.step());
        }
        got[r] = toy.flat();
        return "";
      },
      60s);
  ASSERT_EQ(testing::joinFailures(res), "");
  const auto want = simulateDecentralized(kWorld, false, 1, kSteps);
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < toyNumel(); ++i) {
      ASSERT_NEAR(got[r][i], want[r][i], 1e-5 * std::max(1.0, std::fabs(want[r][i])))
          << "rank " << r << " element " << i;
    }
  }
}

TEST(DecentralizedErrors, ShiftOneOnOddRanksExplains) {
  auto store = std::make_shared<core::InMemoryStore>();
  auto res = testing::runRanks(
      3,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, 3, -1, false);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        auto algo = createAlgorithm(
            "decentralized", {{"hierarchical", "false"}, {"peer_selection_mode", "shift_one"}});
        auto impl = (*algo)->reify(**pg);
        if (impl.isOk() || impl.status().code() != StatusCode::kInvalidArgument ||
            impl.status().message().find("even number") == std::string::npos) {
          return "expected an explanation, got: " + impl.status().toString();
        }
        return "";
      },
      30s);
  EXPECT_EQ(testing::joinFailures(res), "");
}

// ---- Low-precision decentralized ---------------------------------------------------------------

// Float simulation with the same kernels (Bagua's test_compare does the same, atol 1e-5).
std::vector<std::vector<float>> simulateLowPrecision(int world, int interval, int steps) {
  const size_t n = toyNumel();
  std::vector<std::vector<float>> x(world, std::vector<float>(n));
  for (auto& v : x) {
    for (size_t i = 0; i < n; ++i) {
      v[i] = initWeight(0, i);
    }
  }
  // The reducer's weight order is reverse registration: p1 then p0. The op is elementwise with
  // one min/max per bucket, so a flat vector in any order gives the same values.
  auto w = x, l = x, rr = x;
  const size_t bytes = minMaxCompressedBytes(n, 1);
  std::vector<std::vector<uint8_t>> c(world, std::vector<uint8_t>(bytes));
  std::vector<float> d(n), dd(n);
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) {
        x[r][i] -= toyGrad(r, t, i) + 0.0f * x[r][i];
      }
    }
    if (t % interval != 0) {
      continue;
    }
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) {
        d[i] =
            x[r][i] + l[r][i] * (1.0f / 3.0f) + rr[r][i] * (1.0f / 3.0f) - w[r][i] * (5.0f / 3.0f);
      }
      EXPECT_TRUE(minMaxCompress(d.data(), n, 1, c[r].data(), bytes).isOk());
    }
    for (int r = 0; r < world; ++r) {
      const int left = (r + world - 1) % world;
      const int right = (r + 1) % world;
      EXPECT_TRUE(minMaxDecompress(c[left].data(), bytes, n, 1, dd.data()).isOk());
      for (size_t i = 0; i < n; ++i) {
        l[r][i] += dd[i];
      }
      EXPECT_TRUE(minMaxDecompress(c[right].data(), bytes, n, 1, dd.data()).isOk());
      for (size_t i = 0; i < n; ++i) {
        rr[r][i] += dd[i];
      }
      EXPECT_TRUE(minMaxDecompress(c[r].data(), bytes, n, 1, dd.data()).isOk());
      for (size_t i = 0; i < n; ++i) {
        w[r][i] += dd[i];
        x[r][i] = w[r][i];
      }
    }
  }
  return x;
}

struct LpCase {
  int world;
  int interval;
};
class LowPrecisionTrain : public ::testing::TestWithParam<LpCase> {};

TEST_P(LowPrecisionTrain, MatchesSimulationAndKeepsReplicasExact) {
  const auto tc = GetParam();
  TrainSpec spec;
  spec.world = tc.world;
  spec.steps = 6;
  spec.grad = toyGrad;
  std::vector<std::shared_ptr<LowPrecisionDecentralized>> algos(tc.world);
  spec.algorithm = [&](int r) -> Result<std::shared_ptr<core::Algorithm>> {
    algos[r] = std::make_shared<LowPrecisionDecentralized>(false, tc.interval);
    return std::shared_ptr<core::Algorithm>(algos[r]);
  };
  std::vector<LowPrecisionDecentralized::Replicas> reps(tc.world);
  spec.after = [&](int r, int step, Toy&, core::Algorithm&) -> std::string {
    if (step == spec.steps - 1) {
      auto rep = algos[r]->replicas();
      if (!rep.isOk()) {
        return rep.status().toString();
      }
      reps[r] = *rep;
    }
    return "";
  };
  std::vector<std::vector<float>> got;
  ASSERT_EQ(train(spec, &got), "");
  // Replica invariant, bitwise: my replica == left neighbour's right copy == right
  // neighbour's left copy (Bagua's test_algorithm compares norms; we compare every element).
  for (int r = 0; r < tc.world; ++r) {
    const auto& left = reps[(r + tc.world - 1) % tc.world];
    const auto& right = reps[(r + 1) % tc.world];
    ASSERT_EQ(reps[r].self, left.right) << "rank " << r;
    ASSERT_EQ(reps[r].self, right.left) << "rank " << r;
  }
  const auto want = simulateLowPrecision(tc.world, tc.interval, spec.steps);
  for (int r = 0; r < tc.world; ++r) {
    for (size_t i = 0; i < toyNumel(); ++i) {
      ASSERT_NEAR(got[r][i], want[r][i], 1e-5 * std::max(1.0f, std::fabs(want[r][i])))
          << "rank " << r << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rings, LowPrecisionTrain,
                         ::testing::Values(LpCase{2, 1}, LpCase{3, 1}, LpCase{4, 2}, LpCase{5, 1}));

TEST(LowPrecisionTrainHierarchical, OneNodeEndsEqual) {
  TrainSpec spec;
  spec.world = 4;
  spec.hierarchicalGroup = true;
  spec.steps = 4;
  spec.grad = toyGrad;
  spec.algorithm = [](int) { return createAlgorithm("low_precision_decentralized", {}); };
  std::vector<std::vector<float>> got;
  ASSERT_EQ(train(spec, &got), "");
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
  }
}

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

TEST(QAdam, EqualsAdamDuringWarmup) {
  for (int world : {1, 2}) {
    auto store = std::make_shared<core::InMemoryStore>();
    std::vector<std::vector<float>> got(world);
    auto res = testing::runRanks(
        world,
        [&](int r) -> std::string {
          auto pg = makeGroup(store, r, world, -1, false);
          if (!pg.isOk()) {
            return pg.status().toString();
          }
          Toy toy(r);
          QAdamOptions o;
          o.warmupSteps = 2000;
          o.weightDecay = 0.1f;
          auto opt = QAdamOptimizer::create(toy.params, o);
          if (!opt.isOk()) {
            return opt.status().toString();
          }
          auto algo = createAlgorithm("qadam", {{"hierarchical", "false"}}, opt->get());
          std::vector<Parameter> buffers;
          auto ddp = core::withBagua(toy.params, buffers, {opt->get()}, *algo, **pg);
          if (!ddp.isOk()) {
            return ddp.status().toString();
          }
          for (int step = 0; step < 30; ++step) {
            Status s = (*ddp)->prepareForward();
            size_t base = 0;
            for (size_t k = 0; k < kSizes.size(); ++k) {
              for (size_t i = 0; i < kSizes[k]; ++i) {
                // Identical on every rank, so the average is exact and Adam's input known.
                toy.grad[k][i] = toyGrad(0, step, base + i);
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
              return s.toString();
            }
          }
          got[r] = toy.flat();
          return "";
        },
        60s);
    ASSERT_EQ(testing::joinFailures(res), "");
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
      EXPECT_EQ(got[r], x) << "world " << world << " rank " << r;
    }
  }
}

TEST(QAdam, CompressedStageKeepsRanksIdenticalAndFinite) {
  constexpr int kWorld = 4;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<float>> got(kWorld);
  std::vector<int64_t> steps(kWorld);
  auto res = testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, kWorld, 2, true);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        QAdamOptions o;
        o.warmupSteps = 3;
        o.lr = 0.01f;
        auto opt = QAdamOptimizer::create(toy.params, o);
        if (!opt.isOk()) {
          return opt.status().toString();
        }
        auto algo = createAlgorithm("qadam", {}, opt->get());  // hierarchical by default
        std::vector<Parameter> buffers;
        auto ddp = core::withBagua(toy.params, buffers, {opt->get()}, *algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        for (int step = 0; step < 10; ++step) {
          Status s = (*ddp)->prepareForward();
          size_t base = 0;
          for (size_t k = 0; k < kSizes.size(); ++k) {
            for (size_t i = 0; i < kSizes[k]; ++i) {
              // Element 5 never gets a gradient in warm-up: v stays 0 there (Bagua #654's NaN).
              const bool silent = base + i == 5 && step < 3;
              toy.grad[k][i] = silent ? 0.0f : toyGrad(r, step, base + i);
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
            return strPrintf("step %d: %s", step, s.toString().c_str());
          }
        }
        got[r] = toy.flat();
        steps[r] = (*opt)->stepCount();
        return "";
      },
      60s);
  ASSERT_EQ(testing::joinFailures(res), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(steps[r], 10);
    EXPECT_EQ(got[r], got[0]) << "rank " << r;
    for (float f : got[r]) {
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
            RETURN_IF_FAILED((*ddp)->prepareForward());
            size_t base = 0;
            for (size_t k = 0; k < kSizes.size(); ++k) {
              for (size_t i = 0; i < kSizes[k]; ++i) {
                toy.grad[k][i] = toyGrad(r, step, base + i);
              }
              base += kSizes[k];
            }
            for (int k = 1; k >= 0; --k) {
              RETURN_IF_FAILED((*ddp)->markGradReady(k));
            }
            RETURN_IF_FAILED((*ddp)->finishBackward());
            RETURN_IF_FAILED((*ddp)->step());
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
