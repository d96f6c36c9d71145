// The seam between core and its CUDA half (core-private).
//
// libbagua_core holds everything a CPU-only program needs and neither links nor includes CUDA or
// NCCL. The CUDA half, libbagua_core_cuda (core/src/backend/nccl/: the NCCL communicator and the
// CUDA runtime calls of the reducer's device buckets), implements CudaBackend and registers it
// with registerCudaBackend() from a static initializer. Where core is linked statically (the
// build tree's tests and tools, the Python extension) the CUDA half is linked whole beside it and
// registered before main(); where core is a shared library (the installed SDK) cudaBackend()
// loads libbagua_core_cuda by its SONAME the first time a GPU path is asked for (the NCCL
// backend): through the dynamic loader's usual search, then from the folder libbagua_core itself
// was loaded from. Without it (not installed, or libcudart / libnccl missing) that request fails
// with kFailedPrecondition naming the library and the loader's reason; the host paths never
// load it.
//
// Thread safety: registration and loading are safe from any thread; the backend's methods are
// the CUDA runtime's (per-thread current device).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "bagua/base/status.h"
#include "bagua/core/communicator.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"

// The CUDA runtime's handle types (cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*),
// declared so that this header needs no CUDA headers.
struct CUstream_st;
struct CUevent_st;

namespace bagua::core {

// What core asks of CUDA. Every Status error is kCudaError naming the runtime call.
class CudaBackend {
 public:
  virtual ~CudaBackend() = default;

  // ---- The NCCL communicator (backend/nccl/nccl_communicator.h) ------------------------------
  virtual Result<std::unique_ptr<Communicator>> createNcclCommunicator(
      Store& store, int rank, int size, const ProcessGroupOptions& options) = 0;

  // ---- The CUDA runtime calls of the reducer's device buckets (device_stager.cc) --------------
  virtual Status setDevice(int device) = 0;
  // A device allocation of `bytes` on the current device; free() takes null.
  virtual Result<void*> malloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // An event without timing; destroyEvent() takes null.
  virtual Result<CUevent_st*> createEvent() = 0;
  virtual void destroyEvent(CUevent_st* ev) = 0;
  virtual Status recordEvent(CUevent_st* ev, CUstream_st* stream) = 0;
  // True once the event completed, false while pending.
  virtual Result<bool> queryEvent(CUevent_st* ev) = 0;
  // Asynchronous device-to-device copy and zeroing on `stream`.
  virtual Status copyAsync(void* dst, const void* src, size_t bytes, CUstream_st* stream) = 0;
  virtual Status zeroAsync(void* dst, size_t bytes, CUstream_st* stream) = 0;
  // Synchronous copies between host and device memory (the legacy default stream).
  virtual Status copyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual Status copyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual Status synchronizeDefaultStream() = 0;
};

// Called once by the CUDA half; later calls replace the pointer (one CUDA half per process).
void registerCudaBackend(CudaBackend* backend);

// The registered CUDA half, or null: for paths that only run once it is in use (a device bucket
// exists only after checkDevice() accepted a tensor on an NCCL process group).
CudaBackend* registeredCudaBackend();

// The CUDA half, loading libbagua_core_cuda when it is not registered yet; the error says what is
// missing and how to get it.
Result<CudaBackend*> cudaBackend();

}  // namespace bagua::core
