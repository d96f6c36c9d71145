// The loader's CUDA half (cuda_host.h): CUDA's pinned host memory, registered with the loader
// when this library is loaded (or, linked statically, before main()).
#include <cuda_runtime_api.h>

#include "cuda_host.h"

namespace bagua::loader::detail {

namespace {

class CudaPinnedAllocator final : public HostAllocator {
 public:
  Result<void*> allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error
      return BAGUA_ERROR(kCudaError, "cudaHostAlloc of %zu bytes: %s", bytes,
                         cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* p, size_t /*bytes*/) override { cudaFreeHost(p); }
  bool pinned() const override { return true; }
  const char* name() const override { return "cudaHostAlloc"; }
};

class CudaRuntimeHost final : public CudaHost {
 public:
  HostAllocator* pinnedAllocator(std::string* why) override {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e == cudaSuccess && devices > 0) {
      static CudaPinnedAllocator cuda;
      return &cuda;
    }
    cudaGetLastError();
    *why = e == cudaSuccess ? "none visible" : cudaGetErrorString(e);
    return nullptr;
  }
};

// Registers at load time: before main() where the CUDA half is linked in, during dlopen() where
// the loader loads it (cudaHost()).
[[maybe_unused]] const bool kRegistered = [] {
  static CudaRuntimeHost host;
  registerCudaHost(&host);
  return true;
}();

}  // namespace

}  // namespace bagua::loader::detail
