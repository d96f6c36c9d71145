// Host side of the CUDA optimizer: device memory helpers and Status mapping around the kernels
// in cuda/optimizer_kernels.cu.
#include <cuda_runtime.h>

#include "bagua/optimizer/cuda.h"
#include "cuda/optimizer_kernels.h"

namespace bagua::optim {

namespace {

Status cudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) {
    return Status::ok();
  }
  return BAGUA_ERROR(kCudaError, "%s: %s", what, cudaGetErrorString(err));
}

Status onDevice(int device) {
  return cudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

}  // namespace

bool cudaKernelsAvailable() {
  return true;
}

Status cudaAllocZeroed(int device, size_t bytes, void** out) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  BAGUA_RETURN_IF_ERROR(cudaStatus(cudaMalloc(out, bytes), "cudaMalloc"));
  return cudaStatus(cudaMemset(*out, 0, bytes), "cudaMemset");
}

void cudaRelease(int device, void* ptr) {
  if (ptr != nullptr && cudaSetDevice(device) == cudaSuccess) {
    cudaFree(ptr);
  }
}

Status cudaCopy(int device, void* dst, const void* src, size_t bytes, int kind) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const cudaMemcpyKind k = kind == 0   ? cudaMemcpyDeviceToDevice
                           : kind == 1 ? cudaMemcpyHostToDevice
                                       : cudaMemcpyDeviceToHost;
  return cudaStatus(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy");
}

Status cudaZero(int device, void* ptr, size_t bytes) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  return cudaStatus(cudaMemset(ptr, 0, bytes), "cudaMemset");
}

Status cudaElementwise(int ruleId, const void* scalars, const KernelArgs& args, int device) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  const int err = cudakernels::elementwise(ruleId, scalars, args);
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "optimizer kernel (rule %d, %zu elements): %s", ruleId,
                       args.numel, cudakernels::errorString(err));
  }
  return Status::ok();
}

Status cudaNonFinite(const KernelArgs& args, int device, bool* found) {
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  void* flag = nullptr;
  BAGUA_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&flag, sizeof(int)), "cudaMalloc"));
  const int err = cudakernels::nonFinite(args, static_cast<int*>(flag), found);
  cudaFree(flag);
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "optimizer inf/NaN check (%zu elements): %s", args.numel,
                       cudakernels::errorString(err));
  }
  return Status::ok();
}

}  // namespace bagua::optim
