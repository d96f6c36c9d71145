// Plain entry points of the CUDA optimizer kernels (compiled by nvcc, called from cuda_ops.cc).
// Return a cudaError_t value. Launches go to KernelArgs::stream (or `stream`). Private.
#pragma once

#include "bagua/optimizer/kernel_args.h"

namespace bagua::optim::cudakernels {

int elementwise(int ruleId, const void* scalars, const KernelArgs& args);
// Norm blocks of a trust-ratio range: [begin, end) element ranges, each inside one tensor.
struct NormBlock {
  size_t begin;
  size_t end;
};
// Pass 1: states and u (T = float, or double for f64 storage) for every element.
int trustUpdate(int ruleId, const void* scalars, const KernelArgs& args, void* u);
// Per block: partials[2b] = sum of w^2, partials[2b+1] = sum of u^2, in double, in element order.
int trustNorms(const KernelArgs& args, const void* u, const NormBlock* blocks, size_t numBlocks,
               double* partials);
// Per tensor s: the sums of its blocks' partials [segFirst[s], segFirst[s+1]) in block order,
// the rule's trust factor (scalars: Scalars<double> for kF64 storage, else Scalars<float>), written
// to trust[b] for each of its blocks. segFirst has numSegments + 1 entries. Device only.
int trustFactors(int ruleId, const void* scalars, StorageType storage, const size_t* segFirst,
                 size_t numSegments, const double* partials, double* trust, void* stream);
// Pass 2: p = applyTrust(p, u, trust[block]) for every block.
int trustApply(int ruleId, const void* scalars, const KernelArgs& args, const void* u,
               const NormBlock* blocks, const double* trust, size_t numBlocks);
int nonFinite(const KernelArgs& args, int* deviceFlag, bool* found);

}  // namespace bagua::optim::cudakernels
