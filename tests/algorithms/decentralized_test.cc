// The decentralized algorithms on the host backend, ranks as threads over loopback: decentralized
// SGD against a double-precision simulation (all, shift_one, intervals, one node with
// hierarchical=true: Bagua #380, no_sync micro-batches), the shift_one schedule and its error on
// odd worlds; low-precision decentralized against a simulation and its exact replica invariant.
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
            // Overwritten, not accumulated: the step uses the last micro-batch's gradient.
            RETURN_IF_FAILED(toyBackward(
                d, toy, [&](size_t i) { return micro == 0 ? 1e3f : toyGrad(r, step, i); }));
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

}  // namespace
}  // namespace bagua::algo
