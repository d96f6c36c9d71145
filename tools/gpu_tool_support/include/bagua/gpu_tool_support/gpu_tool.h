// What the multi-process GPU tools share (bagua-nccl-bench, bagua-autotune-net-live-bench): each
// forks one process per GPU before CUDA is touched and hands the NCCL unique id over a pipe.
// Header only; needs cuda_dep and nccl_dep. Not for library code: the checks exit the process.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace bagua::tools {

// The rank the process runs as (-1 before it is known), printed by the checks below.
inline int& toolRank() {
  static int rank = -1;
  return rank;
}

// Reads or writes all n bytes of a pipe; false on EOF or an error.
inline bool readAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) {
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

inline bool writeAll(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    if (r <= 0) {
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace bagua::tools

// A failed CUDA call ends the process with status 3, a failed NCCL call with 4, naming the rank,
// the call and the error.
#define BAGUA_TOOL_CHECK_CUDA(call)                                                       \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "rank %d: %s failed: %s\n", ::bagua::tools::toolRank(), #call, \
                   cudaGetErrorString(e_));                                               \
      std::exit(3);                                                                       \
    }                                                                                     \
  } while (0)

#define BAGUA_TOOL_CHECK_NCCL(call)                                                       \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      std::fprintf(stderr, "rank %d: %s failed: %s\n", ::bagua::tools::toolRank(), #call, \
                   ncclGetErrorString(r_));                                               \
      std::exit(4);                                                                       \
    }                                                                                     \
  } while (0)
