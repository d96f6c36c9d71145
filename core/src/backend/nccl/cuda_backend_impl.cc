// The CUDA half's CudaBackend (cuda_backend.h): the NCCL communicator and the CUDA runtime calls
// of the reducer's device buckets, registered with core when this library is loaded.
#include <cuda_runtime.h>

#include "backend/nccl/nccl_communicator.h"
#include "bagua/base/cuda_check.h"
#include "cuda_backend.h"

namespace bagua::core::nccl {

namespace {

class CudaRuntimeBackend final : public CudaBackend {
 public:
  Result<std::unique_ptr<Communicator>> createNcclCommunicator(
      Store& store, int rank, int size, const ProcessGroupOptions& options) override {
    return nccl::createNcclCommunicator(store, rank, size, options);
  }
  Status setDevice(int device) override { return BAGUA_CUDA_STATUS(cudaSetDevice(device)); }
  Result<void*> malloc(size_t bytes) override {
    void* p = nullptr;
    BAGUA_CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
  }
  void free(void* p) override {
    if (p != nullptr) {
      cudaFree(p);
    }
  }
  Result<CUevent_st*> createEvent() override {
    cudaEvent_t ev = nullptr;
    BAGUA_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return ev;
  }
  void destroyEvent(CUevent_st* ev) override {
    if (ev != nullptr) {
      cudaEventDestroy(ev);
    }
  }
  Status recordEvent(CUevent_st* ev, CUstream_st* stream) override {
    return BAGUA_CUDA_STATUS(cudaEventRecord(ev, stream));
  }
  Result<bool> queryEvent(CUevent_st* ev) override {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) {
      return true;
    }
    if (e == cudaErrorNotReady) {
      return false;
    }
    return cudaStatus(e, "cudaEventQuery", __FILE__, __LINE__);
  }
  Status copyAsync(void* dst, const void* src, size_t bytes, CUstream_st* stream) override {
    return BAGUA_CUDA_STATUS(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  Status zeroAsync(void* dst, size_t bytes, CUstream_st* stream) override {
    return BAGUA_CUDA_STATUS(cudaMemsetAsync(dst, 0, bytes, stream));
  }
  Status copyToDevice(void* dst, const void* src, size_t bytes) override {
    return BAGUA_CUDA_STATUS(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  Status copyToHost(void* dst, const void* src, size_t bytes) override {
    return BAGUA_CUDA_STATUS(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  Status synchronizeDefaultStream() override {
    return BAGUA_CUDA_STATUS(cudaStreamSynchronize(nullptr));
  }
};

// Registers at load time: before main() where the CUDA half is linked in, during dlopen() where
// core loads it (cudaBackend()).
[[maybe_unused]] const bool kRegistered = [] {
  static CudaRuntimeBackend backend;
  registerCudaBackend(&backend);
  return true;
}();

}  // namespace

}  // namespace bagua::core::nccl
