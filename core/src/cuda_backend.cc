#include "cuda_backend.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "bagua/base/logging.h"

namespace bagua::core {

namespace {

// Constant-initialised, so a static initializer of the CUDA half may register before any of
// core's own run.
constinit std::atomic<CudaBackend*> registered{nullptr};

#if BAGUA_CORE_CUDA_BUILT
// The folder libbagua_core was loaded from (empty where core is linked into the executable).
std::string ownFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&registerCudaBackend), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}
#endif

}  // namespace

void registerCudaBackend(CudaBackend* backend) {
  registered.store(backend, std::memory_order_release);
}

CudaBackend* registeredCudaBackend() {
  return registered.load(std::memory_order_acquire);
}

Result<CudaBackend*> cudaBackend() {
  if (CudaBackend* b = registeredCudaBackend()) {
    return b;
  }
#if !BAGUA_CORE_CUDA_BUILT
  return BAGUA_ERROR(kFailedPrecondition,
                     "the NCCL backend was not built (no CUDA/NCCL at configure time); use the "
                     "host backend, or configure with -Dcuda=enabled -Dnccl=enabled");
#else
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (CudaBackend* b = registeredCudaBackend()) {
    return b;
  }
  // RTLD_NODELETE: the backend object lives in the library, so it must never be unloaded.
  const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
  std::string why;
  void* handle = dlopen(BAGUA_CORE_CUDA_SONAME, flags);
  if (handle == nullptr) {
    const char* e = dlerror();
    why = e != nullptr ? e : "not found";
    const std::string folder = ownFolder();
    if (!folder.empty()) {
      const std::string beside = folder + "/" + BAGUA_CORE_CUDA_SONAME;
      handle = dlopen(beside.c_str(), flags);
      if (handle == nullptr) {
        e = dlerror();
        why = e != nullptr ? e : "not found";
      }
    }
  }
  if (handle == nullptr) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "NCCL backend requested but %s (CUDA %s, NCCL) is not installed or does "
                       "not load: %s. Install the SDK's CUDA part beside libbagua_core (meson "
                       "install of a build with CUDA and NCCL) and make libcudart.so.%s and "
                       "libnccl.so.2 loadable, or use the host backend",
                       BAGUA_CORE_CUDA_SONAME, BAGUA_CORE_CUDA_MAJOR, why.c_str(),
                       BAGUA_CORE_CUDA_MAJOR);
  }
  if (CudaBackend* b = registeredCudaBackend()) {
    BAGUA_LOG_INFO(kLogInit, "loaded %s (the NCCL backend)", BAGUA_CORE_CUDA_SONAME);
    return b;
  }
  return BAGUA_ERROR(kInternal, "%s loaded but registered no CUDA backend (another version?)",
                     BAGUA_CORE_CUDA_SONAME);
#endif
}

}  // namespace bagua::core
