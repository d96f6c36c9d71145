// CUDA side of the optimizer: device memory helpers and one-launch kernels over a whole range
// (the built-in rules with kCudaId >= 0). Built from src/cuda/*.cu when bagua is configured with
// CUDA; otherwise every call fails with FailedPrecondition and cudaKernelsAvailable() is false.
//
// Ordering: every call is stream-ordered on KernelArgs::stream (null, the default: the legacy
// default stream) of the range's device (made current first). cudaElementwise only enqueues (no
// synchronisation: back-to-back steps pipeline on the GPU, and a kernel fault surfaces at the next
// synchronising call); cudaNonFinite returns the flag, so it waits for its kernel; cudaTrustRatio
// only enqueues (its norms and trust factors are computed on the device). Work the trainer enqueues
// on the default stream (or on blocking streams) after a step sees the step's results; non-blocking
// streams must synchronise first. Thread safety: one thread per optimizer (the scratch below is not
// shared).
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
// Trust-ratio rules (LAMB) over a range of `numSegments` tensors, four stream-ordered launches
// and no host wait: pass 1 computes the states and the update u; the per-tensor sums of w^2 and
// u^2 are taken in double over 4096-element blocks from each tensor's start, one GPU thread per
// block in element order; one GPU thread per tensor adds its blocks' sums in block order and
// turns them into the rule's trust factor (Rule::trust compiled for the device); pass 2 applies
// it. Same order and operations as the CPU kernel, so the norms and the factor are the same bits.
// `ruleId` must be a trust-ratio kCudaId the kernels know (LambRule's).
// `scratch` keeps the device buffers between calls (grown as needed) and each range's block
// layout (cut and uploaded with an async copy the first time a layout is seen, then found by its
// tensor sizes), so a steady-state step allocates and copies nothing.
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
                      const size_t* segments, size_t numSegments, CudaTrustScratch& scratch,
                      int device);
// Streams for stepping inside the backward pass: a non-blocking stream of `device`; and
// `waiter` runs its later work after everything enqueued on `signaller` so far (an event, no
// host wait; null: the legacy default stream).
Status cudaCreateStream(int device, void** stream);
void cudaDestroyStream(int device, void* stream);
Status cudaStreamAfter(int device, void* waiter, void* signaller);
// Sets *found when any grad * invScale is inf or NaN. `deviceFlag` is one int of device memory
// on `device`, owned by the caller and reused across calls.
Status cudaNonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found);

}  // namespace bagua::optim
