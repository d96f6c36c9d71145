#include "cuda_kernels.h"

#include "bagua/base/cuda_half.h"

namespace bagua::algo::detail {

namespace {

// Constant-initialised, so the CUDA half's static initializer may register before any of
// algorithms' own run.
constinit CudaHalf<CudaKernels> half;

const CudaHalfSpec kSpec{
    .what = "the CUDA path of libbagua_algorithms",
    .soname = BAGUA_ALGO_CUDA_SONAME,
    .library = "libbagua_algorithms",
    .links = BAGUA_ALGO_CUDA_LINKS,
    .needs = BAGUA_ALGO_CUDA_NEEDS,
    .configure = "-Dcuda=enabled on a machine with nvcc",
    .instead = "keep the tensors on the CPU (host backend)",
    .anchor = reinterpret_cast<const void*>(&registerCudaKernels),
};

}  // namespace

void registerCudaKernels(CudaKernels* kernels) {
  half.set(kernels);
}

CudaKernels* registeredCudaKernels() {
  return half.registered();
}

Result<CudaKernels*> cudaKernels() {
  return half.get(kSpec);
}

}  // namespace bagua::algo::detail
