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
// Sets *found when any grad * invScale is inf or NaN.
Status cudaNonFinite(const KernelArgs& args, int device, bool* found);

}  // namespace bagua::optim
