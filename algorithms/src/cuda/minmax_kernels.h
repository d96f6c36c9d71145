// Plain-C entry points of the CUDA MinMaxUInt8 kernels (compiled by nvcc, called from
// cuda_compression.cc). Return a cudaError_t value. Private.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bagua::algo::cudakernels {

constexpr int kThreads = 256;
// Pass 1 of compress: at most one block per kElemsPerPartial elements of a chunk (one tile) and
// at most kMaxPartials per chunk (the launch uses fewer once one wave of the device is full).
// The workspace holds one 4-word accumulator per chunk (max, min, non-finite flag, a counter),
// all 0 between calls: it must be zero-filled once before its first use, and every completed
// call leaves every word 0 again, whatever numel and chunks were.
constexpr size_t kElemsPerPartial = 4096;
constexpr size_t kMaxPartials = 2048;

// Upper bound of the pass-1 blocks per chunk of c elements.
inline size_t partialsPerChunk(size_t c) {
  size_t p = (c + kElemsPerPartial - 1) / kElemsPerPartial;
  p = p == 0 ? 1 : p;
  return p > kMaxPartials ? kMaxPartials : p;
}

int compress(const float* src, size_t numel, size_t chunks, uint8_t* dst, float* partials,
             int targetChunk, void* stream);
int decompress(const uint8_t* src, size_t numel, size_t chunks, float* dst, int targetChunk,
               void* stream);

}  // namespace bagua::algo::cudakernels
