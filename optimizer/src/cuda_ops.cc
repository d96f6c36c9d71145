// Host side of the CUDA optimizer: device memory helpers and Status mapping around the kernels
// in cuda/optimizer_kernels.cu.
#include <cuda_runtime.h>

#include <vector>

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

namespace {

// Device memory released at scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr != nullptr) {
      cudaFree(ptr);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status alloc(size_t bytes) { return cudaStatus(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
};

constexpr size_t kNormBlock = 4096;  // as detail::kNormBlock in elementwise.h

}  // namespace

Status cudaTrustRatio(int ruleId, const void* scalars, const KernelArgs& args,
                      const size_t* segments, size_t numSegments, TrustFn trust, int device) {
  if (args.numel == 0) {
    return Status::ok();
  }
  BAGUA_RETURN_IF_ERROR(onDevice(device));
  std::vector<cudakernels::NormBlock> blocks;
  std::vector<size_t> segOfBlock;
  size_t start = 0;
  for (size_t s = 0; s < numSegments; ++s) {
    for (size_t b = start; b < start + segments[s]; b += kNormBlock) {
      const size_t e = b + kNormBlock < start + segments[s] ? b + kNormBlock : start + segments[s];
      blocks.push_back({b, e});
      segOfBlock.push_back(s);
    }
    start += segments[s];
  }
  const size_t es = args.storage == StorageType::kF64 ? 8 : 4;
  DeviceBuffer u, dblocks, partials, dtrust;
  BAGUA_RETURN_IF_ERROR(u.alloc(args.numel * es));
  BAGUA_RETURN_IF_ERROR(dblocks.alloc(blocks.size() * sizeof(cudakernels::NormBlock)));
  BAGUA_RETURN_IF_ERROR(partials.alloc(blocks.size() * 2 * sizeof(double)));
  BAGUA_RETURN_IF_ERROR(dtrust.alloc(blocks.size() * sizeof(double)));
  BAGUA_RETURN_IF_ERROR(
      cudaStatus(cudaMemcpy(dblocks.ptr, blocks.data(),
                            blocks.size() * sizeof(cudakernels::NormBlock), cudaMemcpyHostToDevice),
                 "cudaMemcpy"));
  int err = cudakernels::trustUpdate(ruleId, scalars, args, u.ptr);
  if (err == 0) {
    err = cudakernels::trustNorms(args, u.ptr, static_cast<cudakernels::NormBlock*>(dblocks.ptr),
                                  blocks.size(), static_cast<double*>(partials.ptr));
  }
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "trust-ratio kernels (%zu elements): %s", args.numel,
                       cudakernels::errorString(err));
  }
  std::vector<double> host(blocks.size() * 2);
  BAGUA_RETURN_IF_ERROR(cudaStatus(
      cudaMemcpy(host.data(), partials.ptr, host.size() * sizeof(double), cudaMemcpyDeviceToHost),
      "cudaMemcpy"));
  // Per tensor, block sums added in block order (as the CPU path does).
  std::vector<double> pn(numSegments, 0.0), un(numSegments, 0.0);
  for (size_t b = 0; b < blocks.size(); ++b) {
    pn[segOfBlock[b]] += host[2 * b];
    un[segOfBlock[b]] += host[2 * b + 1];
  }
  std::vector<double> perBlock(blocks.size());
  std::vector<double> perSeg(numSegments);
  for (size_t s = 0; s < numSegments; ++s) {
    perSeg[s] = trust(scalars, pn[s], un[s]);
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    perBlock[b] = perSeg[segOfBlock[b]];
  }
  BAGUA_RETURN_IF_ERROR(
      cudaStatus(cudaMemcpy(dtrust.ptr, perBlock.data(), perBlock.size() * sizeof(double),
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy"));
  err = cudakernels::trustApply(ruleId, scalars, args, u.ptr,
                                static_cast<cudakernels::NormBlock*>(dblocks.ptr),
                                static_cast<double*>(dtrust.ptr), blocks.size());
  if (err == 0) {
    err = static_cast<int>(cudaStreamSynchronize(nullptr));
  }
  if (err != 0) {
    return BAGUA_ERROR(kCudaError, "trust-ratio apply (%zu elements): %s", args.numel,
                       cudakernels::errorString(err));
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
