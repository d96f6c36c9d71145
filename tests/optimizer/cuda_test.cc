// CUDA kernels against the CPU ones: every built-in rule (LAMB's per-tensor norms included),
// f32/f64/f16/bf16
// parameters (f16/bf16 with master weights), fused over a flat buffer on the GPU and stepped on
// the CPU from the same start: parameters and states equal bit for bit (both sides round every
// operation the same way: no FMA contraction, IEEE division and square root). Also the GPU
// inf/NaN check that makes a scaled step skip, and back-to-back steps with no synchronisation in
// between; LAMB's trust factor computed on the device (several block counts, |p| = 0, |u| = 0,
// mixed precision with and without master weights) and a LAMB step that does not wait for the
// GPU. Skips with a reason when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "bagua/optimizer/elementwise.h"
#include "bagua/optimizer/grad_scaler.h"
#include "optimizer_support.h"

namespace bagua::optim {
namespace {

using core::DataType;
using testing::Model;

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A model's tensors copied to the GPU (data and grad), as a Parameter list pointing there.
struct GpuModel {
  std::vector<core::Parameter> params;
  std::vector<void*> allocations;
  explicit GpuModel(const std::vector<core::Parameter>& host) {
    for (const auto& h : host) {
      core::Parameter p = h;
      void* d = nullptr;
      void* g = nullptr;
      cudaMalloc(&d, h.bytes() + 16);
      cudaMalloc(&g, h.bytes() + 16);
      cudaMemcpy(d, h.data, h.bytes(), cudaMemcpyHostToDevice);
      allocations.push_back(d);
      allocations.push_back(g);
      p.data = d;
      p.grad = g;
      p.device = core::Device{core::DeviceType::kCuda, 0};
      const size_t idx = params.size();
      p.setGrad = [this, idx](void* ng) { params[idx].grad = ng; };
      params.push_back(std::move(p));
    }
  }
  ~GpuModel() {
    for (void* a : allocations) {
      cudaFree(a);
    }
  }
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;
  void uploadGrads(const std::vector<core::Parameter>& host) {
    for (size_t i = 0; i < host.size(); ++i) {
      cudaMemcpy(params[i].grad, host[i].grad, host[i].bytes(), cudaMemcpyHostToDevice);
    }
  }
  std::vector<uint8_t> snapshot() const {
    std::vector<uint8_t> out;
    for (const auto& p : params) {
      const size_t at = out.size();
      out.resize(at + p.bytes());
      cudaMemcpy(out.data() + at, p.data, p.bytes(), cudaMemcpyDeviceToHost);
    }
    return out;
  }
};

std::vector<testing::Spec> specs() {
  return {{1000, DataType::kF32}, {3, DataType::kF32},      {70000, DataType::kF32},
          {129, DataType::kF64},  {4097, DataType::kF16},   {33, DataType::kF16},
          {513, DataType::kBF16}, {100000, DataType::kBF16}};
}

template <class Opt>
void expectCudaEqualsCpu(const typename Opt::Hyper& h) {
  Model cpu(specs());
  GpuModel gpu(cpu.params());
  OptimizerOptions o;
  o.threads = 2;
  auto a = Opt::create(cpu.params(), h, o);
  auto b = Opt::create(gpu.params, h, o);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_TRUE((*b)->fuse().isOk());
  for (int step = 0; step < 6; ++step) {
    cpu.fillGrads(step);
    gpu.uploadGrads(cpu.params());
    ASSERT_TRUE((*a)->plainStep().isOk());
    Status s = (*b)->step();
    ASSERT_TRUE(s.isOk()) << s.toString();
    EXPECT_GT((*b)->lastFusedRuns(), 0u);
    ASSERT_EQ(gpu.snapshot(), cpu.snapshot()) << Opt::RuleType::kName << " step " << step;
    auto sa = (*a)->saveState();
    auto sb = (*b)->saveState();
    ASSERT_TRUE(sa.isOk() && sb.isOk());
    ASSERT_EQ(*sa, *sb) << "state after step " << step;
  }
}

TEST(Cuda, KernelsEqualCpuBitForBit) {
  if (!haveGpu()) {
    GTEST_SKIP() << "no CUDA device visible: the CUDA optimizer kernels are checked on the GPU "
                    "machine";
  }
  SgdRule::Hyper sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weightDecay = 0.01;
  expectCudaEqualsCpu<Sgd>(sgd);
  AdamRule::Hyper adam;
  adam.amsgrad = true;
  adam.weightDecay = 0.1;
  expectCudaEqualsCpu<Adam>(adam);
  expectCudaEqualsCpu<AdamW>(AdamWRule::Hyper{});
  AdagradRule::Hyper ada;
  ada.lrDecay = 0.1;
  expectCudaEqualsCpu<Adagrad>(ada);
  RmspropRule::Hyper rms;
  rms.centered = true;
  rms.momentum = 0.5;
  expectCudaEqualsCpu<Rmsprop>(rms);
  expectCudaEqualsCpu<Adadelta>(AdadeltaRule::Hyper{});
  expectCudaEqualsCpu<Adamax>(AdamaxRule::Hyper{});
  LambRule::Hyper lamb;
  lamb.lr = 0.01;
  expectCudaEqualsCpu<Lamb>(lamb);
}

// Steps are stream-ordered, not synchronised: 20 back-to-back fused steps with no host read in
// between (the gradients stay put on the GPU) end where 20 CPU steps end, bit for bit.
template <class Opt>
void expectBackToBackEqualsCpu(const typename Opt::Hyper& h) {
  Model cpu(specs());
  GpuModel gpu(cpu.params());
  OptimizerOptions o;
  o.threads = 2;
  auto a = Opt::create(cpu.params(), h, o);
  auto b = Opt::create(gpu.params, h, o);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_TRUE((*b)->fuse().isOk());
  cpu.fillGrads(7);
  gpu.uploadGrads(cpu.params());
  for (int step = 0; step < 20; ++step) {
    ASSERT_TRUE((*a)->plainStep().isOk());
    Status s = (*b)->fuseStep();
    ASSERT_TRUE(s.isOk()) << s.toString();
  }
  ASSERT_EQ(gpu.snapshot(), cpu.snapshot()) << Opt::RuleType::kName;
  auto sa = (*a)->saveState();
  auto sb = (*b)->saveState();
  ASSERT_TRUE(sa.isOk() && sb.isOk());
  EXPECT_EQ(*sa, *sb) << Opt::RuleType::kName;
  EXPECT_EQ((*b)->stepCount(0), 20);
}

TEST(Cuda, BackToBackStepsWithoutSynchronisationEqualCpu) {
  if (!haveGpu()) {
    GTEST_SKIP() << "no CUDA device visible: checked on the GPU machine";
  }
  AdamRule::Hyper adam;
  adam.amsgrad = true;
  adam.weightDecay = 0.1;
  expectBackToBackEqualsCpu<Adam>(adam);
  SgdRule::Hyper sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  expectBackToBackEqualsCpu<Sgd>(sgd);
  LambRule::Hyper lamb;
  lamb.lr = 0.01;
  expectBackToBackEqualsCpu<Lamb>(lamb);
}

// LAMB's per-tensor trust factor is computed on the device: tensors of one block, of exactly a
// block, of several blocks (sums over many partials in block order), a tensor whose weights are 0
// (|p| = 0: trust 1) and one whose gradients stay 0 with no weight decay (|u| = 0: trust 1, the
// tensor never moves), in f32, f64, f16 and bf16 (with and without master weights), over two
// groups; bit for bit against the CPU after every step, states included.
void zeroTensor(void* p, size_t bytes) {
  std::memset(p, 0, bytes);
}

void expectLambCudaEqualsCpu(bool masterWeights) {
  Model cpu(testing::lambZeroNormSpecs());
  zeroTensor(cpu.params()[testing::kLambZeroWeights].data,
             cpu.params()[testing::kLambZeroWeights].bytes());
  GpuModel gpu(cpu.params());
  OptimizerOptions o;
  o.threads = 2;
  o.masterWeights = masterWeights;
  const std::vector<Lamb::Group> groups = testing::lambZeroNormGroups();
  auto a = Lamb::create(cpu.params(), groups, o);
  auto b = Lamb::create(gpu.params, groups, o);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_TRUE((*b)->fuse().isOk());
  const auto zeroGradsBefore = gpu.snapshot();
  for (int step = 0; step < 8; ++step) {
    cpu.fillGrads(step);
    zeroTensor(cpu.params()[testing::kLambZeroGrads].grad,
               cpu.params()[testing::kLambZeroGrads].bytes());
    gpu.uploadGrads(cpu.params());
    ASSERT_TRUE((*a)->plainStep().isOk());
    Status s = (*b)->step();
    ASSERT_TRUE(s.isOk()) << s.toString();
    EXPECT_GT((*b)->lastFusedRuns(), 0u);
    ASSERT_EQ(gpu.snapshot(), cpu.snapshot())
        << "lamb step " << step << " master " << masterWeights;
    auto sa = (*a)->saveState();
    auto sb = (*b)->saveState();
    ASSERT_TRUE(sa.isOk() && sb.isOk());
    ASSERT_EQ(*sa, *sb) << "lamb state after step " << step;
  }
  // The tensor with |u| = 0 did not move; the one that started at 0 did (trust 1, not 0/0).
  const auto after = gpu.snapshot();
  size_t at = 0;
  for (size_t t = 0; t < testing::kLambZeroGrads; ++t) {
    at += gpu.params[t].bytes();
  }
  const size_t n = gpu.params[testing::kLambZeroGrads].bytes();
  EXPECT_EQ(std::memcmp(after.data() + at, zeroGradsBefore.data() + at, n), 0);
  std::vector<uint8_t> zeros(gpu.params[testing::kLambZeroWeights].bytes(), 0);
  std::vector<uint8_t> moved(zeros.size());
  cudaMemcpy(moved.data(), gpu.params[testing::kLambZeroWeights].data, moved.size(),
             cudaMemcpyDeviceToHost);
  EXPECT_NE(moved, zeros);
}

TEST(Cuda, LambTrustFactorOnDeviceEqualsCpuBitForBit) {
  if (!haveGpu()) {
    GTEST_SKIP() << "no CUDA device visible: LAMB's device-side trust factor is checked on the "
                    "GPU machine";
  }
  expectLambCudaEqualsCpu(true);
  expectLambCudaEqualsCpu(false);
}

// A LAMB step only enqueues: with the stream held by a host callback that sleeps 2 s, a step
// (after a warm-up step that uploads the block layout) returns long before the callback ends;
// the results, once the stream drains, still equal the CPU's. The old path read the norms back
// and would wait out the callback.
void CUDART_CB sleepOnStream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST(Cuda, LambStepDoesNotWaitForTheGpu) {
  if (!haveGpu()) {
    GTEST_SKIP() << "no CUDA device visible: checked on the GPU machine";
  }
  Model cpu(testing::lambZeroNormSpecs());
  GpuModel gpu(cpu.params());
  OptimizerOptions o;
  o.threads = 2;
  LambRule::Hyper h;
  h.lr = 0.01;
  auto a = Lamb::create(cpu.params(), h, o);
  auto b = Lamb::create(gpu.params, h, o);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE((*b)->fuse().isOk());
  cpu.fillGrads(3);
  gpu.uploadGrads(cpu.params());
  ASSERT_TRUE((*a)->plainStep().isOk());
  ASSERT_TRUE((*b)->fuseStep().isOk());  // warm-up: buffers and layouts
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  static int sleepMs = 2000;
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, sleepOnStream, &sleepMs), cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*b)->fuseStep().isOk());
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 1000.0) << "3 LAMB steps waited for the stream (" << ms << " ms)";
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*a)->plainStep().isOk());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(gpu.snapshot(), cpu.snapshot());
}

TEST(Cuda, InfGradientSkipsTheStepOnTheGpu) {
  if (!haveGpu()) {
    GTEST_SKIP() << "no CUDA device visible";
  }
  Model cpu(specs());
  GpuModel gpu(cpu.params());
  auto opt = Adam::create(gpu.params, AdamRule::Hyper{});
  ASSERT_TRUE(opt.isOk());
  ASSERT_TRUE((*opt)->fuse().isOk());
  GradScalerOptions so;
  so.initScale = 64;
  auto scaler = GradScaler::create(so);
  ASSERT_TRUE(scaler.isOk());
  (*opt)->setGradScaler(&*scaler);
  cpu.fillGrads(0, 64);
  static_cast<uint16_t*>(cpu.params()[7].grad)[99999] = 0x7f80;  // bf16 +inf
  gpu.uploadGrads(cpu.params());
  const auto before = gpu.snapshot();
  ASSERT_TRUE((*opt)->step().isOk());
  EXPECT_TRUE((*opt)->lastStepSkipped());
  EXPECT_EQ(gpu.snapshot(), before);
  EXPECT_EQ(scaler->scale(), 32.0f);
  cpu.fillGrads(1, 32);
  gpu.uploadGrads(cpu.params());
  ASSERT_TRUE((*opt)->step().isOk());
  EXPECT_FALSE((*opt)->lastStepSkipped());
}

}  // namespace
}  // namespace bagua::optim
