// Plain entry points of the CUDA optimizer kernels (compiled by nvcc, called from cuda_ops.cc).
// Return a cudaError_t value. Private.
#pragma once

#include "bagua/optimizer/kernel_args.h"

namespace bagua::optim::cudakernels {

int elementwise(int ruleId, const void* scalars, const KernelArgs& args);
int nonFinite(const KernelArgs& args, int* deviceFlag, bool* found);
const char* errorString(int error);

}  // namespace bagua::optim::cudakernels
