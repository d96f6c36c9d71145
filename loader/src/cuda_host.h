// The seam between the loader and its CUDA half (loader-private).
//
// libbagua_loader neither links nor includes CUDA. The CUDA half, libbagua_loader_cuda
// (src/cuda/cuda_pinned.cc: cudaHostAlloc), implements CudaHost and registers it from a static
// initializer; pinnedHostAllocator() reaches it through cudaHost(), which loads the shared half
// by its SONAME on the first call (bagua/base/cuda_half.h: the one loading mechanism every bagua
// library shares). Where it does not load (no CUDA runtime) pinned batches come from mlock.
//
// Thread safety: as the CUDA runtime; the allocator is thread-safe (host_buffer.h).
#pragma once

#include <string>

#include "bagua/base/status.h"
#include "bagua/loader/host_buffer.h"

namespace bagua::loader::detail {

class CudaHost {
 public:
  virtual ~CudaHost() = default;
  // The cudaHostAlloc allocator (lives for the process) when a CUDA device is visible; else null
  // with `why` saying what the runtime reported.
  virtual HostAllocator* pinnedAllocator(std::string* why) = 0;
};

// Called once by the CUDA half (a later call replaces the pointer).
void registerCudaHost(CudaHost* host);

// The CUDA half, loading libbagua_loader_cuda when it is not registered yet; the error says what
// is missing (kFailedPrecondition).
Result<CudaHost*> cudaHost();

}  // namespace bagua::loader::detail
