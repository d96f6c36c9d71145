// CUDA side of the optimizer: device memory helpers and one-launch kernels over a whole range
// (the built-in rules with kCudaId >= 0). Built from src/cuda/*.cu when bagua is configured with
// CUDA; otherwise every call fails with FailedPrecondition and cudaKernelsAvailable() is false.
//
// Thread safety: calls are stream-ordered on the default stream of the calling thread's current
// device (set to the range's device first) and synchronous: they return after the kernel ran.
#pragma once

#include <cstddef>

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
using TrustFn = double (*)(const void* scalars, double pNormSq, double uNormSq);
Status cudaTrustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                      const size_t* segments, size_t numSegments, TrustFn trust, int device);
// Sets *found when any grad * invScale is inf or NaN.
Status cudaNonFinite(const KernelArgs& args, int device, bool* found);

}  // namespace bagua::optim
