// A library's CUDA half: the one mechanism by which bagua's CPU libraries reach CUDA code without
// linking CUDA (core, algorithms, optimizer and loader each use it for their own half).
//
// A library libbagua_X keeps everything a CPU-only program needs and neither links nor includes
// CUDA or NCCL. Its CUDA code lives in libbagua_X_cuda, which implements an interface of X's
// (`Backend`) and registers it from a static initializer with CudaHalf<Backend>::set(). Where X is
// linked statically (the build tree's tests and tools, the Python extension) the half is linked
// whole beside it and registered before main(); where X is a shared library (the installed SDK)
// CudaHalf::get() loads the half by its SONAME the first time a CUDA path asks for it: through
// the dynamic loader's usual search, then from the folder libbagua_X itself was loaded from.
// Without it (not built, not installed, or libcudart / libnccl missing) that request fails with
// kFailedPrecondition naming the library, the loader's reason and what to do; CPU paths never
// load it.
//
//   constinit CudaHalf<MyBackend> half;            // in libbagua_X, at namespace scope
//   half.set(&backend);                             // in libbagua_X_cuda's static initializer
//   BAGUA_ASSIGN_OR_RETURN(MyBackend* b, half.get(kSpec));  // on a CUDA path of libbagua_X
//
// Thread safety: set(), registered() and get() are safe from any thread; loading is serialised
// process-wide. A loaded half is never unloaded (RTLD_NODELETE: its backend object lives there).
#pragma once

#include <atomic>

#include "bagua/base/status.h"

namespace bagua {

// What to load and what to say when it cannot be. Every field is a static string.
struct CudaHalfSpec {
  const char* what;       // what asked for the half, for messages: "the NCCL backend"
  const char* soname;     // the half's SONAME, "libbagua_core_cuda.so.0.1"; null: not built
  const char* library;    // the CPU library it is installed beside: "libbagua_core"
  const char* links;      // what the half links, for messages: "CUDA 13, NCCL"
  const char* needs;      // the libraries to make loadable: "libcudart.so.13 and libnccl.so.2"
  const char* configure;  // the configure options that build it: "-Dcuda=enabled -Dnccl=enabled"
  const char* instead;    // the CPU-only alternative: "use the host backend"
  const void* anchor;     // an address inside `library` (its folder is searched second)
};

namespace detail {
// Loads spec.soname unless `registered()` already holds, as described above, and checks that
// loading registered the half. Ok, or kFailedPrecondition (not built, does not load) or kInternal
// (loaded but registered nothing) with the message the file comment describes.
Status loadCudaHalf(const CudaHalfSpec& spec, bool (*registered)(const void* half),
                    const void* half);
}  // namespace detail

template <class Backend>
class CudaHalf {
 public:
  constexpr CudaHalf() = default;
  CudaHalf(const CudaHalf&) = delete;
  CudaHalf& operator=(const CudaHalf&) = delete;

  // Called once by the half; a later call replaces the pointer (one half per process).
  void set(Backend* backend) { backend_.store(backend, std::memory_order_release); }
  // The registered half, or null: for paths that run only once it is in use.
  Backend* registered() const { return backend_.load(std::memory_order_acquire); }
  // The half, loading it when it is not registered yet (see the file comment).
  Result<Backend*> get(const CudaHalfSpec& spec) {
    if (Backend* b = registered()) {
      return b;
    }
    BAGUA_RETURN_IF_ERROR(detail::loadCudaHalf(
        spec,
        [](const void* half) {
          return static_cast<const CudaHalf*>(half)->registered() != nullptr;
        },
        this));
    return registered();
  }

 private:
  std::atomic<Backend*> backend_{nullptr};
};

}  // namespace bagua
