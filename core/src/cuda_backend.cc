#include "cuda_backend.h"

#include "bagua/base/cuda_half.h"

namespace bagua::core {

namespace {

// Constant-initialised, so a static initializer of the CUDA half may register before any of
// core's own run.
constinit CudaHalf<CudaBackend> half;

const CudaHalfSpec kSpec{
    .what = "the NCCL backend",
    .soname = BAGUA_CORE_CUDA_SONAME,
    .library = "libbagua_core",
    .links = BAGUA_CORE_CUDA_LINKS,
    .needs = BAGUA_CORE_CUDA_NEEDS,
    .configure = "-Dcuda=enabled -Dnccl=enabled",
    .instead = "use the host backend",
    .anchor = reinterpret_cast<const void*>(&registerCudaBackend),
};

}  // namespace

void registerCudaBackend(CudaBackend* backend) {
  half.set(backend);
}

CudaBackend* registeredCudaBackend() {
  return half.registered();
}

Result<CudaBackend*> cudaBackend() {
  return half.get(kSpec);
}

}  // namespace bagua::core
