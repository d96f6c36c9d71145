// The algorithms on CUDA tensors over NCCL (2 ranks as threads, one GPU each), each checked
// against the same training run on the host backend (PowerSGD: against its double-precision
// reference, powersgd_reference.h, as on the host): ByteGrad, shift_one decentralized and
// low-precision decentralized must match it bit for bit (the CUDA kernels do the CPU's float
// operations in the same order and the exchanges are point to point); all-reduce based ones
// within a stated tolerance (NCCL's reduction order and AVG are its own). Skipped, with the
// reason, without two GPUs; the lead runs it on the GPU machine. The host half (the reference
// runs) is checked everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/core/ddp.h"
#include "gpu_harness.h"
#include "multi_rank.h"
#include "nccl_ranks.h"
#include "powersgd_reference.h"

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;
using namespace gputest;
using bagua::testing::gpuCount;

// The harness itself, on the host backend (runs everywhere): the reference runs the GPU tests
// compare with are deterministic, and ByteGrad's ranks agree bit for bit.
TEST(GpuAlgorithmsHarness, HostReferenceIsDeterministic) {
  for (const char* name : {"bytegrad", "low_precision_decentralized"}) {
    auto make = [&] { return createAlgorithm(name, {{"hierarchical", "false"}}); };
    std::vector<RankResult> a, b;
    ASSERT_EQ(train(false, make, a), "") << name;
    ASSERT_EQ(train(false, make, b), "") << name;
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(compare(a[r].weights, b[r].weights, 0.0, "run 1 vs run 2"), "") << name;
      EXPECT_NE(a[r].weights[0][0], initialWeight(0, 0, 0)) << name << ": weights never moved";
    }
  }
  auto make = [] { return createAlgorithm("bytegrad", {{"hierarchical", "false"}}); };
  std::vector<RankResult> a;
  ASSERT_EQ(train(false, make, a), "");
  EXPECT_EQ(compare(a[0].grads, a[1].grads, 0.0, "rank 0 vs rank 1"), "");
  // The QAdam reference (warm-up, then the compressed stage): deterministic, rank-identical.
  QAdamOptions o;
  o.lr = 0.01f;
  o.warmupSteps = 2;
  std::vector<RankResult> q1, q2;
  ASSERT_EQ(train(false, make, q1, false, false, &o, {{"hierarchical", "false"}}), "");
  ASSERT_EQ(train(false, make, q2, false, false, &o, {{"hierarchical", "false"}}), "");
  EXPECT_EQ(compare(q1[0].weights, q2[0].weights, 0.0, "qadam run 1 vs run 2"), "");
  EXPECT_EQ(compare(q1[0].weights, q1[1].weights, 0.0, "qadam rank 0 vs rank 1"), "");
  EXPECT_NE(q1[0].weights[0][0], initialWeight(0, 0, 0)) << "qadam: weights never moved";
}

TEST(GpuAlgorithms, GradientAllReduceMatchesHost) {
  REQUIRE_TWO_GPUS();
  hostVsDevice("gradient_allreduce", {}, 1e-6);
  hostVsDevice("gradient_allreduce", {{"average", "false"}}, 1e-6);
  hostVsDevice("gradient_allreduce", {{"hierarchical", "true"}}, 1e-6, /*viewGrads=*/true);
}

TEST(GpuAlgorithms, GradientAllReduceSumThenDivideFallbackMatchesAvg) {
  REQUIRE_TWO_GPUS();
  auto fallback = [] {
    return Result<std::shared_ptr<core::Algorithm>>(std::shared_ptr<core::Algorithm>(
        std::make_shared<GradientAllReduce>(false, true, AverageMode::kSumThenDivide)));
  };
  auto native = [] {
    return Result<std::shared_ptr<core::Algorithm>>(std::shared_ptr<core::Algorithm>(
        std::make_shared<GradientAllReduce>(false, true, AverageMode::kNative)));
  };
  std::vector<RankResult> a, b;
  ASSERT_EQ(train(true, fallback, a), "");
  ASSERT_EQ(train(true, native, b), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(compare(a[r].grads, b[r].grads, 1e-6, "SUM+divide vs ncclAvg"), "");
  }
  // Every rank holds the same averaged gradients.
  EXPECT_EQ(compare(a[0].grads, a[1].grads, 0.0, "rank 0 vs rank 1"), "");
}

TEST(GpuAlgorithms, ByteGradBitIdenticalToHostAndAcrossRanks) {
  REQUIRE_TWO_GPUS();
  hostVsDevice("bytegrad", {{"hierarchical", "false"}}, 0.0);
  hostVsDevice("bytegrad", {{"hierarchical", "false"}, {"average", "false"}}, 0.0,
               /*viewGrads=*/true);
  std::vector<RankResult> dev;
  auto make = [] { return createAlgorithm("bytegrad", {{"hierarchical", "false"}}); };
  ASSERT_EQ(train(true, make, dev), "");
  EXPECT_EQ(compare(dev[0].grads, dev[1].grads, 0.0, "rank 0 vs rank 1"), "");
}

TEST(GpuAlgorithms, ByteGradHierarchicalOnOneNodeMatchesHost) {
  REQUIRE_TWO_GPUS();
  // One node of 2 ranks: intra-node reduce (NCCL's own AVG), the exchange among 1 leader,
  // broadcast. For 2 ranks the average is exact on both sides; should NCCL's differ by an ulp,
  // a value could move by one quantisation step (range / 255), hence the loose bound.
  hostVsDevice("bytegrad", {}, 1e-2);
}

TEST(GpuAlgorithms, DecentralizedMatchesHost) {
  REQUIRE_TWO_GPUS();
  hostVsDevice("decentralized", {{"hierarchical", "false"}}, 1e-6);
  hostVsDevice("decentralized", {{"hierarchical", "false"}, {"peer_selection_mode", "shift_one"}},
               0.0);
  hostVsDevice("decentralized", {{"hierarchical", "false"}, {"communication_interval", "2"}}, 1e-6);
}

TEST(GpuAlgorithms, LowPrecisionDecentralizedBitIdenticalToHostWithReplicaInvariant) {
  REQUIRE_TWO_GPUS();
  auto make = [] {
    return createAlgorithm("low_precision_decentralized", {{"hierarchical", "false"}});
  };
  std::vector<RankResult> host, dev;
  ASSERT_EQ(train(false, make, host), "");
  ASSERT_EQ(train(true, make, dev), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(compare(dev[r].weights, host[r].weights, 0.0, "weights (device vs host)"), "");
    ASSERT_FALSE(dev[r].replicaSelf.empty());
    EXPECT_EQ(compare({dev[r].replicaSelf}, {host[r].replicaSelf}, 0.0, "replica"), "");
  }
  // Ring of 2: my replica is bitwise my neighbour's copy of it (left and right are the same
  // rank).
  EXPECT_EQ(compare({dev[0].replicaSelf}, {dev[1].replicaLeft}, 0.0, "w0 vs l1"), "");
  EXPECT_EQ(compare({dev[0].replicaSelf}, {dev[1].replicaRight}, 0.0, "w0 vs r1"), "");
  EXPECT_EQ(compare({dev[1].replicaSelf}, {dev[0].replicaLeft}, 0.0, "w1 vs l0"), "");
}

// ---- PowerSGD -----------------------------------------------------------------------------------

// powersgd_reference.h's model trained on CUDA tensors over NCCL (device) or on the host backend.
std::string runPowerSgd(bool device, const PowerSgdOptions& o, int steps,
                        std::vector<psgdtest::RankRun>& runs) {
  auto store = std::make_shared<core::InMemoryStore>();
  runs.assign(kWorld, {});
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = bagua::testing::rankGroup(store, r, kWorld, device);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        std::vector<void*> mem;
        DeviceFreeAll freeGuard{mem};  // after the reducer inside runRank is gone
        psgdtest::Memory m;
        core::Device dev;
        if (device) {
          cudaSetDevice(r);
          dev = {core::DeviceType::kCuda, r};
          m.alloc = [&mem](size_t bytes) {
            void* p = nullptr;
            if (cudaMalloc(&p, bytes) != cudaSuccess) {
              return static_cast<void*>(nullptr);
            }
            cudaMemset(p, 0, bytes);
            mem.push_back(p);
            return p;
          };
          m.toDevice = [](void* d, const void* h, size_t b) {
            cudaMemcpy(d, h, b, cudaMemcpyHostToDevice);
          };
          m.toHost = [](void* h, const void* d, size_t b) {
            cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost);
          };
        }
        return psgdtest::runRank(**pg, r, steps, std::make_shared<PowerSgd>(o), m, dev, runs[r]);
      },
      120000ms);
  return bagua::testing::joinFailures(res);
}

// Every step against the double-precision reference (the device kernels accumulate in float,
// in tree order: 2e-4 of each tensor's scale), ranks bitwise equal, and within the same bound of
// the host backend's run; the cases cover ranks 1-3, error feedback off (with the zero-gradient
// redraw), no warm start and a positive epsilon.
TEST(GpuAlgorithms, PowerSgdMatchesDoublePrecisionReference) {
  REQUIRE_TWO_GPUS();
  constexpr int kPsgdSteps = 5;
  struct Case {
    const char* label;
    int rank;
    bool errorFeedback;
    bool warmStart;
    int64_t startIter;
    float eps;
  };
  for (const Case& c :
       {Case{"r1", 1, true, true, 0, 0.0f}, Case{"r2_start1", 2, true, true, 1, 0.0f},
        Case{"r1_noef", 1, false, true, 0, 0.0f}, Case{"r2_nowarm", 2, true, false, 1, 0.0f},
        Case{"r3_eps", 3, true, true, 0, 1e-3f}}) {
    PowerSgdOptions o;
    o.rank = c.rank;
    o.errorFeedback = c.errorFeedback;
    o.warmStart = c.warmStart;
    o.startIter = c.startIter;
    o.orthogonalizationEpsilon = c.eps;
    o.seed = 4321;
    std::vector<psgdtest::RankRun> dev, host;
    ASSERT_EQ(runPowerSgd(true, o, kPsgdSteps, dev), "") << c.label;
    ASSERT_EQ(runPowerSgd(false, o, kPsgdSteps, host), "") << c.label;
    double worst = 0.0;
    EXPECT_EQ(psgdtest::checkReference(dev, o, kPsgdSteps, 2e-4, &worst), "") << c.label;
    for (int step = 0; step < kPsgdSteps; ++step) {
      for (size_t t = 0; t < psgdtest::model().size(); ++t) {
        const auto& h = host[0].grads[step][t];
        const psgdtest::Diff d =
            psgdtest::diff(dev[0].grads[step][t], std::vector<double>(h.begin(), h.end()));
        EXPECT_LE(d.maxAbs, 2e-4 * std::max(d.scale, 1e-3))
            << c.label << " step " << step << " " << psgdtest::model()[t].name
            << ": device vs host";
      }
    }
  }
}

// Quantised factors on the device: ranks bitwise equal, the first compressed step exact, later
// ones within 5% of the exact step from the run's own state, error + applied gradient = M.
TEST(GpuAlgorithms, PowerSgdQuantizedFactorsWithinBound) {
  REQUIRE_TWO_GPUS();
  PowerSgdOptions o;
  o.rank = 2;
  o.startIter = 1;
  o.quantizeFactors = true;
  std::vector<psgdtest::RankRun> dev;
  ASSERT_EQ(runPowerSgd(true, o, 5, dev), "");
  double worst = 0.0;
  EXPECT_EQ(psgdtest::checkQuantized(dev, o, 5, 2e-4, 0.05, &worst), "");
  EXPECT_GT(worst, 1e-4) << "worst relative error of P Q^T " << worst;
}

}  // namespace
}  // namespace bagua::algo
