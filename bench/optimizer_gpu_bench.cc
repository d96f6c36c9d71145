// The fused optimizer's CUDA Adam on one GPU: step time of the fused step (flattened: one launch
// per (group, dtype) buffer) and of the per-tensor step (one launch per tensor) on a parameter
// set, and the copy bandwidth (cudaMemcpy device to device; read + written bytes per second)
// measured in the same run. bench/gpu/optimizer_torch.py runs torch.optim.Adam(fused=True) and
// (foreach=True) on the same parameter set for the comparison.
//
// usage: optimizer_gpu_bench [--set small10k|bert] [--iters N]
// Prints one CSV line per case: label,set,tensors,elems,ms_per_step,GBps,bound,host_us
// (ms_per_step: CUDA events around N back-to-back steps, so it is the GPU time when the host keeps
// up and the host time when it does not; GBps = 28 bytes per element / step time; bound = GBps /
// copy GBps, the copy of the same byte count timed the same way in this run; host_us: wall time
// per step of the enqueueing loop, before the final synchronisation).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bagua/optimizer/elementwise.h"

namespace {

using bagua::optim::Adam;
using bagua::optim::AdamRule;

// The parameter sets, defined identically in bench/gpu/optimizer_torch.py.
std::vector<size_t> parameterSet(const std::string& name) {
  std::vector<size_t> s;
  if (name == "small10k") {
    for (size_t i = 0; i < 10000; ++i) {
      s.push_back(((i * 37) % 8 + 1) * 64);
    }
  } else {  // "bert": BERT-base's parameter shapes (110M elements, 199 tensors)
    const size_t h = 768, f = 3072;
    s = {30522 * h, 512 * h, 2 * h, h, h};
    for (int l = 0; l < 12; ++l) {
      for (int k = 0; k < 4; ++k) {  // q, k, v, attention output
        s.push_back(h * h);
        s.push_back(h);
      }
      s.push_back(h);  // attention LayerNorm
      s.push_back(h);
      s.push_back(h * f);
      s.push_back(f);
      s.push_back(f * h);
      s.push_back(h);
      s.push_back(h);  // output LayerNorm
      s.push_back(h);
    }
    s.push_back(h * h);  // pooler
    s.push_back(h);
  }
  return s;
}

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

double copyGBps(size_t bytes, int iters) {
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int w = 0; w < 3; ++w) {
    CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  }
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  }
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) * iters / (ms / 1e3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string set = "small10k";
  int iters = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--set") == 0) {
      set = argv[i + 1];
    } else if (std::strcmp(argv[i], "--iters") == 0) {
      iters = std::atoi(argv[i + 1]);
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const auto sizes = parameterSet(set);
  size_t elems = 0;
  for (size_t s : sizes) {
    elems += s;
  }
  const double bytes = 28.0 * static_cast<double>(elems);
  // Copy the same number of bytes as one Adam update moves (read + written).
  const double copy = copyGBps(static_cast<size_t>(bytes / 2), iters);
  std::printf("label,set,tensors,elems,ms_per_step,GBps,bound,host_us\n");
  std::printf("copy,%s,%zu,%zu,%.4f,%.1f,1.000,0\n", set.c_str(), sizes.size(), elems,
              bytes / (copy * 1e9) * 1e3, copy);
  // bagua_fused: fuse() with checkFlatten (every tensor's pointers compared each step);
  // bagua_fused_nocheck: checkFlatten off (a window of 256 per step); bagua_per_tensor: plainStep.
  for (int mode = 0; mode < 3; ++mode) {
    const bool fused = mode < 2;
    const char* label =
        mode == 0 ? "bagua_fused" : (mode == 1 ? "bagua_fused_nocheck" : "bagua_per_tensor");
    std::vector<bagua::core::Parameter> params;
    std::vector<void*> allocs;
    for (size_t t = 0; t < sizes.size(); ++t) {
      void* d = nullptr;
      void* g = nullptr;
      CHECK_CUDA(cudaMalloc(&d, sizes[t] * 4));
      CHECK_CUDA(cudaMalloc(&g, sizes[t] * 4));
      CHECK_CUDA(cudaMemset(d, 0, sizes[t] * 4));
      CHECK_CUDA(cudaMemset(g, 0, sizes[t] * 4));
      allocs.push_back(d);
      allocs.push_back(g);
      bagua::core::Parameter p;
      p.name = "t" + std::to_string(t);
      p.data = d;
      p.grad = g;
      p.numel = sizes[t];
      p.device = bagua::core::Device{bagua::core::DeviceType::kCuda, 0};
      params.push_back(std::move(p));
    }
    AdamRule::Hyper h;
    h.weightDecay = 0.01;
    auto opt = Adam::create(params, h);
    if (!opt.isOk()) {
      std::printf("error: %s\n", opt.status().toString().c_str());
      return 1;
    }
    if (fused) {
      bagua::optim::FuseOptions fo;
      fo.checkFlatten = mode == 0;
      bagua::Status s = (*opt)->fuse(fo);
      if (!s.isOk()) {
        std::printf("error: %s\n", s.toString().c_str());
        return 1;
      }
      // fuse() moved data and gradients into flat buffers: the originals are free to go.
      for (void* a : allocs) {
        cudaFree(a);
      }
      allocs.clear();
    }
    for (int w = 0; w < 3; ++w) {
      (void)(fused ? (*opt)->fuseStep() : (*opt)->plainStep());
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    const int steps =
        fused ? iters : (iters < 20 ? iters : 20);  // per-tensor: 10,000 launches a step
    CHECK_CUDA(cudaEventRecord(e0));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      bagua::Status s = fused ? (*opt)->fuseStep() : (*opt)->plainStep();
      if (!s.isOk()) {
        std::printf("error: %s\n", s.toString().c_str());
        return 1;
      }
    }
    const double hostSec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    const double sec = static_cast<double>(ms) / 1e3 / steps;
    const double gbps = bytes / sec / 1e9;
    std::printf("%s,%s,%zu,%zu,%.4f,%.1f,%.3f,%.1f\n", label, set.c_str(), sizes.size(), elems,
                sec * 1e3, gbps, gbps / copy, hostSec * 1e6);
    opt->reset();
    for (void* a : allocs) {
      cudaFree(a);
    }
  }
  return 0;
}
