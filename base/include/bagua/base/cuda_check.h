// CUDA runtime errors as Status: the one converter every CUDA-using part of bagua shares.
//
// Include only from code compiled against the CUDA runtime (a library's CUDA sources, its tests,
// the GPU tools): this header includes <cuda_runtime_api.h>, and everything in it is inline so
// that base itself neither includes nor links CUDA.
//
//   BAGUA_CHECK_CUDA(cudaMalloc(&p, n));                        // returns the Status on failure
//   BAGUA_CHECK_CUDA(cudaSetDevice(d), "bucket %zu", index);    // with printf-style context
//   return BAGUA_CUDA_STATUS(cudaMemcpy(dst, src, n, kind));    // the Status itself
//   Status s = cudaStatus(err, "what", __FILE__, __LINE__);      // an error code from elsewhere
//
// The Status is kCudaError with message "[context: ]what: <cudaGetErrorString> (<error name>)"
// and the caller's file:line. Making it clears the thread's last-error slot (cudaGetLastError),
// so a handled error is not reported again by the next launch check; a sticky error (the
// context is lost) stays, as CUDA keeps returning it from every later call.
//
// Thread safety: as the CUDA runtime; no state of its own.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "bagua/base/status.h"

namespace bagua {

// Ok for cudaSuccess, else the kCudaError Status described above (file/line: its origin).
inline Status cudaStatus(cudaError_t err, std::string_view what, const char* file = nullptr,
                         int line = 0) {
  if (err == cudaSuccess) {
    return Status::ok();
  }
  (void)cudaGetLastError();
  std::string message(what);
  message += ": ";
  message += cudaGetErrorString(err);
  message += " (";
  message += cudaGetErrorName(err);
  message += ")";
  return Status(StatusCode::kCudaError, std::move(message), file, line);
}

}  // namespace bagua

// The Status of a CUDA runtime call (or of any cudaError_t expression), named by its text.
#define BAGUA_CUDA_STATUS(expr) ::bagua::cudaStatus((expr), #expr, __FILE__, __LINE__)

// Returns the Status of a failed CUDA runtime call from the enclosing function (which returns
// Status or Result<T>); optional printf-style arguments add context in front of the message.
#define BAGUA_CHECK_CUDA(call, ...)                                                \
  do {                                                                             \
    const cudaError_t bagua_cuda_err_ = (call);                                    \
    if (bagua_cuda_err_ != cudaSuccess) {                                          \
      ::bagua::Status bagua_cuda_status_ =                                         \
          ::bagua::cudaStatus(bagua_cuda_err_, #call, __FILE__, __LINE__);         \
      __VA_OPT__(bagua_cuda_status_.withContext(::bagua::strPrintf(__VA_ARGS__));) \
      return bagua_cuda_status_;                                                   \
    }                                                                              \
  } while (0)
