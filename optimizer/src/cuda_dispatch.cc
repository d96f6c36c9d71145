// bagua/optimizer/cuda.h in the CPU library: every call goes to the CUDA half (cuda_ops.h),
// loaded on the first one.
#include "bagua/base/cuda_half.h"
#include "bagua/optimizer/cuda.h"
#include "cuda_ops.h"

namespace bagua::optim {

namespace detail {

namespace {

// Constant-initialised, so the CUDA half's static initializer may register before any of the
// optimizer's own run.
constinit CudaHalf<CudaOps> half;

const CudaHalfSpec kSpec{
    .what = "the CUDA path of libbagua_optimizer",
    .soname = BAGUA_OPTIM_CUDA_SONAME,
    .library = "libbagua_optimizer",
    .links = BAGUA_OPTIM_CUDA_LINKS,
    .needs = BAGUA_OPTIM_CUDA_NEEDS,
    .configure = "-Dcuda=enabled on a machine with nvcc",
    .instead = "keep the parameters on the CPU",
    .anchor = reinterpret_cast<const void*>(&registerCudaOps),
};

}  // namespace

void registerCudaOps(CudaOps* ops) {
  half.set(ops);
}

CudaOps* registeredCudaOps() {
  return half.registered();
}

Result<CudaOps*> cudaOps() {
  return half.get(kSpec);
}

}  // namespace detail

bool cudaKernelsAvailable() {
  return detail::cudaOps().isOk();
}

Status cudaAllocZeroed(int device, size_t bytes, void** out) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->allocZeroed(device, bytes, out);
}

void cudaRelease(int device, void* ptr) {
  // Device memory exists only once the CUDA half allocated it.
  if (detail::CudaOps* ops = detail::registeredCudaOps()) {
    ops->release(device, ptr);
  }
}

Status cudaCopy(int device, void* dst, const void* src, size_t bytes, int kind) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->copy(device, dst, src, bytes, kind);
}

Status cudaZero(int device, void* ptr, size_t bytes) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->zero(device, ptr, bytes);
}

Status cudaElementwise(int ruleId, const void* scalars, const KernelArgs& args, int device) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->elementwise(ruleId, scalars, args, device);
}

CudaTrustScratch::CudaTrustScratch() = default;
CudaTrustScratch::~CudaTrustScratch() = default;

Status cudaTrustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                      const size_t* segments, size_t numSegments, CudaTrustScratch& scratch,
                      int device) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->trustRatio(ruleId, scalars, args, segments, numSegments, scratch, device);
}

Status cudaCreateStream(int device, void** stream) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->createStream(device, stream);
}

void cudaDestroyStream(int device, void* stream) {
  if (detail::CudaOps* ops = detail::registeredCudaOps()) {
    ops->destroyStream(device, stream);
  }
}

Status cudaStreamAfter(int device, void* waiter, void* signaller) {
  if (waiter == signaller) {
    return Status::ok();
  }
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->streamAfter(device, waiter, signaller);
}

Status cudaNonFinite(const KernelArgs& args, int device, int* deviceFlag, bool* found) {
  BAGUA_ASSIGN_OR_RETURN(detail::CudaOps * ops, detail::cudaOps());
  return ops->nonFinite(args, device, deviceFlag, found);
}

}  // namespace bagua::optim
