// CUDA side of the optimizer: device memory helpers and one-launch kernels over a whole range
// (the built-in rules with kCudaId >= 0). Built from src/cuda/*.cu when bagua is configured with
// CUDA; otherwise every call fails with FailedPrecondition and cudaKernelsAvailable() is false.
//
// Ordering: every call is stream-ordered on the legacy default stream of the range's device (made
// current first). cudaElementwise only enqueues (no synchronisation: back-to-back steps pipeline on
// the GPU, and a kernel fault surfaces at the next synchronising call); cudaNonFinite returns the
// flag, so it waits for its kernel; cudaTrustRatio reads the per-block norms back, so it waits
// for pass 1 and enqueues pass 2. Work the trainer enqueues on the default stream (or on blocking
// streams) after a step sees the step's results; non-blocking streams must synchronise first.
// Thread safety: one thread per optimizer (the scratch below is not shared).
#pragma once

#include <cstddef>
#include <memory>

#include "bagua/base/status.h"
#include "bagua/optimizer/kernel_args.h"

namespace bagua::optim {

bool cudaKernelsAvailable();

Status cudaAllocZeroed(int device, size_t bytes, void** out);
void cudaRelease(int device, void* ptr);
// kind: 0 device->device, 1 host->device, 2 device->host.
Status cudaCopy(int device, void* dst, const void* src, size_t bytes, int kind);
Status cudaZero(int device, void* ptr, size_t bytes);

// One launch of rule `ruleId` over args.numel elements; `scalars` is Rule::Scalars<float> (or
// <double> for f64 storage).
Status cudaElementwise(int ruleId, const void* scalars, const KernelArgs& args, int device);
// Trust-ratio rules (LAMB) over a range of `numSegments` tensors: pass 1 computes the states and
// the update u on the GPU; the per-tensor sums of w^2 and u^2 are taken in double over 4096-element
// blocks from each tensor's start, one GPU thread per block in element order, and added up block
// by block on the host (the CPU kernel's order, so the norms are the same bits); `trust` turns
// them into the per-tensor factor on the host; pass 2 applies it.
// `scratch` keeps the device buffers and the block table between calls (grown as needed, the
// block table uploaded again only when the segments change), so a step allocates nothing.
using TrustFn = double (*)(const void* scalars, double pNormSq, double uNormSq);
class CudaTrustScratch {
 public:
  CudaTrustScratch();
  ~CudaTrustScratch();
  CudaTrustScratch(const CudaTrustScratch&) = delete;
  CudaTrustScratch& operator=(const CudaTrustScratch&) = delete;
  struct Impl;
  std::unique_ptr<Impl> impl;
};
Status cudaTrustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                      const size_t* segments, size_t numSegments, TrustFn trust,
                      CudaTrustScratch& scratch, int device);
// Sets *found when any grad * invScale is inf or NaN. `deviceFlag` is one int of device memory
// on `device`, owned by the caller and reused across calls.
Status cudaNonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found);

}  // namespace bagua::optim
