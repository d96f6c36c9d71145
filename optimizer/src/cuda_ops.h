// The seam between the optimizer and its CUDA half (optimizer-private).
//
// libbagua_optimizer holds everything a CPU-only program needs and neither links nor includes
// CUDA. The CUDA half, libbagua_optimizer_cuda (cuda_ops.cc and the kernels of
// src/cuda/optimizer_kernels.cu), implements CudaOps and registers it from a static initializer;
// bagua/optimizer/cuda.h's functions (cuda_dispatch.cc) reach it through cudaOps(), which loads
// the shared half by its SONAME the first time a CUDA call is made (bagua/base/cuda_half.h: the
// one loading mechanism every bagua library shares). Host tensors never load it.
//
// Each call is cuda.h's function of the same name (see there for ordering and errors), with the
// device already checked by the caller of cuda.h.
//
// Thread safety: as cuda.h.
#pragma once

#include <cstddef>

#include "bagua/base/status.h"
#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/kernel_args.h"

namespace bagua::optim {

// CudaTrustScratch's state: the CUDA half derives its device buffers and layouts from it, so the
// CPU library can own (and destroy) a scratch it never looks into.
struct CudaTrustScratch::Impl {
  virtual ~Impl() = default;
};

namespace detail {

class CudaOps {
 public:
  virtual ~CudaOps() = default;
  virtual Status allocZeroed(int device, size_t bytes, void** out) = 0;
  virtual void release(int device, void* ptr) = 0;
  virtual Status copy(int device, void* dst, const void* src, size_t bytes, int kind) = 0;
  virtual Status zero(int device, void* ptr, size_t bytes) = 0;
  virtual Status elementwise(int ruleId, const void* scalars, const KernelArgs& args,
                             int device) = 0;
  virtual Status trustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                            const size_t* segments, size_t numSegments, CudaTrustScratch& scratch,
                            int device) = 0;
  virtual Status createStream(int device, void** stream) = 0;
  virtual void destroyStream(int device, void* stream) = 0;
  virtual Status streamAfter(int device, void* waiter, void* signaller) = 0;
  virtual Status nonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found) = 0;
};

// Called once by the CUDA half (a later call replaces the pointer).
void registerCudaOps(CudaOps* ops);

// The registered half, or null: for paths that run only once it is in use (releasing what it
// allocated).
CudaOps* registeredCudaOps();

// The CUDA half, loading libbagua_optimizer_cuda when it is not registered yet; the error says
// what is missing and how to get it (kFailedPrecondition).
Result<CudaOps*> cudaOps();

}  // namespace detail

}  // namespace bagua::optim
