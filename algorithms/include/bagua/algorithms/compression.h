// MinMaxUInt8: Bagua's 8-bit min-max quantisation (ByteGrad, QAdam, low-precision decentralized),
// with Bagua's compressed-buffer layout, so the bytes on the wire match the original.
//
// A tensor of `numel` float32 elements is cut into `chunks` chunks of c = ceil(numel / chunks)
// elements (the last one may be shorter; empty chunks are allowed). Each chunk becomes one
// segment of segmentBytes(c) = align32(c) + 32 bytes:
//   byte 0..3   min of the chunk (float32, native byte order)
//   byte 4..7   max of the chunk (float32)
//   byte 8..31  zero padding
//   byte 32..   c payload bytes, then zero padding to a multiple of 32
// The math is Bagua's, in float32 with eps = 1e-7:
//   scale = 255 / (max - min + eps);  upper = rint(max * scale);  lower = upper - 255
//   q = clamp(min(rint(x * scale), upper) - lower, 0, 255)     (compress)
//   x' = (q + lower) / scale                                    (decompress)
// rint is round-half-to-even. The clamp to [0, 255] is ours: Bagua's kernel converts without it,
// which overflows the uint8 when the chunk is constant and |x| is large enough that
// ulp(x * scale) > 1 (e.g. a chunk of ones). For every other chunk it changes nothing.
//
// Error bound for a finite chunk: |x' - x| <= (max - min + eps) / 510 + 4 * ulp(max(|min|, |max|))
// (half a quantisation step plus float rounding of the affine map).
//
// Non-finite policy: if a chunk holds a NaN or an infinity, or its range max - min overflows
// float, the chunk's header stores NaN for min and max, its payload is zero, and it decompresses
// to NaN everywhere. A gradient that overflowed is thus never silently turned into finite
// numbers; as with full-precision all-reduce the NaN reaches every rank and the loss scaler (or
// the user) sees it.
//
// The CPU loops are written to vectorise (branch-free rounding, lane-wise min/max); the CUDA
// kernels (cuda_compression.h) produce bit-identical buffers.
//
// Thread safety: pure functions on caller-owned buffers.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "bagua/base/status.h"

namespace bagua::algo {

inline constexpr size_t kMinMaxHeaderBytes = 32;
inline constexpr float kMinMaxEps = 1e-7f;

constexpr size_t align32(size_t n) {
  return (n + 31) / 32 * 32;
}

// Elements per chunk: ceil(numel / chunks) (0 when numel is 0).
constexpr size_t minMaxChunkElements(size_t numel, size_t chunks) {
  return chunks == 0 ? 0 : (numel + chunks - 1) / chunks;
}
// Bytes of one segment holding `chunkElements` elements.
constexpr size_t minMaxSegmentBytes(size_t chunkElements) {
  return align32(chunkElements) + kMinMaxHeaderBytes;
}
// Bytes of the whole compressed buffer.
constexpr size_t minMaxCompressedBytes(size_t numel, size_t chunks) {
  return chunks * minMaxSegmentBytes(minMaxChunkElements(numel, chunks));
}

// Round half to even, bit-identical to std::nearbyint in the default rounding mode, written so
// that loops around it vectorise on baseline x86-64 (no roundps before SSE4.1).
inline float roundHalfEven(float x) {
  const float kBig = 8388608.0f;  // 2^23: at and above it every float is an integer
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const float a = std::bit_cast<float>(bits & 0x7fffffffu);
  const float r = (a + kBig) - kBig;  // |x| rounded half to even (for |x| < 2^23)
  const float ra = a < kBig ? r : a;
  // Rounding is symmetric, so put the sign back (this also keeps -0 and NaN bits as they are).
  return std::bit_cast<float>(std::bit_cast<uint32_t>(ra) | (bits & 0x80000000u));
}

// The argument contract of minMaxCompress/minMaxDecompress and their CUDA versions: Ok, or
// InvalidArgument starting with `what` when chunks == 0, targetChunk >= chunks, or `bytes` is
// less than minMaxCompressedBytes(numel, chunks).
[[nodiscard]] Status minMaxCheckArgs(size_t numel, size_t chunks, size_t bytes, int targetChunk,
                                     const char* what);

// Compresses `src` (numel floats) into `dst` (dstBytes >= minMaxCompressedBytes). With
// targetChunk >= 0 only that chunk is compressed, into its own segment; other segments are left
// untouched. InvalidArgument for a short buffer, chunks == 0 or a target out of range.
[[nodiscard]] Status minMaxCompress(const float* src, size_t numel, size_t chunks, uint8_t* dst,
                                    size_t dstBytes, int targetChunk = -1);
// The inverse: writes numel floats (or only the target chunk's elements).
[[nodiscard]] Status minMaxDecompress(const uint8_t* src, size_t srcBytes, size_t numel,
                                      size_t chunks, float* dst, int targetChunk = -1);

// One chunk: n elements into one segment of minMaxSegmentBytes(n) bytes (or a larger stride;
// only header + n payload bytes are written, the payload padding is zeroed up to align32(n)).
void minMaxCompressChunk(const float* x, size_t n, uint8_t* segment);
void minMaxDecompressChunk(const uint8_t* segment, size_t n, float* out);

}  // namespace bagua::algo
