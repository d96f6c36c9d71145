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
  const StatePtrs<T> st(a);
  const T inv = static_cast<T>(a.invScale);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.numel;
       i += stride) {
    T s[kMaxStates];
    loadStates<Mask>(st.p, i, s);
    T w;
    if (kMaster) {
      w = static_cast<T>(master[i]);
    } else {
      w = load<T>(param[i]);
    }
    Rule::apply(c, w, load<T>(grad[i]) * inv, s);
    storeStates<Mask>(st.p, i, s);
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

// ---- Trust-ratio rules (LAMB) -------------------------------------------------------------------

template <class P, class T, bool kMaster>
__device__ __forceinline__ T weightAt(const KernelArgs& a, size_t i) {
  if (kMaster) {
    return static_cast<T>(a.master[i]);
  }
  return load<T>(static_cast<const P*>(a.param)[i]);
}

template <class Rule, class P, class T, bool kMaster, unsigned Mask>
__global__ void __launch_bounds__(kThreads)
    trustUpdateKernel(const typename Rule::template Scalars<T> c, const KernelArgs a, T* u) {
  const P* __restrict__ grad = static_cast<const P*>(a.grad);
  const StatePtrs<T> st(a);
  const T inv = static_cast<T>(a.invScale);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.numel;
       i += stride) {
    T s[kMaxStates];
    loadStates<Mask>(st.p, i, s);
    const T w = weightAt<P, T, kMaster>(a, i);
    u[i] = Rule::update(c, w, load<T>(grad[i]) * inv, s);
    storeStates<Mask>(st.p, i, s);
  }
}

// One thread per norm block, summing in element order like the CPU kernel.
template <class P, class T, bool kMaster>
__global__ void trustNormsKernel(const KernelArgs a, const T* u, const NormBlock* blocks,
                                 size_t numBlocks, double* partials) {
  const size_t b = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= numBlocks) {
    return;
  }
  double pw = 0.0, uu = 0.0;
  for (size_t i = blocks[b].begin; i < blocks[b].end; ++i) {
    const double w = static_cast<double>(weightAt<P, T, kMaster>(a, i));
    const double v = static_cast<double>(u[i]);
    pw += w * w;
    uu += v * v;
  }
  partials[2 * b] = pw;
  partials[2 * b + 1] = uu;
}

// One CUDA block per norm block.
template <class Rule, class P, class T, bool kMaster>
__global__ void __launch_bounds__(kThreads)
    trustApplyKernel(const typename Rule::template Scalars<T> c, const KernelArgs a, const T* u,
                     const NormBlock* blocks, const double* trust) {
  const NormBlock blk = blocks[blockIdx.x];
  const T t = static_cast<T>(trust[blockIdx.x]);
  P* param = static_cast<P*>(a.param);
  for (size_t i = blk.begin + threadIdx.x; i < blk.end; i += blockDim.x) {
    T w = weightAt<P, T, kMaster>(a, i);
    Rule::applyTrust(c, w, u[i], t);
    if (kMaster) {
      a.master[i] = static_cast<float>(w);
    }
    store(param[i], w);
  }
}

// One thread per tensor: its blocks' partial sums added in block order from 0.0 (the CPU path's
// order and operations, so the norms are the same bits), the rule's trust factor from them, and
// that factor written for each of the tensor's blocks (what trustApplyKernel reads).
template <class Rule, class T>
__global__ void trustFactorKernel(const typename Rule::template Scalars<T> c,
                                  const size_t* segFirst, size_t numSegments,
                                  const double* partials, double* trust) {
  const size_t s = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= numSegments) {
    return;
  }
  const size_t first = segFirst[s];
  const size_t last = segFirst[s + 1];
  double pn = 0.0, un = 0.0;
  for (size_t b = first; b < last; ++b) {
    pn += partials[2 * b];
    un += partials[2 * b + 1];
  }
  const double f = static_cast<double>(Rule::template trust<T>(c, pn, un));
  for (size_t b = first; b < last; ++b) {
    trust[b] = f;
  }
}

template <class Rule, class T>
int trustFactorsStorage(const void* scalars, const size_t* segFirst, size_t numSegments,
                        const double* partials, double* trust) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  constexpr unsigned kFactorThreads = 128;
  const unsigned g = static_cast<unsigned>((numSegments + kFactorThreads - 1) / kFactorThreads);
  trustFactorKernel<Rule, T><<<g, kFactorThreads>>>(c, segFirst, numSegments, partials, trust);
  return static_cast<int>(cudaGetLastError());
}

template <class Rule, class P, class T, bool kMaster>
int trustUpdateStorage(const void* scalars, const KernelArgs& a, void* u) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  size_t blocks = (a.numel + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
  const unsigned g = static_cast<unsigned>(blocks);
  T* ut = static_cast<T*>(u);
  switch (a.mask & 7u) {
  case 0:
    trustUpdateKernel<Rule, P, T, kMaster, 0><<<g, kThreads>>>(c, a, ut);
    break;
  case 1:
    trustUpdateKernel<Rule, P, T, kMaster, 1><<<g, kThreads>>>(c, a, ut);
    break;
  case 2:
    trustUpdateKernel<Rule, P, T, kMaster, 2><<<g, kThreads>>>(c, a, ut);
    break;
  default:
    trustUpdateKernel<Rule, P, T, kMaster, 3><<<g, kThreads>>>(c, a, ut);
    break;
  }
  return static_cast<int>(cudaGetLastError());
}

template <class P, class T, bool kMaster>
int trustNormsStorage(const KernelArgs& a, const void* u, const NormBlock* blocks, size_t n,
                      double* partials) {
  const unsigned g = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  trustNormsKernel<P, T, kMaster>
      <<<g, kThreads>>>(a, static_cast<const T*>(u), blocks, n, partials);
  return static_cast<int>(cudaGetLastError());
}

template <class Rule, class P, class T, bool kMaster>
int trustApplyStorage(const void* scalars, const KernelArgs& a, const void* u,
                      const NormBlock* blocks, const double* trust, size_t n) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  trustApplyKernel<Rule, P, T, kMaster>
      <<<static_cast<unsigned>(n), kThreads>>>(c, a, static_cast<const T*>(u), blocks, trust);
  return static_cast<int>(cudaGetLastError());
}

// Calls F<P, T, kMaster>::run(args...) for the range's storage type.
#define BAGUA_OPTIM_BY_STORAGE(a, CALL)                                                        \
  switch ((a).storage) {                                                                       \
  case StorageType::kF32:                                                                      \
    return CALL(float, float, false);                                                          \
  case StorageType::kF64:                                                                      \
    return CALL(double, double, false);                                                        \
  case StorageType::kF16:                                                                      \
    return (a).master != nullptr ? CALL(Half, float, true) : CALL(Half, float, false);         \
  case StorageType::kBF16:                                                                     \
    return (a).master != nullptr ? CALL(BFloat16, float, true) : CALL(BFloat16, float, false); \
  }                                                                                            \
  return static_cast<int>(cudaErrorInvalidValue)

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
  case AdamaxRule::kCudaId:
    err = launchRule<AdamaxRule>(scalars, a);
    break;
  default:
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // No synchronisation: the launch is stream-ordered and the next step may be enqueued behind it.
  return err;
}

int trustUpdate(int ruleId, const void* scalars, const KernelArgs& a, void* u) {
  if (ruleId != LambRule::kCudaId) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
#define BAGUA_CALL(P, T, M) trustUpdateStorage<LambRule, P, T, M>(scalars, a, u)
  BAGUA_OPTIM_BY_STORAGE(a, BAGUA_CALL);
#undef BAGUA_CALL
}

int trustNorms(const KernelArgs& a, const void* u, const NormBlock* blocks, size_t numBlocks,
               double* partials) {
#define BAGUA_CALL(P, T, M) trustNormsStorage<P, T, M>(a, u, blocks, numBlocks, partials)
  BAGUA_OPTIM_BY_STORAGE(a, BAGUA_CALL);
#undef BAGUA_CALL
}

int trustFactors(int ruleId, const void* scalars, StorageType storage, const size_t* segFirst,
                 size_t numSegments, const double* partials, double* trust) {
  if (ruleId != LambRule::kCudaId) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (numSegments == 0) {
    return 0;
  }
  if (storage == StorageType::kF64) {
    return trustFactorsStorage<LambRule, double>(scalars, segFirst, numSegments, partials, trust);
  }
  return trustFactorsStorage<LambRule, float>(scalars, segFirst, numSegments, partials, trust);
}

int trustApply(int ruleId, const void* scalars, const KernelArgs& a, const void* u,
               const NormBlock* blocks, const double* trust, size_t numBlocks) {
  if (ruleId != LambRule::kCudaId) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
#define BAGUA_CALL(P, T, M) \
  trustApplyStorage<LambRule, P, T, M>(scalars, a, u, blocks, trust, numBlocks)
  BAGUA_OPTIM_BY_STORAGE(a, BAGUA_CALL);
#undef BAGUA_CALL
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
