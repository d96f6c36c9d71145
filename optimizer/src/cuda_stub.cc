// Built without CUDA: the GPU kernels are absent and say so.
#include "bagua/optimizer/cuda.h"

namespace bagua::optim {

namespace {
Status absent() {
  return BAGUA_ERROR(kFailedPrecondition,
                     "optimizer CUDA kernels: bagua was built without CUDA (configure with "
                     "-Dcuda=enabled on a machine with nvcc)");
}
}  // namespace

bool cudaKernelsAvailable() {
  return false;
}
Status cudaAllocZeroed(int /*device*/, size_t /*bytes*/, void** /*out*/) {
  return absent();
}
void cudaRelease(int /*device*/, void* /*ptr*/) {}
Status cudaCopy(int /*device*/, void* /*dst*/, const void* /*src*/, size_t /*bytes*/,
                int /*kind*/) {
  return absent();
}
Status cudaZero(int /*device*/, void* /*ptr*/, size_t /*bytes*/) {
  return absent();
}
Status cudaElementwise(int /*ruleId*/, const void* /*scalars*/, const KernelArgs& /*args*/,
                       int /*device*/) {
  return absent();
}
struct CudaTrustScratch::Impl {};
CudaTrustScratch::CudaTrustScratch() = default;
CudaTrustScratch::~CudaTrustScratch() = default;
Status cudaTrustRatio(int /*ruleId*/, const void* /*scalars*/, const KernelArgs& /*args*/,
                      const size_t* /*segments*/, size_t /*numSegments*/,
                      CudaTrustScratch& /*scratch*/, int /*device*/) {
  return absent();
}
Status cudaNonFinite(const KernelArgs& /*args*/, int /*device*/, int* /*deviceFlag*/,
                     bool* /*found*/) {
  return absent();
}
Status cudaCreateStream(int /*device*/, void** /*stream*/) {
  return absent();
}
void cudaDestroyStream(int /*device*/, void* /*stream*/) {}
Status cudaStreamAfter(int /*device*/, void* /*waiter*/, void* /*signaller*/) {
  return absent();
}

}  // namespace bagua::optim
