// Host side of the CUDA kernels: argument checks, then the kernels (cuda/minmax_kernels.cu) through
// the algorithms' CUDA half (cuda_kernels.h), loaded on the first call.
#include "bagua/algorithms/cuda_compression.h"

#include <cstdint>

#include "bagua/algorithms/compression.h"
#include "cuda_kernels.h"

namespace bagua::algo {

namespace {

// The header floats and the payload's 4-byte words are accessed in place.
Status checkAligned(const void* p, const char* name, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 4 != 0) {
    return BAGUA_ERROR(kInvalidArgument, "%s: %s %p is not 4-byte aligned", what, name, p);
  }
  return Status::ok();
}

}  // namespace

bool cudaCompressionAvailable() {
  return detail::cudaKernels().isOk();
}

// Per chunk, one 16-byte accumulator (max, min, non-finite flag, a counter; see
// cuda/minmax_kernels.cu). The last quantise block of each chunk sets its four words back to 0,
// so the caller zero-fills the workspace once when it allocates it (detail::Buffer does,
// cudaMemset after cudaMalloc) and may then reuse it for any numel and chunks, one call at a time
// per workspace (the next call on the same stream).
size_t minMaxCudaWorkspaceBytes(size_t numel, size_t chunks) {
  if (chunks == 0) {
    return 0;
  }
  (void)numel;
  return chunks * 4 * sizeof(uint32_t);
}

Status minMaxCompressCuda(const float* src, size_t numel, size_t chunks, uint8_t* dst,
                          size_t dstBytes, void* workspace, size_t workspaceBytes, int targetChunk,
                          void* stream) {
  BAGUA_RETURN_IF_ERROR(
      minMaxCheckArgs(numel, chunks, dstBytes, targetChunk, "minMaxCompressCuda"));
  BAGUA_RETURN_IF_ERROR(checkAligned(src, "source", "minMaxCompressCuda"));
  BAGUA_RETURN_IF_ERROR(checkAligned(dst, "compressed buffer", "minMaxCompressCuda"));
  BAGUA_RETURN_IF_ERROR(checkAligned(workspace, "workspace", "minMaxCompressCuda"));
  if (workspaceBytes < minMaxCudaWorkspaceBytes(numel, chunks)) {
    return BAGUA_ERROR(kInvalidArgument, "minMaxCompressCuda: workspace of %zu bytes, need %zu",
                       workspaceBytes, minMaxCudaWorkspaceBytes(numel, chunks));
  }
  BAGUA_ASSIGN_OR_RETURN(detail::CudaKernels * k, detail::cudaKernels());
  const int err =
      k->compress(src, numel, chunks, dst, static_cast<float*>(workspace), targetChunk, stream);
  return k->status(err, "minMaxCompressCuda", __FILE__, __LINE__);
}

Status minMaxDecompressCuda(const uint8_t* src, size_t srcBytes, size_t numel, size_t chunks,
                            float* dst, int targetChunk, void* stream) {
  BAGUA_RETURN_IF_ERROR(
      minMaxCheckArgs(numel, chunks, srcBytes, targetChunk, "minMaxDecompressCuda"));
  BAGUA_RETURN_IF_ERROR(checkAligned(src, "compressed buffer", "minMaxDecompressCuda"));
  BAGUA_RETURN_IF_ERROR(checkAligned(dst, "destination", "minMaxDecompressCuda"));
  BAGUA_ASSIGN_OR_RETURN(detail::CudaKernels * k, detail::cudaKernels());
  const int err = k->decompress(src, numel, chunks, dst, targetChunk, stream);
  return k->status(err, "minMaxDecompressCuda", __FILE__, __LINE__);
}

}  // namespace bagua::algo
