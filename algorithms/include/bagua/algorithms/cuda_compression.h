// MinMaxUInt8 compression on CUDA device memory, bit-identical to the CPU kernels of
// compression.h (same layout, same float32 operation order, -0 canonicalised to +0, the same
// NaN bits for non-finite chunks). The kernels live in libbagua_algorithms_cuda, loaded on the
// first call (or by cudaCompressionAvailable()); where it is not built or does not load (no CUDA
// runtime), every call returns FailedPrecondition saying why and cudaCompressionAvailable() is
// false.
//
// All pointers are device pointers; `stream` is a cudaStream_t (nullptr: the legacy default
// stream). Calls enqueue work and return; synchronise the stream before reading the results.
// The workspace (minMaxCudaWorkspaceBytes: 16 bytes per chunk) holds each chunk's min/max
// accumulator and a counter: zero-fill it once when you allocate it (cudaMemset); every call
// leaves it all zero again, whatever the size or chunk count. Every pointer
// must be 4-byte aligned (InvalidArgument otherwise); 16-byte aligned chunks take the vector path
// (cudaMalloc'd buffers with chunk sizes that are multiples of 4), others a scalar path with the
// same bytes.
//
// Thread safety: as CUDA streams; distinct workspaces for concurrent calls.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bagua/base/status.h"

namespace bagua::algo {

bool cudaCompressionAvailable();

size_t minMaxCudaWorkspaceBytes(size_t numel, size_t chunks);

[[nodiscard]] Status minMaxCompressCuda(const float* src, size_t numel, size_t chunks, uint8_t* dst,
                                        size_t dstBytes, void* workspace, size_t workspaceBytes,
                                        int targetChunk = -1, void* stream = nullptr);
[[nodiscard]] Status minMaxDecompressCuda(const uint8_t* src, size_t srcBytes, size_t numel,
                                          size_t chunks, float* dst, int targetChunk = -1,
                                          void* stream = nullptr);

}  // namespace bagua::algo
