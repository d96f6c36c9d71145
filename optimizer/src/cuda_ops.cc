// Host side of the CUDA optimizer: device memory helpers and Status mapping around the kernels
// in cuda/optimizer_kernels.cu.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "bagua/optimizer/cuda.h"
#include "cuda/optimizer_kernels.h"

namespace bagua::optim {

namespace {

Status cudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) {
    return Status::ok();
  }
  return BAGUA_ERROR(kCudaError, "%s: %s", what, cudaGetErrorString(err));
}

// Makes `device` current; cudaSetDevice only when it is not (a step stays a few API calls).
Status onDevice(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == device) {
    return Status::ok();
  }
  return cudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

}  // namespace

bool cudaKernelsAvailable() {
  return true;
}

Status cudaAllocZeroed(int device, size_t bytes, void** out) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  BAGUA_RETURN_IF_ERROR(cudaStatus(cudaMalloc(out, bytes), "cudaMalloc"));
  return cudaStatus(cudaMemset(*out, 0, bytes), "cudaMemset");
}

void cudaRelease(int device, void* ptr) {
  if (ptr != nullptr && cudaSetDevice(device) == cudaSuccess) {
    cudaFree(ptr);
  }
}

Status cudaCopy(int device, void* dst, const void* src, size_t bytes, int kind) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const cudaMemcpyKind k = kind == 0   ? cudaMemcpyDeviceToDevice
                           : kind == 1 ? cudaMemcpyHostToDevice
                                       : cudaMemcpyDeviceToHost;
  return cudaStatus(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy");
}

Status cudaZero(int device, void* ptr, size_t bytes) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  return cudaStatus(cudaMemset(ptr, 0, bytes), "cudaMemset");
}

Status cudaElementwise(int ruleId, const void* scalars, const KernelArgs& args, int device) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const int err = cudakernels::elementwise(ruleId, scalars, args);
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "optimizer kernel (rule %d, %zu elements): %s", ruleId,
                       args.numel, cudakernels::errorString(err));
  }
  return Status::ok();
}

struct CudaTrustScratch::Impl {
  int device = -1;
  // Device buffers, grown as needed.
  void* u = nullptr;
  void* blocks = nullptr;
  void* partials = nullptr;
  void* trust = nullptr;
  size_t uBytes = 0, blocksBytes = 0, partialsBytes = 0, trustBytes = 0;
  // Host side: the block table (and what was last uploaded), sums and factors.
  std::vector<cudakernels::NormBlock> table, uploaded;
  std::vector<size_t> segOfBlock;
  std::vector<double> host, pn, un, perBlock;

  ~Impl() { release(); }
  void release() {
    if (device >= 0 && cudaSetDevice(device) == cudaSuccess) {
      for (void* p : {u, blocks, partials, trust}) {
        if (p != nullptr) {
          cudaFree(p);
        }
      }
    }
    u = blocks = partials = trust = nullptr;
    uBytes = blocksBytes = partialsBytes = trustBytes = 0;
    uploaded.clear();
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
    BAGUA_RETURN_IF_ERROR(cudaStatus(cudaMalloc(p, need), "cudaMalloc"));
    *have = need;
    return Status::ok();
  }
};

CudaTrustScratch::CudaTrustScratch() = default;
CudaTrustScratch::~CudaTrustScratch() = default;

Status cudaTrustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                      const size_t* segments, size_t numSegments, TrustFn trust,
                      CudaTrustScratch& scratch, int device) {
  if (args.numel == 0) {
    return Status::ok();
  }
  if (!scratch.impl) {
    scratch.impl = std::make_unique<CudaTrustScratch::Impl>();
  }
  CudaTrustScratch::Impl& sc = *scratch.impl;
  if (sc.device != device) {
    sc.release();
    sc.device = device;
  }
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  sc.table.clear();
  sc.segOfBlock.clear();
  forEachNormBlock(segments, numSegments, [&](size_t s, size_t b, size_t e) {
    sc.table.push_back({b, e});
    sc.segOfBlock.push_back(s);
  });
  const size_t nb = sc.table.size();
  const size_t es = args.storage == StorageType::kF64 ? 8 : 4;
  BAGUA_RETURN_IF_ERROR(CudaTrustScratch::Impl::grow(&sc.u, &sc.uBytes, args.numel * es));
  BAGUA_RETURN_IF_ERROR(CudaTrustScratch::Impl::grow(&sc.blocks, &sc.blocksBytes,
                                                     nb * sizeof(cudakernels::NormBlock)));
  BAGUA_RETURN_IF_ERROR(
      CudaTrustScratch::Impl::grow(&sc.partials, &sc.partialsBytes, nb * 2 * sizeof(double)));
  BAGUA_RETURN_IF_ERROR(
      CudaTrustScratch::Impl::grow(&sc.trust, &sc.trustBytes, nb * sizeof(double)));
  const bool same =
      sc.uploaded.size() == nb &&
      std::memcmp(sc.uploaded.data(), sc.table.data(), nb * sizeof(cudakernels::NormBlock)) == 0;
  if (!same) {
    sc.uploaded.clear();  // stale until the copy succeeds
    BAGUA_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpy(sc.blocks, sc.table.data(), nb * sizeof(cudakernels::NormBlock),
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy"));
    sc.uploaded = sc.table;
  }
  auto* dblocks = static_cast<cudakernels::NormBlock*>(sc.blocks);
  int err = cudakernels::trustUpdate(ruleId, scalars, args, sc.u);
  if (err == 0) {
    err = cudakernels::trustNorms(args, sc.u, dblocks, nb, static_cast<double*>(sc.partials));
  }
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "trust-ratio kernels (%zu elements): %s", args.numel,
                       cudakernels::errorString(err));
  }
  sc.host.resize(nb * 2);
  BAGUA_RETURN_IF_ERROR(
      cudaStatus(cudaMemcpy(sc.host.data(), sc.partials, sc.host.size() * sizeof(double),
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy"));
  // Per tensor, block sums added in block order (as the CPU path does).
  sc.pn.assign(numSegments, 0.0);
  sc.un.assign(numSegments, 0.0);
  for (size_t b = 0; b < nb; ++b) {
    sc.pn[sc.segOfBlock[b]] += sc.host[2 * b];
    sc.un[sc.segOfBlock[b]] += sc.host[2 * b + 1];
  }
  for (size_t s = 0; s < numSegments; ++s) {
    sc.pn[s] = trust(scalars, sc.pn[s], sc.un[s]);  // pn now holds the factor
  }
  sc.perBlock.resize(nb);
  for (size_t b = 0; b < nb; ++b) {
    sc.perBlock[b] = sc.pn[sc.segOfBlock[b]];
  }
  BAGUA_RETURN_IF_ERROR(cudaStatus(
      cudaMemcpy(sc.trust, sc.perBlock.data(), nb * sizeof(double), cudaMemcpyHostToDevice),
      "cudaMemcpy"));
  err = cudakernels::trustApply(ruleId, scalars, args, sc.u, dblocks,
                                static_cast<double*>(sc.trust), nb);
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "trust-ratio apply (%zu elements): %s", args.numel,
                       cudakernels::errorString(err));
  }
  return Status::ok();
}

Status cudaNonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const int err = cudakernels::nonFinite(args, deviceFlag, found);
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "optimizer inf/NaN check (%zu elements): %s", args.numel,
                       cudakernels::errorString(err));
  }
  return Status::ok();
}

}  // namespace bagua::optim
