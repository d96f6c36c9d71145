// The optimizer's CUDA half (cuda_ops.h): device memory helpers and Status mapping around the
// kernels in cuda/optimizer_kernels.cu, registered with the optimizer when this library is loaded
// (or, linked statically, before main()).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bagua/base/cuda_check.h"
#include "cuda/optimizer_kernels.h"
#include "cuda_ops.h"

namespace bagua::optim::detail {

namespace {

// Makes `device` current; cudaSetDevice only when it is not (a step stays a few API calls).
Status onDevice(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == device) {
    return Status::ok();
  }
  return BAGUA_CUDA_STATUS(cudaSetDevice(device));
}

class CudaRuntimeOps final : public CudaOps {
 public:
  Status allocZeroed(int device, size_t bytes, void** out) override;
  void release(int device, void* ptr) override;
  Status copy(int device, void* dst, const void* src, size_t bytes, int kind) override;
  Status zero(int device, void* ptr, size_t bytes) override;
  Status elementwise(int ruleId, const void* scalars, const KernelArgs& args, int device) override;
  Status trustRatio(int ruleId, const void* scalars, const KernelArgs& args, const size_t* segments,
                    size_t numSegments, CudaTrustScratch& scratch, int device) override;
  Status createStream(int device, void** stream) override;
  void destroyStream(int device, void* stream) override;
  Status streamAfter(int device, void* waiter, void* signaller) override;
  Status nonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found) override;
};

Status CudaRuntimeOps::allocZeroed(int device, size_t bytes, void** out) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  BAGUA_CHECK_CUDA(cudaMalloc(out, bytes));
  return BAGUA_CUDA_STATUS(cudaMemset(*out, 0, bytes));
}

void CudaRuntimeOps::release(int device, void* ptr) {
  if (ptr != nullptr && cudaSetDevice(device) == cudaSuccess) {
    cudaFree(ptr);
  }
}

Status CudaRuntimeOps::copy(int device, void* dst, const void* src, size_t bytes, int kind) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const cudaMemcpyKind k = kind == 0   ? cudaMemcpyDeviceToDevice
                           : kind == 1 ? cudaMemcpyHostToDevice
                                       : cudaMemcpyDeviceToHost;
  return BAGUA_CUDA_STATUS(cudaMemcpy(dst, src, bytes, k));
}

Status CudaRuntimeOps::zero(int device, void* ptr, size_t bytes) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  return BAGUA_CUDA_STATUS(cudaMemset(ptr, 0, bytes));
}

Status CudaRuntimeOps::elementwise(int ruleId, const void* scalars, const KernelArgs& args,
                                   int device) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const int err = cudakernels::elementwise(ruleId, scalars, args);
  if (err != 0) {
    // The kernels' entry points return cudaError_t values as int (cuda/optimizer_kernels.h).
    return cudaStatus(static_cast<cudaError_t>(err),
                      strPrintf("optimizer kernel (rule %d, %zu elements)", ruleId, args.numel),
                      __FILE__, __LINE__);
  }
  return Status::ok();
}

// A range's norm-block layout on the device, uploaded once: the block table, then per tensor the
// index of its first block (numSegments + 1 entries: tensor s owns blocks [first[s], first[s+1])).
struct TrustLayout {
  std::vector<size_t> sizes;        // the tensor sizes it was cut from: the cache key
  std::vector<unsigned char> host;  // the uploaded bytes, kept until `device` is freed
  size_t numBlocks = 0;
  void* device = nullptr;
  uint64_t lastUse = 0;

  const cudakernels::NormBlock* blocks() const {
    return static_cast<const cudakernels::NormBlock*>(device);
  }
  const size_t* segFirst() const {
    return reinterpret_cast<const size_t*>(static_cast<const unsigned char*>(device) +
                                           numBlocks * sizeof(cudakernels::NormBlock));
  }
};

struct TrustState final : CudaTrustScratch::Impl {
  // Layouts kept per optimizer (one per fused run or single tensor it steps on CUDA); past this
  // the least recently used one is freed (cudaFree waits for the device: only on such churn).
  static constexpr size_t kMaxLayouts = 4096;
  int device = -1;
  // Device buffers shared by every range (stream-ordered), grown as needed.
  void* u = nullptr;
  void* partials = nullptr;
  void* trust = nullptr;
  size_t uBytes = 0, partialsBytes = 0, trustBytes = 0;
  std::vector<TrustLayout> layouts;
  size_t lastFound = 0;
  uint64_t clock = 0;

  ~TrustState() override { release(); }
  void release() {
    if (device >= 0 && cudaSetDevice(device) == cudaSuccess) {
      for (void* p : {u, partials, trust}) {
        if (p != nullptr) {
          cudaFree(p);
        }
      }
      for (TrustLayout& l : layouts) {
        if (l.device != nullptr) {
          cudaFree(l.device);
        }
      }
    }
    u = partials = trust = nullptr;
    uBytes = partialsBytes = trustBytes = 0;
    layouts.clear();
    lastFound = 0;
  }
  static Status grow(void** p, size_t* have, size_t need) {
    if (*have >= need) {
      return Status::ok();
    }
    if (*p != nullptr) {
      cudaFree(*p);
      *p = nullptr;
      *have = 0;
    }
    BAGUA_CHECK_CUDA(cudaMalloc(p, need));
    *have = need;
    return Status::ok();
  }

  // The device layout of `segments` (found, or cut and uploaded with an async copy on the stream
  // the kernels use). Steady state: a compare of numSegments sizes, no CUDA call.
  Status layoutFor(const size_t* segments, size_t numSegments, cudaStream_t stream,
                   const TrustLayout** out) {
    ++clock;
    // Ranges come in the same order every step: start after the last one found, so a steady
    // state finds each layout at the first compare.
    for (size_t k = 0; k < layouts.size(); ++k) {
      const size_t i = (lastFound + 1 + k) % layouts.size();
      TrustLayout& l = layouts[i];
      if (l.sizes.size() == numSegments &&
          std::memcmp(l.sizes.data(), segments, numSegments * sizeof(size_t)) == 0) {
        l.lastUse = clock;
        lastFound = i;
        *out = &l;
        return Status::ok();
      }
    }
    if (layouts.size() >= kMaxLayouts) {
      size_t oldest = 0;
      for (size_t i = 1; i < layouts.size(); ++i) {
        if (layouts[i].lastUse < layouts[oldest].lastUse) {
          oldest = i;
        }
      }
      cudaFree(layouts[oldest].device);  // synchronises: kernels reading it have finished
      layouts.erase(layouts.begin() + static_cast<std::ptrdiff_t>(oldest));
    }
    TrustLayout l;
    l.sizes.assign(segments, segments + numSegments);
    std::vector<cudakernels::NormBlock> table;
    std::vector<size_t> first(numSegments + 1, 0);
    forEachNormBlock(segments, numSegments, [&](size_t s, size_t b, size_t e) {
      table.push_back({b, e});
      first[s + 1] = table.size();
    });
    for (size_t s = 1; s <= numSegments; ++s) {  // empty tensors own no blocks
      first[s] = first[s] > first[s - 1] ? first[s] : first[s - 1];
    }
    l.numBlocks = table.size();
    const size_t tableBytes = table.size() * sizeof(cudakernels::NormBlock);
    const size_t firstBytes = first.size() * sizeof(size_t);
    l.host.resize(tableBytes + firstBytes);
    if (tableBytes > 0) {
      std::memcpy(l.host.data(), table.data(), tableBytes);
    }
    std::memcpy(l.host.data() + tableBytes, first.data(), firstBytes);
    BAGUA_CHECK_CUDA(cudaMalloc(&l.device, l.host.size()));
    const cudaError_t err =
        cudaMemcpyAsync(l.device, l.host.data(), l.host.size(), cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) {
      cudaFree(l.device);
      return cudaStatus(err, "cudaMemcpyAsync (trust-ratio block table)", __FILE__, __LINE__);
    }
    l.lastUse = clock;
    layouts.push_back(std::move(l));
    lastFound = layouts.size() - 1;
    *out = &layouts.back();
    return Status::ok();
  }
};

Status CudaRuntimeOps::trustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                                  const size_t* segments, size_t numSegments,
                                  CudaTrustScratch& scratch, int device) {
  if (args.numel == 0) {
    return Status::ok();
  }
  if (!scratch.impl) {
    scratch.impl = std::make_unique<TrustState>();
  }
  // Only this half makes a scratch's state.
  TrustState& sc = static_cast<TrustState&>(*scratch.impl);
  if (sc.device != device) {
    sc.release();
    sc.device = device;
  }
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const TrustLayout* layout = nullptr;
  BAGUA_RETURN_IF_ERROR(
      sc.layoutFor(segments, numSegments, static_cast<cudaStream_t>(args.stream), &layout));
  const size_t nb = layout->numBlocks;
  const size_t es = args.storage == StorageType::kF64 ? 8 : 4;
  BAGUA_RETURN_IF_ERROR(TrustState::grow(&sc.u, &sc.uBytes, args.numel * es));
  BAGUA_RETURN_IF_ERROR(TrustState::grow(&sc.partials, &sc.partialsBytes, nb * 2 * sizeof(double)));
  BAGUA_RETURN_IF_ERROR(TrustState::grow(&sc.trust, &sc.trustBytes, nb * sizeof(double)));
  auto* partials = static_cast<double*>(sc.partials);
  auto* trust = static_cast<double*>(sc.trust);
  // Four launches in stream order, no host wait: states and u; per-block norms; per-tensor sums
  // and trust factor on the device; apply.
  int err = cudakernels::trustUpdate(ruleId, scalars, args, sc.u);
  if (err == 0) {
    err = cudakernels::trustNorms(args, sc.u, layout->blocks(), nb, partials);
  }
  if (err == 0) {
    err = cudakernels::trustFactors(ruleId, scalars, args.storage, layout->segFirst(), numSegments,
                                    partials, trust, args.stream);
  }
  if (err == 0) {
    err = cudakernels::trustApply(ruleId, scalars, args, sc.u, layout->blocks(), trust, nb);
  }
  if (err != 0) {
    return cudaStatus(static_cast<cudaError_t>(err),
                      strPrintf("trust-ratio kernels (rule %d, %zu elements, %zu tensors)", ruleId,
                                args.numel, numSegments),
                      __FILE__, __LINE__);
  }
  return Status::ok();
}

Status CudaRuntimeOps::createStream(int device, void** stream) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  cudaStream_t s = nullptr;
  BAGUA_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return Status::ok();
}

void CudaRuntimeOps::destroyStream(int device, void* stream) {
  if (stream != nullptr && cudaSetDevice(device) == cudaSuccess) {
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
}

Status CudaRuntimeOps::streamAfter(int device, void* waiter, void* signaller) {
  if (waiter == signaller) {
    return Status::ok();
  }
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  // An event per call: recorded, waited for, destroyed (CUDA frees it once the wait is done).
  cudaEvent_t e = nullptr;
  BAGUA_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(e, static_cast<cudaStream_t>(signaller));
  if (err == cudaSuccess) {
    err = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0);
  }
  cudaEventDestroy(e);
  return BAGUA_CUDA_STATUS(err);
}

Status CudaRuntimeOps::nonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const int err = cudakernels::nonFinite(args, deviceFlag, found);
  if (err != 0) {
    return cudaStatus(static_cast<cudaError_t>(err),
                      strPrintf("optimizer inf/NaN check (%zu elements)", args.numel), __FILE__,
                      __LINE__);
  }
  return Status::ok();
}

// Registers at load time: before main() where the CUDA half is linked in, during dlopen() where
// the optimizer loads it (cudaOps()).
[[maybe_unused]] const bool kRegistered = [] {
  static CudaRuntimeOps ops;
  registerCudaOps(&ops);
  return true;
}();

}  // namespace

}  // namespace bagua::optim::detail
