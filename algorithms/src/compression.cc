#include "bagua/algorithms/compression.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace bagua::algo {

namespace {

constexpr size_t kLanes = 8;

// Min and max of x[0..n) and whether any element is NaN or infinite. Lane-wise accumulators
// so the compiler can keep them in vector registers.
void chunkMinMax(const float* x, size_t n, float* outMin, float* outMax, bool* nonFinite) {
  float lmin[kLanes];
  float lmax[kLanes];
  uint32_t bad[kLanes];
  for (size_t l = 0; l < kLanes; ++l) {
    lmin[l] = x[0];
    lmax[l] = x[0];
    bad[l] = 0;
  }
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float v = x[i + l];
      lmin[l] = v < lmin[l] ? v : lmin[l];
      lmax[l] = v > lmax[l] ? v : lmax[l];
      bad[l] |= static_cast<uint32_t>((std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u);
    }
  }
  for (; i < n; ++i) {
    const float v = x[i];
    lmin[0] = v < lmin[0] ? v : lmin[0];
    lmax[0] = v > lmax[0] ? v : lmax[0];
    bad[0] |= static_cast<uint32_t>((std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u);
  }
  float mn = lmin[0];
  float mx = lmax[0];
  uint32_t b = bad[0];
  for (size_t l = 1; l < kLanes; ++l) {
    mn = lmin[l] < mn ? lmin[l] : mn;
    mx = lmax[l] > mx ? lmax[l] : mx;
    b |= bad[l];
  }
  // +0.0f turns -0 into +0: which zero min/max keep depends on the visiting order, and the CUDA
  // kernels visit in another order; the header bytes must not depend on it.
  *outMin = mn + 0.0f;
  *outMax = mx + 0.0f;
  *nonFinite = b != 0;
}

void writeHeader(uint8_t* segment, float mn, float mx) {
  std::memset(segment, 0, kMinMaxHeaderBytes);
  std::memcpy(segment, &mn, sizeof(float));
  std::memcpy(segment + sizeof(float), &mx, sizeof(float));
}

// Calls f(j, begin, end) for chunk j's elements [begin, end), for every chunk or only targetChunk.
template <class F>
void forEachChunk(size_t numel, size_t chunks, int targetChunk, F&& f) {
  const size_t c = minMaxChunkElements(numel, chunks);
  for (size_t j = 0; j < chunks; ++j) {
    if (targetChunk >= 0 && j != static_cast<size_t>(targetChunk)) {
      continue;
    }
    const size_t begin = std::min(j * c, numel);
    f(j, begin, std::min(begin + c, numel));
  }
}

}  // namespace

Status minMaxCheckArgs(size_t numel, size_t chunks, size_t bytes, int targetChunk,
                       const char* what) {
  if (chunks == 0) {
    return BAGUA_ERROR(kInvalidArgument, "%s: chunks must be at least 1", what);
  }
  if (targetChunk >= 0 && static_cast<size_t>(targetChunk) >= chunks) {
    return BAGUA_ERROR(kInvalidArgument, "%s: target chunk %d of %zu chunks", what, targetChunk,
                       chunks);
  }
  const size_t need = minMaxCompressedBytes(numel, chunks);
  if (bytes < need) {
    return BAGUA_ERROR(kInvalidArgument,
                       "%s: compressed buffer of %zu bytes, %zu elements in %zu chunks need %zu",
                       what, bytes, numel, chunks, need);
  }
  return Status::ok();
}

void minMaxCompressChunk(const float* x, size_t n, uint8_t* segment) {
  uint8_t* q = segment + kMinMaxHeaderBytes;
  const size_t padded = align32(n);
  if (n == 0) {
    writeHeader(segment, 0.0f, 0.0f);
    return;
  }
  float mn = 0.0f;
  float mx = 0.0f;
  bool nonFinite = false;
  chunkMinMax(x, n, &mn, &mx, &nonFinite);
  const float range = mx - mn + kMinMaxEps;
  if (nonFinite || !std::isfinite(range)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    writeHeader(segment, nan, nan);
    std::memset(q, 0, padded);
    return;
  }
  writeHeader(segment, mn, mx);
  const float scale = 255.0f / range;
  const float upper = roundHalfEven(mx * scale);
  const float lower = upper - 255.0f;
  for (size_t i = 0; i < n; ++i) {
    const float r = roundHalfEven(x[i] * scale);
    float v = (r < upper ? r : upper) - lower;
    v = v < 0.0f ? 0.0f : v;
    v = v > 255.0f ? 255.0f : v;
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
  std::memset(q + n, 0, padded - n);
}

void minMaxDecompressChunk(const uint8_t* segment, size_t n, float* out) {
  if (n == 0) {
    return;
  }
  float mn = 0.0f;
  float mx = 0.0f;
  std::memcpy(&mn, segment, sizeof(float));
  std::memcpy(&mx, segment + sizeof(float), sizeof(float));
  if (std::isnan(mn) || std::isnan(mx)) {
    // A non-finite chunk: every element is the quiet NaN, with the same bits on CPU and GPU
    // (NaN arithmetic would leave the payload to the hardware).
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const float scale = 255.0f / (mx - mn + kMinMaxEps);
  const float lower = roundHalfEven(mx * scale) - 255.0f;
  const uint8_t* q = segment + kMinMaxHeaderBytes;
  for (size_t i = 0; i < n; ++i) {
    out[i] = (static_cast<float>(q[i]) + lower) / scale;
  }
}

Status minMaxCompress(const float* src, size_t numel, size_t chunks, uint8_t* dst, size_t dstBytes,
                      int targetChunk) {
  BAGUA_RETURN_IF_ERROR(minMaxCheckArgs(numel, chunks, dstBytes, targetChunk, "minMaxCompress"));
  const size_t stride = minMaxSegmentBytes(minMaxChunkElements(numel, chunks));
  forEachChunk(numel, chunks, targetChunk, [&](size_t j, size_t begin, size_t end) {
    minMaxCompressChunk(src + begin, end - begin, dst + j * stride);
    // Bytes between the chunk's padded payload and the segment end (short last chunks).
    const size_t used = kMinMaxHeaderBytes + align32(end - begin);
    std::memset(dst + j * stride + used, 0, stride - used);
  });
  return Status::ok();
}

Status minMaxDecompress(const uint8_t* src, size_t srcBytes, size_t numel, size_t chunks,
                        float* dst, int targetChunk) {
  BAGUA_RETURN_IF_ERROR(minMaxCheckArgs(numel, chunks, srcBytes, targetChunk, "minMaxDecompress"));
  const size_t stride = minMaxSegmentBytes(minMaxChunkElements(numel, chunks));
  forEachChunk(numel, chunks, targetChunk, [&](size_t j, size_t begin, size_t end) {
    minMaxDecompressChunk(src + j * stride, end - begin, dst + begin);
  });
  return Status::ok();
}

}  // namespace bagua::algo
