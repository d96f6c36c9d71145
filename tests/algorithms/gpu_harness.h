// The harness of the algorithms' GPU tests: kSteps of training on kWorld ranks (threads) with
// rank-, step- and index-dependent weights and gradients, on CUDA tensors over NCCL or on the
// host backend with host tensors, and the comparison of the two runs (bitwise, or within a
// relative bound). Header only, for gpu_algorithms_test.cc and gpu_qadam_async_test.cc.
//
// Thread safety: train() runs the ranks on threads of its own; call it from the test's thread.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/core/ddp.h"
#include "multi_rank.h"
#include "nccl_ranks.h"

namespace bagua::algo::gputest {

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
inline const std::vector<size_t> kSizes = {1000003, 257, 31, 4099};
constexpr int kSteps = 3;
constexpr float kLr = 0.1f;

inline float initialWeight(int rank, size_t tensor, size_t i) {
  return static_cast<float>((i * 31 + tensor * 7 + static_cast<size_t>(rank) * 3) % 101) * 0.01f -
         0.5f;
}
inline float gradient(int rank, int step, size_t tensor, size_t i) {
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
inline bool revivesLate(size_t i) {
  return i % 13 == 5;
}

inline std::string train(bool device,
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
        // Sub-groups (more NCCL communicators) only if needed.
        auto pg = bagua::testing::rankGroup(store, r, kWorld, device, hierarchicalGroup);
        if (!pg.isOk()) {
          return pg.status().toString();
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
      std::chrono::milliseconds(180000));
  return bagua::testing::joinFailures(res);
}

// Bitwise equality, or |a-b| <= tol * (1 + |b|).
inline std::string compare(const std::vector<std::vector<float>>& a,
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
    if (bagua::testing::gpuCount() < kWorld) {                                     \
      GTEST_SKIP() << "needs 2 CUDA devices (found " << bagua::testing::gpuCount() \
                   << "): the algorithms' NCCL path runs on the GPU machine only"; \
    }                                                                              \
  } while (0)

// Runs `name` with `args` on the host and on the GPUs and compares weights and gradients.
inline void hostVsDevice(const std::string& name, const AlgorithmArgs& args, double tol,
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

}  // namespace bagua::algo::gputest
