// The algorithms on CUDA tensors over NCCL (2 ranks as threads, one GPU each), each checked
// against the same training run on the host backend: ByteGrad, shift_one decentralized and
// low-precision decentralized must match it bit for bit (the CUDA kernels do the CPU's float
// operations in the same order and the exchanges are point to point); all-reduce based ones
// within a stated tolerance (NCCL's reduction order and AVG are its own). Skipped, with the
// reason, without two GPUs; the lead runs it on the GPU machine. The host half (the reference
// runs) is checked everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/core/ddp.h"
#include "multi_rank.h"

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 2;
// Sizes that exercise padding (not multiples of the world size or of 32) and several buckets.
const std::vector<size_t> kSizes = {1000003, 257, 31, 4099};
constexpr int kSteps = 3;
constexpr float kLr = 0.1f;

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

float initialWeight(int rank, size_t tensor, size_t i) {
  return static_cast<float>((i * 31 + tensor * 7 + static_cast<size_t>(rank) * 3) % 101) * 0.01f -
         0.5f;
}
float gradient(int rank, int step, size_t tensor, size_t i) {
  // Rank-, step-, tensor- and index-dependent, with a few large values so chunks differ in range.
  const float base = std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(tensor)) *
                     (1.0f + static_cast<float>(rank)) * 0.1f;
  return (i % 997 == 0) ? base * 50.0f + static_cast<float>(step) : base + 0.01f * step;
}

// Plain SGD that reads and writes through host copies, so host and device runs do identical
// float math (w -= lr * g).
class CopySgd final : public core::Optimizer {
 public:
  CopySgd(std::vector<core::Parameter>& params, bool device) : params_(params), device_(device) {}
  Status step() override {
    for (core::Parameter& p : params_) {
      std::vector<float> w(p.numel), g(p.numel);
      copyOut(w.data(), p.data, p.numel);
      copyOut(g.data(), p.grad, p.numel);
      for (size_t i = 0; i < p.numel; ++i) {
        w[i] -= kLr * g[i];
      }
      copyIn(p.data, w.data(), p.numel);
    }
    return Status::ok();
  }
  void zeroGrad() override {}

  void copyOut(float* host, const void* src, size_t n) const {
    if (device_) {
      cudaMemcpy(host, src, n * 4, cudaMemcpyDeviceToHost);
    } else {
      std::memcpy(host, src, n * 4);
    }
  }
  void copyIn(void* dst, const float* host, size_t n) const {
    if (device_) {
      cudaMemcpy(dst, host, n * 4, cudaMemcpyHostToDevice);
    } else {
      std::memcpy(dst, host, n * 4);
    }
  }

 private:
  std::vector<core::Parameter>& params_;
  bool device_;
};

struct RankResult {
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> grads;
  std::vector<float> replicaSelf;
  std::vector<float> replicaLeft;
  std::vector<float> replicaRight;
};

// Trains kSteps on `kWorld` ranks; device: NCCL + CUDA tensors, else host backend + host tensors.
// Returns per-rank failure texts; fills results.
std::string train(bool device,
                  const std::function<Result<std::shared_ptr<core::Algorithm>>()>& make,
                  std::vector<RankResult>& results, bool viewGrads = false,
                  bool hierarchicalGroup = false) {
  auto store = std::make_shared<core::InMemoryStore>();
  results.assign(kWorld, {});
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        core::ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = kWorld;
        o.backend = device ? core::Backend::kNccl : core::Backend::kHost;
        o.hierarchical = hierarchicalGroup;  // sub-groups (more NCCL communicators) only if needed
        o.cudaDevice = device ? r : -1;
        o.rendezvousTimeout = 60000ms;
        o.collectiveTimeout = 60000ms;
        auto pg = core::ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        if (device) {
          cudaSetDevice(r);
        }
        std::vector<core::Parameter> params(kSizes.size());
        std::vector<std::vector<float>> hostData(kSizes.size()), hostGrad(kSizes.size());
        std::vector<void*> deviceMem;
        for (size_t t = 0; t < kSizes.size(); ++t) {
          const size_t n = kSizes[t];
          hostData[t].resize(n);
          hostGrad[t].assign(n, 0.0f);
          for (size_t i = 0; i < n; ++i) {
            hostData[t][i] = initialWeight(r, t, i);
          }
          core::Parameter& p = params[t];
          p.name = "layer" + std::to_string(t) + ".weight";
          p.numel = n;
          if (device) {
            void* d = nullptr;
            void* g = nullptr;
            if (cudaMalloc(&d, n * 4) != cudaSuccess || cudaMalloc(&g, n * 4) != cudaSuccess) {
              return "cudaMalloc failed";
            }
            deviceMem.push_back(d);
            deviceMem.push_back(g);
            cudaMemcpy(d, hostData[t].data(), n * 4, cudaMemcpyHostToDevice);
            cudaMemset(g, 0, n * 4);
            p.data = d;
            p.grad = g;
            p.device = {core::DeviceType::kCuda, r};
          } else {
            p.data = hostData[t].data();
            p.grad = hostGrad[t].data();
          }
          p.setGrad = [&params, t](void* ng) { params[t].grad = ng; };
        }
        struct Free {
          std::vector<void*>& m;
          ~Free() {
            for (void* p : m) {
              cudaFree(p);
            }
          }
        } freeGuard{deviceMem};
        CopySgd opt(params, device);
        auto algorithm = make();
        if (!algorithm.isOk()) {
          return algorithm.status().toString();
        }
        core::DdpOptions dopt;
        dopt.bucketCapMb = 1.0;  // several buckets
        dopt.firstBucketBytes = 4096;
        dopt.gradientAsBucketView = viewGrads;
        std::vector<core::Parameter> buffers;
        auto ddp = core::withBagua(params, buffers, {&opt}, *algorithm, **pg, dopt);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        for (int step = 1; step <= kSteps; ++step) {
          Status s = (*ddp)->prepareForward();
          for (int t = static_cast<int>(kSizes.size()) - 1; s.isOk() && t >= 0; --t) {
            std::vector<float> g(kSizes[t]);
            for (size_t i = 0; i < g.size(); ++i) {
              g[i] = gradient(r, step, static_cast<size_t>(t), i);
            }
            opt.copyIn(params[t].grad, g.data(), g.size());
            s = (*ddp)->markGradReady(t);
          }
          if (s.isOk()) {
            s = (*ddp)->finishBackward();
          }
          if (s.isOk()) {
            s = (*ddp)->step();
          }
          if (!s.isOk()) {
            return "step " + std::to_string(step) + ": " + s.toString();
          }
        }
        RankResult& out = results[r];
        for (size_t t = 0; t < kSizes.size(); ++t) {
          out.weights.emplace_back(kSizes[t]);
          out.grads.emplace_back(kSizes[t]);
          opt.copyOut(out.weights.back().data(), params[t].data, kSizes[t]);
          opt.copyOut(out.grads.back().data(), params[t].grad, kSizes[t]);
        }
        if (auto* lp = dynamic_cast<LowPrecisionDecentralized*>(algorithm->get())) {
          auto rep = lp->replicas();
          if (!rep.isOk()) {
            return rep.status().toString();
          }
          out.replicaSelf = rep->self;
          out.replicaLeft = rep->left;
          out.replicaRight = rep->right;
        }
        return "";
      },
      180000ms);
  return bagua::testing::joinFailures(res);
}

// Bitwise equality, or |a-b| <= tol * (1 + |b|).
std::string compare(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b, double tol, const char* what) {
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].size(); ++i) {
      const float x = a[t][i];
      const float y = b[t][i];
      const bool ok = tol == 0.0
                          ? std::memcmp(&x, &y, 4) == 0
                          : std::fabs(static_cast<double>(x) - y) <= tol * (1.0 + std::fabs(y));
      if (!ok) {
        return std::string(what) + ": tensor " + std::to_string(t) + " element " +
               std::to_string(i) + ": " + std::to_string(x) + " vs " + std::to_string(y);
      }
    }
  }
  return "";
}

#define REQUIRE_TWO_GPUS()                                                         \
  do {                                                                             \
    if (gpuCount() < kWorld) {                                                     \
      GTEST_SKIP() << "needs 2 CUDA devices (found " << gpuCount()                 \
                   << "): the algorithms' NCCL path runs on the GPU machine only"; \
    }                                                                              \
  } while (0)

// Runs `name` with `args` on the host and on the GPUs and compares weights and gradients.
void hostVsDevice(const std::string& name, const AlgorithmArgs& args, double tol,
                  bool viewGrads = false) {
  auto make = [&]() { return createAlgorithm(name, args); };
  auto it = args.find("hierarchical");
  const bool hier = it == args.end() ? name != "gradient_allreduce" : it->second == "true";
  std::vector<RankResult> host, dev;
  ASSERT_EQ(train(false, make, host, false, hier), "");
  ASSERT_EQ(train(true, make, dev, viewGrads, hier), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(compare(dev[r].weights, host[r].weights, tol, "weights (device vs host)"), "")
        << name << " rank " << r;
    EXPECT_EQ(compare(dev[r].grads, host[r].grads, tol, "gradients (device vs host)"), "")
        << name << " rank " << r;
  }
}

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

TEST(GpuAlgorithms, QAdamAndAsyncRefuseDeviceTensorsByName) {
  REQUIRE_TWO_GPUS();
  for (const std::string name : {"async"}) {
    auto make = [&] { return createAlgorithm(name, {}); };
    std::vector<RankResult> dev;
    const std::string err = train(true, make, dev);
    EXPECT_NE(err.find(name), std::string::npos) << err;
    EXPECT_NE(err.find("cuda"), std::string::npos) << err;
  }
  // QAdam's optimizer refuses device parameters at creation.
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  std::vector<core::Parameter> params(1);
  params[0].name = "w";
  params[0].data = d;
  params[0].grad = d;
  params[0].numel = 16;
  params[0].device = {core::DeviceType::kCuda, 0};
  auto q = QAdamOptimizer::create(params);
  cudaFree(d);
  ASSERT_FALSE(q.isOk());
  EXPECT_NE(q.status().toString().find("qadam"), std::string::npos);
  EXPECT_NE(q.status().toString().find("cuda"), std::string::npos);
}

}  // namespace
}  // namespace bagua::algo
