// CUDA kernels of the built-in rules: one launch over a whole range (a fused run of tensors or a
// single tensor). Each element runs the same Rule::apply as the CPU kernel (rules.h), compiled
// with -fmad=false and IEEE division and square root, so the f32/f64 results equal the CPU ones.
#include <cuda_runtime.h>

#include "bagua/optimizer/kernel_args.h"
#include "bagua/optimizer/rules.h"
#include "optimizer_kernels.h"

namespace bagua::optim::cudakernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 16;

template <class Rule, class P, class T, bool kMaster, unsigned Mask>
__global__ void __launch_bounds__(kThreads)
    elementwiseKernel(const typename Rule::template Scalars<T> c, const KernelArgs a) {
  P* __restrict__ param = static_cast<P*>(a.param);
  const P* __restrict__ grad = static_cast<const P*>(a.grad);
  float* __restrict__ master = a.master;
  T* __restrict__ s0 = static_cast<T*>(a.states[0]);
  T* __restrict__ s1 = static_cast<T*>(a.states[1]);
  T* __restrict__ s2 = static_cast<T*>(a.states[2]);
  const T inv = static_cast<T>(a.invScale);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.numel;
       i += stride) {
    T s[kMaxStates] = {T(0), T(0), T(0)};
    if (Mask & 1u) {
      s[0] = s0[i];
    }
    if (Mask & 2u) {
      s[1] = s1[i];
    }
    if (Mask & 4u) {
      s[2] = s2[i];
    }
    T w;
    if (kMaster) {
      w = static_cast<T>(master[i]);
    } else {
      w = load<T>(param[i]);
    }
    Rule::apply(c, w, load<T>(grad[i]) * inv, s);
    if (Mask & 1u) {
      s0[i] = s[0];
    }
    if (Mask & 2u) {
      s1[i] = s[1];
    }
    if (Mask & 4u) {
      s2[i] = s[2];
    }
    if (kMaster) {
      master[i] = static_cast<float>(w);
    }
    store(param[i], w);
  }
}

template <class Rule, class P, class T, bool kMaster, unsigned Mask>
int launchMask(const void* scalars, const KernelArgs& a) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  size_t blocks = (a.numel + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
  elementwiseKernel<Rule, P, T, kMaster, Mask><<<static_cast<unsigned>(blocks), kThreads>>>(c, a);
  return static_cast<int>(cudaGetLastError());
}

template <class Rule, class P, class T, bool kMaster>
int launchStorage(const void* scalars, const KernelArgs& a) {
  switch (a.mask & 7u) {
  case 0:
    return launchMask<Rule, P, T, kMaster, 0>(scalars, a);
  case 1:
    return launchMask<Rule, P, T, kMaster, 1>(scalars, a);
  case 2:
    return launchMask<Rule, P, T, kMaster, 2>(scalars, a);
  case 3:
    return launchMask<Rule, P, T, kMaster, 3>(scalars, a);
  case 4:
    return launchMask<Rule, P, T, kMaster, 4>(scalars, a);
  case 5:
    return launchMask<Rule, P, T, kMaster, 5>(scalars, a);
  case 6:
    return launchMask<Rule, P, T, kMaster, 6>(scalars, a);
  default:
    return launchMask<Rule, P, T, kMaster, 7>(scalars, a);
  }
}

template <class Rule>
int launchRule(const void* scalars, const KernelArgs& a) {
  switch (a.storage) {
  case StorageType::kF32:
    return launchStorage<Rule, float, float, false>(scalars, a);
  case StorageType::kF64:
    return launchStorage<Rule, double, double, false>(scalars, a);
  case StorageType::kF16:
    return a.master != nullptr ? launchStorage<Rule, Half, float, true>(scalars, a)
                               : launchStorage<Rule, Half, float, false>(scalars, a);
  case StorageType::kBF16:
    return a.master != nullptr ? launchStorage<Rule, BFloat16, float, true>(scalars, a)
                               : launchStorage<Rule, BFloat16, float, false>(scalars, a);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

template <class P, class T>
__global__ void nonFiniteKernel(const KernelArgs a, int* flag) {
  const P* grad = static_cast<const P*>(a.grad);
  const T inv = static_cast<T>(a.invScale);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  int bad = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.numel;
       i += stride) {
    const T v = load<T>(grad[i]) * inv;
    bad |= isfinite(v) ? 0 : 1;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) {
    *flag = 1;
  }
}

}  // namespace

int elementwise(int ruleId, const void* scalars, const KernelArgs& a) {
  if (a.numel == 0) {
    return 0;
  }
  int err = 0;
  switch (ruleId) {
  case SgdRule::kCudaId:
    err = launchRule<SgdRule>(scalars, a);
    break;
  case AdamRule::kCudaId:
    err = launchRule<AdamRule>(scalars, a);
    break;
  case AdagradRule::kCudaId:
    err = launchRule<AdagradRule>(scalars, a);
    break;
  case RmspropRule::kCudaId:
    err = launchRule<RmspropRule>(scalars, a);
    break;
  case AdadeltaRule::kCudaId:
    err = launchRule<AdadeltaRule>(scalars, a);
    break;
  default:
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (err != 0) {
    return err;
  }
  return static_cast<int>(cudaStreamSynchronize(nullptr));
}

int nonFinite(const KernelArgs& a, int* flag, bool* found) {
  *found = false;
  if (a.numel == 0) {
    return 0;
  }
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), nullptr);
  if (e != cudaSuccess) {
    return static_cast<int>(e);
  }
  size_t blocks = (a.numel + kThreads - 1) / kThreads;
  blocks = blocks > kMaxBlocks ? kMaxBlocks : blocks;
  switch (a.storage) {
  case StorageType::kF32:
    nonFiniteKernel<float, float><<<static_cast<unsigned>(blocks), kThreads>>>(a, flag);
    break;
  case StorageType::kF64:
    nonFiniteKernel<double, double><<<static_cast<unsigned>(blocks), kThreads>>>(a, flag);
    break;
  case StorageType::kF16:
    nonFiniteKernel<Half, float><<<static_cast<unsigned>(blocks), kThreads>>>(a, flag);
    break;
  case StorageType::kBF16:
    nonFiniteKernel<BFloat16, float><<<static_cast<unsigned>(blocks), kThreads>>>(a, flag);
    break;
  }
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    return static_cast<int>(e);
  }
  int host = 0;
  e = cudaMemcpy(&host, flag, sizeof host, cudaMemcpyDeviceToHost);
  *found = host != 0;
  return static_cast<int>(e);
}

const char* errorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace bagua::optim::cudakernels
