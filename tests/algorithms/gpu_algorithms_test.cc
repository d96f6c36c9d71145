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
#include "multi_rank.h"
#include "powersgd_reference.h"

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;

// Frees every device allocation listed in `m` when the scope ends (the tests' buffers).
struct DeviceFreeAll {
  std::vector<void*>& m;
  ~DeviceFreeAll() {
    for (void* p : m) {
      cudaFree(p);
    }
  }
};

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
// qadam: train with a QAdamOptimizer of these options and the `qadam` algorithm built with
// qadamArgs (make is then unused). reviveLate (qadam only): every 13th element (i % 13 == 5)
// starts at 0 and gets a zero gradient up to iteration warmupSteps, so its v is exactly 0, and a
// gradient afterwards (QAdam's zero-variance case).
bool revivesLate(size_t i) {
  return i % 13 == 5;
}

std::string train(bool device,
                  const std::function<Result<std::shared_ptr<core::Algorithm>>()>& make,
                  std::vector<RankResult>& results, bool viewGrads = false,
                  bool hierarchicalGroup = false, const QAdamOptions* qadam = nullptr,
                  const AlgorithmArgs& qadamArgs = {}, bool reviveLate = false) {
  reviveLate = reviveLate && qadam != nullptr;
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
            hostData[t][i] = reviveLate && revivesLate(i) ? 0.0f : initialWeight(r, t, i);
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
        DeviceFreeAll freeGuard{deviceMem};
        CopySgd opt(params, device);
        core::Optimizer* stepping = &opt;
        std::unique_ptr<QAdamOptimizer> qadamOpt;
        if (qadam != nullptr) {
          auto q = QAdamOptimizer::create(params, *qadam);
          if (!q.isOk()) {
            return q.status().toString();
          }
          qadamOpt = std::move(*q);
          stepping = qadamOpt.get();
        }
        auto algorithm =
            qadam != nullptr ? createAlgorithm("qadam", qadamArgs, qadamOpt.get()) : make();
        if (!algorithm.isOk()) {
          return algorithm.status().toString();
        }
        core::DdpOptions dopt;
        dopt.bucketCapMb = 1.0;  // several buckets
        dopt.firstBucketBytes = 4096;
        dopt.gradientAsBucketView = viewGrads;
        std::vector<core::Parameter> buffers;
        auto ddp = core::withBagua(params, buffers, {stepping}, *algorithm, **pg, dopt);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        for (int step = 1; step <= kSteps; ++step) {
          Status s = (*ddp)->prepareForward();
          for (int t = static_cast<int>(kSizes.size()) - 1; s.isOk() && t >= 0; --t) {
            std::vector<float> g(kSizes[t]);
            for (size_t i = 0; i < g.size(); ++i) {
              const bool silent = reviveLate && revivesLate(i) && step <= qadam->warmupSteps;
              g[i] = silent ? 0.0f : gradient(r, step, static_cast<size_t>(t), i);
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

// QAdamOptimizer on CUDA parameters against the same optimizer on host copies: identical
// inputs, so weights, m and v must agree bit for bit (the kernel does the host loop's float
// operations in the same order, -fmad=false, IEEE sqrt and division), through the warm-up and
// the frozen-variance stage, with weight decay, for holdZeroVariance on and off. Every 13th
// element starts at 0 with a zero gradient through the warm-up (so v = 0 exactly there, weight
// decay included), and gets a non-zero m written after it (what the compressed momentum of an
// element first touched after warm-up looks like): on, both sides hold it at 0; off, both take
// Bagua's m / eps step. Needs one GPU.
bool zeroVariance(size_t i) {
  return i % 13 == 5;
}

TEST(GpuAlgorithms, QAdamOptimizerStepBitIdenticalToHost) {
  if (gpuCount() < 1) {
    GTEST_SKIP() << "needs a CUDA device (found none): runs on the GPU machine";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (bool hold : {true, false}) {
    SCOPED_TRACE(hold ? "holdZeroVariance on" : "holdZeroVariance off");
    QAdamOptions o;
    o.lr = 0.01f;
    o.warmupSteps = 4;  // steps 1-3 Adam, 4-7 the frozen-variance stage
    o.weightDecay = 0.01f;
    o.holdZeroVariance = hold;
    std::vector<core::Parameter> host(kSizes.size()), dev(kSizes.size());
    std::vector<std::vector<float>> hw(kSizes.size()), hg(kSizes.size());
    std::vector<void*> mem;
    DeviceFreeAll freeGuard{mem};
    for (size_t t = 0; t < kSizes.size(); ++t) {
      const size_t n = kSizes[t];
      hw[t].resize(n);
      hg[t].assign(n, 0.0f);
      for (size_t i = 0; i < n; ++i) {
        hw[t][i] = zeroVariance(i) ? 0.0f : initialWeight(1, t, i);
      }
      host[t].name = dev[t].name = "p" + std::to_string(t);
      host[t].numel = dev[t].numel = n;
      host[t].data = hw[t].data();
      host[t].grad = hg[t].data();
      void* d = nullptr;
      void* g = nullptr;
      ASSERT_EQ(cudaMalloc(&d, n * 4), cudaSuccess);
      mem.push_back(d);
      ASSERT_EQ(cudaMalloc(&g, n * 4), cudaSuccess);
      mem.push_back(g);
      ASSERT_EQ(cudaMemcpy(d, hw[t].data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      dev[t].data = d;
      dev[t].grad = g;
      dev[t].device = {core::DeviceType::kCuda, 0};
    }
    auto qh = QAdamOptimizer::create(host, o);
    auto qd = QAdamOptimizer::create(dev, o);
    ASSERT_TRUE(qh.isOk()) << qh.status().toString();
    ASSERT_TRUE(qd.isOk()) << qd.status().toString();
    for (int step = 1; step <= 7; ++step) {
      const bool warm = step < o.warmupSteps;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        for (size_t i = 0; i < kSizes[t]; ++i) {
          hg[t][i] = warm && zeroVariance(i) ? 0.0f : gradient(static_cast<int>(t % 2), step, t, i);
        }
        ASSERT_EQ(cudaMemcpy(dev[t].grad, hg[t].data(), kSizes[t] * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      if (step == o.warmupSteps) {
        // The compressed momentum of the zero-variance elements: non-zero, same on both sides.
        for (size_t t = 0; t < kSizes.size(); ++t) {
          std::vector<float> m(kSizes[t]);
          ASSERT_TRUE((*qh)->readState(static_cast<int>(t), false, m.data()).isOk());
          for (size_t i = 0; i < m.size(); ++i) {
            if (zeroVariance(i)) {
              m[i] = 0.001f * static_cast<float>(i % 7 + 1) * (i % 2 == 0 ? 1.0f : -1.0f);
            }
          }
          ASSERT_TRUE((*qh)->writeState(static_cast<int>(t), false, m.data()).isOk());
          ASSERT_TRUE((*qd)->writeState(static_cast<int>(t), false, m.data()).isOk());
        }
      }
      ASSERT_TRUE((*qh)->step().isOk());
      const Status s = (*qd)->step();
      ASSERT_TRUE(s.isOk()) << s.toString();
      for (size_t t = 0; t < kSizes.size(); ++t) {
        const size_t n = kSizes[t];
        std::vector<float> w(n), m(n), v(n), mh(n), vh(n);
        ASSERT_EQ(cudaMemcpy(w.data(), dev[t].data, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_TRUE((*qd)->readState(static_cast<int>(t), false, m.data()).isOk());
        ASSERT_TRUE((*qd)->readState(static_cast<int>(t), true, v.data()).isOk());
        ASSERT_TRUE((*qh)->readState(static_cast<int>(t), false, mh.data()).isOk());
        ASSERT_TRUE((*qh)->readState(static_cast<int>(t), true, vh.data()).isOk());
        ASSERT_EQ(compare({w}, {hw[t]}, 0.0, "weights"), "") << "step " << step << " tensor " << t;
        ASSERT_EQ(compare({m}, {mh}, 0.0, "exp_avg"), "") << "step " << step << " tensor " << t;
        ASSERT_EQ(compare({v}, {vh}, 0.0, "exp_avg_sq"), "") << "step " << step << " tensor " << t;
        EXPECT_NE(w[n / 2], initialWeight(1, t, n / 2)) << "weights never moved";
        // Element 5 of every tensor: v = 0 exactly; held at 0 (on) or moved by m / eps (off)
        // once its momentum is non-zero.
        EXPECT_EQ(vh[5], 0.0f) << "tensor " << t;
        if (step >= o.warmupSteps) {
          if (hold) {
            EXPECT_EQ(hw[t][5], 0.0f) << "held element moved, step " << step << " tensor " << t;
          } else {
            EXPECT_GT(std::fabs(hw[t][5]), 1e3f) << "step " << step << " tensor " << t;
          }
        }
      }
    }
    if (!hold) {
      continue;
    }
    // State round trip through host memory, and zeroGrad on the device.
    std::vector<float> m(kSizes[1]);
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = static_cast<float>(i) * 0.5f;
    }
    ASSERT_TRUE((*qd)->writeState(1, false, m.data()).isOk());
    std::vector<float> back(kSizes[1]);
    ASSERT_TRUE((*qd)->readState(1, false, back.data()).isOk());
    EXPECT_EQ(back, m);
    EXPECT_FALSE((*qd)->readState(99, false, back.data()).isOk());
    (*qd)->zeroGrad();
    std::vector<float> g(kSizes[0], 1.0f);
    ASSERT_EQ(cudaMemcpy(g.data(), dev[0].grad, g.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(g, std::vector<float>(kSizes[0], 0.0f));
    // State tensors point at device memory and say so (the reducer broadcasts them over NCCL).
    for (const core::Parameter& p : (*qd)->stateTensors()) {
      EXPECT_EQ(p.device.type, core::DeviceType::kCuda) << p.name;
    }
  }
}

// QAdam over NCCL on CUDA tensors against the host run: two warm-up iterations (full-precision
// average), then the compressed-momentum stage. The compression stage is bit-identical (ByteGrad
// kernels, momentum kernel); the warm-up average is NCCL's own reduction (for two ranks (a+b)/2,
// one rounding on both sides), so the bound allows one ulp's worth. Every rank ends with
// bitwise identical weights.
TEST(GpuAlgorithms, QAdamMatchesHost) {
  REQUIRE_TWO_GPUS();
  QAdamOptions o;
  o.lr = 0.01f;
  o.warmupSteps = 2;  // kSteps = 3: iterations 1-2 warm-up, 3 compressed
  o.weightDecay = 0.01f;
  const AlgorithmArgs args = {{"hierarchical", "false"}};
  auto unused = [] { return createAlgorithm("qadam", {}); };
  std::vector<RankResult> host, dev;
  ASSERT_EQ(train(false, unused, host, false, false, &o, args), "");
  ASSERT_EQ(train(true, unused, dev, false, false, &o, args), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(compare(dev[r].weights, host[r].weights, 1e-6, "weights (device vs host)"), "")
        << "rank " << r;
  }
  EXPECT_EQ(compare(dev[0].weights, dev[1].weights, 0.0, "rank 0 vs rank 1"), "");
  EXPECT_EQ(compare(host[0].weights, host[1].weights, 0.0, "host rank 0 vs rank 1"), "");
  // Zero variance through the reducer: every 13th element has v = 0 exactly and gets its first
  // gradient in the compressed iteration. holdZeroVariance on: held at 0 on both sides; off:
  // Bagua's m / eps step, and device and host still agree.
  for (bool hold : {true, false}) {
    SCOPED_TRACE(hold ? "holdZeroVariance on" : "holdZeroVariance off");
    QAdamOptions oz = o;
    oz.holdZeroVariance = hold;
    std::vector<RankResult> hz, dz;
    ASSERT_EQ(train(false, unused, hz, false, false, &oz, args, true), "");
    ASSERT_EQ(train(true, unused, dz, false, false, &oz, args, true), "");
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(compare(dz[r].weights, hz[r].weights, 1e-6, "weights (device vs host)"), "")
          << "rank " << r;
    }
    EXPECT_EQ(compare(dz[0].weights, dz[1].weights, 0.0, "rank 0 vs rank 1"), "");
    for (const auto* run : {&hz, &dz}) {
      size_t count = 0;
      size_t moved = 0;
      float largest = 0.0f;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        for (size_t i = 5; i < kSizes[t]; i += 13) {
          const float w = (*run)[0].weights[t][i];
          ++count;
          moved += w != 0.0f ? 1 : 0;
          largest = std::max(largest, std::fabs(w));
          if (hold) {
            ASSERT_EQ(w, 0.0f) << "held element moved: tensor " << t << " element " << i;
          }
        }
      }
      if (!hold) {
        // m / eps: ~0.05 * m * 1e8 (a momentum quantised to exactly 0 leaves an element put).
        EXPECT_GT(largest, 1e3f);
        EXPECT_GT(moved, count / 2) << "of " << count;
      }
    }
  }
}

// Async model average on CUDA tensors over NCCL (Bagua's test_async_model_average on GPUs): each
// rank shifts its weights by r + 1 once, gradients stay zero, so after background rounds both
// hold w0 + 1.5; abort() stops both ranks in the same round; resume/abort/resume works; the
// reducer goes away without a final abort() promptly.
TEST(GpuAlgorithms, AsyncAveragesDeviceWeightsAndShutsDownCleanly) {
  REQUIRE_TWO_GPUS();
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<std::vector<float>>> got(kWorld);
  std::vector<int64_t> rounds(kWorld);
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        core::ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = kWorld;
        o.backend = core::Backend::kNccl;
        o.cudaDevice = r;
        o.rendezvousTimeout = 60000ms;
        o.collectiveTimeout = 60000ms;
        auto pg = core::ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        cudaSetDevice(r);
        std::vector<core::Parameter> params(kSizes.size());
        std::vector<void*> mem;
        DeviceFreeAll freeGuard{mem};
        for (size_t t = 0; t < kSizes.size(); ++t) {
          const size_t n = kSizes[t];
          std::vector<float> w(n);
          for (size_t i = 0; i < n; ++i) {
            w[i] = initialWeight(r, t, i);
          }
          void* d = nullptr;
          void* g = nullptr;
          if (cudaMalloc(&d, n * 4) != cudaSuccess || cudaMalloc(&g, n * 4) != cudaSuccess) {
            return "cudaMalloc failed";
          }
          mem.push_back(d);
          mem.push_back(g);
          cudaMemcpy(d, w.data(), n * 4, cudaMemcpyHostToDevice);
          cudaMemset(g, 0, n * 4);
          params[t].name = "layer" + std::to_string(t) + ".weight";
          params[t].numel = n;
          params[t].data = d;
          params[t].grad = g;
          params[t].device = {core::DeviceType::kCuda, r};
        }
        CopySgd opt(params, true);
        auto algo = std::make_shared<AsyncModelAverage>(5, 0);
        std::vector<core::Parameter> buffers;
        auto ddp = core::withBagua(params, buffers, {&opt}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        auto iterate = [&](bool perturb) -> Status {
          BAGUA_RETURN_IF_ERROR((*ddp)->prepareForward());
          if (perturb) {  // under the weight lock, as a forward/backward would change them
            for (size_t t = 0; t < kSizes.size(); ++t) {
              std::vector<float> w(kSizes[t]);
              opt.copyOut(w.data(), params[t].data, w.size());
              for (float& f : w) {
                f += static_cast<float>(r + 1);
              }
              opt.copyIn(params[t].data, w.data(), w.size());
            }
          }
          for (int t = static_cast<int>(kSizes.size()) - 1; t >= 0; --t) {
            BAGUA_RETURN_IF_ERROR((*ddp)->markGradReady(t));  // gradients stay zero
          }
          BAGUA_RETURN_IF_ERROR((*ddp)->finishBackward());
          return (*ddp)->step();
        };
        auto fail = [](const char* what, const Status& s) {
          return std::string(what) + ": " + s.toString();
        };
        Status s = iterate(true);
        if (!s.isOk()) {
          return fail("first iteration", s);
        }
        const int64_t start = algo->rounds();
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (algo->rounds() < start + 3) {
          if (std::chrono::steady_clock::now() > deadline) {
            return "no averaging rounds within 30 s";
          }
          s = iterate(false);
          if (!s.isOk()) {
            return fail("iteration", s);
          }
          std::this_thread::sleep_for(2ms);
        }
        s = algo->abort();
        if (s.isOk()) {
          s = algo->abort();  // repeated abort: no-op
        }
        if (!s.isOk()) {
          return fail("abort", s);
        }
        rounds[r] = algo->rounds();
        for (size_t t = 0; t < kSizes.size(); ++t) {
          got[r].emplace_back(kSizes[t]);
          opt.copyOut(got[r].back().data(), params[t].data, kSizes[t]);
        }
        s = algo->resume();
        for (int i = 0; s.isOk() && i < 5; ++i) {
          s = iterate(false);
        }
        if (s.isOk()) {
          s = algo->abort();
        }
        if (s.isOk()) {
          s = algo->resume();
        }
        if (s.isOk()) {
          s = iterate(false);
        }
        if (!s.isOk()) {
          return fail("resume/abort sequence", s);
        }
        const auto t0 = std::chrono::steady_clock::now();
        ddp->reset();
        if (std::chrono::steady_clock::now() - t0 > 10s) {
          return "shutdown without abort() took more than 10 s";
        }
        return "";
      },
      120000ms);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_EQ(rounds[1], rounds[0]);
  for (int r = 0; r < kWorld; ++r) {
    for (size_t t = 0; t < kSizes.size(); ++t) {
      for (size_t i = 0; i < kSizes[t]; ++i) {
        ASSERT_NEAR(got[r][t][i], initialWeight(0, t, i) + 1.5f, 1e-4)
            << "rank " << r << " tensor " << t << " element " << i;
      }
    }
  }
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
        core::ProcessGroupOptions po;
        po.rank = r;
        po.worldSize = kWorld;
        po.backend = device ? core::Backend::kNccl : core::Backend::kHost;
        po.hierarchical = false;
        po.cudaDevice = device ? r : -1;
        po.rendezvousTimeout = 60000ms;
        po.collectiveTimeout = 60000ms;
        auto pg = core::ProcessGroup::create(store, po);
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
