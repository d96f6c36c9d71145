// CUDA kernels of the built-in rules: one launch over a whole range (a fused run of tensors or a
// single tensor). Each element runs the same Rule::apply as the CPU kernel (rules.h), compiled
// with -fmad=false and IEEE division and square root, so the f32/f64 results equal the CPU ones.
#include <cuda_runtime.h>

#include <type_traits>

#include "bagua/optimizer/kernel_args.h"
#include "bagua/optimizer/rules.h"
#include "optimizer_kernels.h"

namespace bagua::optim::cudakernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 16;

// Blocks of a grid-stride launch over n elements: one thread per element, at most kMaxBlocks.
unsigned gridFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

int launched() {
  return static_cast<int>(cudaGetLastError());
}

// The launch's stream (KernelArgs::stream; null: the legacy default stream).
cudaStream_t streamOf(const KernelArgs& a) {
  return static_cast<cudaStream_t>(a.stream);
}

// Returns f(std::integral_constant<unsigned, min(mask, Top)>{}): the state mask as a template
// argument, so that a kernel loads and stores only the state arrays the range has.
template <unsigned Top, class F>
int withMask(unsigned mask, F&& f) {
  if constexpr (Top == 0) {
    return f(std::integral_constant<unsigned, 0>{});
  } else {
    return mask >= Top ? f(std::integral_constant<unsigned, Top>{}) : withMask<Top - 1>(mask, f);
  }
}

// Returns CALL(P, T, kMaster) for the range's storage type: P the stored type, T the type the
// rule computes in, kMaster whether a float32 master copy is read and written.
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

template <class Rule, class P, class T, bool kMaster>
int launchStorage(const void* scalars, const KernelArgs& a) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  return withMask<7>(a.mask & 7u, [&](auto mask) {
    elementwiseKernel<Rule, P, T, kMaster, decltype(mask)::value>
        <<<gridFor(a.numel), kThreads, 0, streamOf(a)>>>(c, a);
    return launched();
  });
}

template <class Rule>
int launchRule(const void* scalars, const KernelArgs& a) {
#define BAGUA_CALL(P, T, M) launchStorage<Rule, P, T, M>(scalars, a)
  BAGUA_OPTIM_BY_STORAGE(a, BAGUA_CALL);
#undef BAGUA_CALL
}

// launchRule<Rule> for the one of Rules whose kCudaId is ruleId (InvalidValue for none).
template <class... Rules>
int launchById(int ruleId, const void* scalars, const KernelArgs& a) {
  int err = static_cast<int>(cudaErrorInvalidValue);
  (void)((Rules::kCudaId == ruleId ? (err = launchRule<Rules>(scalars, a), true) : false) || ...);
  return err;
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
                        const double* partials, double* trust, cudaStream_t stream) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  constexpr unsigned kFactorThreads = 128;
  const unsigned g = static_cast<unsigned>((numSegments + kFactorThreads - 1) / kFactorThreads);
  trustFactorKernel<Rule, T>
      <<<g, kFactorThreads, 0, stream>>>(c, segFirst, numSegments, partials, trust);
  return launched();
}

template <class Rule, class P, class T, bool kMaster>
int trustUpdateStorage(const void* scalars, const KernelArgs& a, void* u) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  T* ut = static_cast<T*>(u);
  return withMask<3>(a.mask & 7u, [&](auto mask) {
    trustUpdateKernel<Rule, P, T, kMaster, decltype(mask)::value>
        <<<gridFor(a.numel), kThreads, 0, streamOf(a)>>>(c, a, ut);
    return launched();
  });
}

template <class P, class T, bool kMaster>
int trustNormsStorage(const KernelArgs& a, const void* u, const NormBlock* blocks, size_t n,
                      double* partials) {
  const unsigned g = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  trustNormsKernel<P, T, kMaster>
      <<<g, kThreads, 0, streamOf(a)>>>(a, static_cast<const T*>(u), blocks, n, partials);
  return launched();
}

template <class Rule, class P, class T, bool kMaster>
int trustApplyStorage(const void* scalars, const KernelArgs& a, const void* u,
                      const NormBlock* blocks, const double* trust, size_t n) {
  const auto& c = *static_cast<const typename Rule::template Scalars<T>*>(scalars);
  trustApplyKernel<Rule, P, T, kMaster><<<static_cast<unsigned>(n), kThreads, 0, streamOf(a)>>>(
      c, a, static_cast<const T*>(u), blocks, trust);
  return launched();
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

template <class P, class T>
int nonFiniteStorage(const KernelArgs& a, int* flag) {
  nonFiniteKernel<P, T><<<gridFor(a.numel), kThreads, 0, streamOf(a)>>>(a, flag);
  return launched();
}

}  // namespace

int elementwise(int ruleId, const void* scalars, const KernelArgs& a) {
  if (a.numel == 0) {
    return 0;
  }
  // No synchronisation: the launch is stream-ordered and the next step may be enqueued behind it.
  return launchById<SgdRule, AdamRule, AdagradRule, RmspropRule, AdadeltaRule, AdamaxRule>(
      ruleId, scalars, a);
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
                 size_t numSegments, const double* partials, double* trust, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (ruleId != LambRule::kCudaId) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (numSegments == 0) {
    return 0;
  }
  if (storage == StorageType::kF64) {
    return trustFactorsStorage<LambRule, double>(scalars, segFirst, numSegments, partials, trust,
                                                 s);
  }
  return trustFactorsStorage<LambRule, float>(scalars, segFirst, numSegments, partials, trust, s);
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
#define BAGUA_CALL(P, T, M) nonFiniteStorage<P, T>(a, flag)
  const int launch = [&]() -> int { BAGUA_OPTIM_BY_STORAGE(a, BAGUA_CALL); }();
#undef BAGUA_CALL
  if (launch != 0) {
    return launch;
  }
  int host = 0;
  e = cudaMemcpy(&host, flag, sizeof host, cudaMemcpyDeviceToHost);
  *found = host != 0;
  return static_cast<int>(e);
}

}  // namespace bagua::optim::cudakernels
