// QAdam and async model averaging on CUDA tensors (gpu_harness.h): QAdam's optimizer step bit for
// bit against the host's, QAdam over NCCL against the host backend's run, async model averaging
// of device weights and its shutdown. Skipped, with the reason, without the GPUs they need; the
// lead runs them on the GPU machine.
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

namespace bagua::algo {
namespace {

using namespace std::chrono_literals;
using namespace gputest;
using bagua::testing::gpuCount;

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
        auto pg = bagua::testing::rankGroup(store, r, kWorld, /*device=*/true,
                                            /*hierarchical=*/true);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
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

}  // namespace
}  // namespace bagua::algo
