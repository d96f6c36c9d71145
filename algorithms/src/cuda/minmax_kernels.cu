// CUDA MinMaxUInt8 kernels. Every float operation mirrors src/compression.cc in the same order
// (compiled with -fmad=false so nothing is contracted into an FMA; IEEE division and rintf),
// so the bytes equal the CPU ones.
#include <cuda_runtime.h>

#include "minmax_kernels.h"

namespace bagua::algo::cudakernels {

namespace {

constexpr float kEps = 1e-7f;
constexpr unsigned kNanBits = 0x7fc00000u;  // std::numeric_limits<float>::quiet_NaN()

__device__ inline bool nonFinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

// Pass 1: per (chunk, partial) block, min / max / non-finite flag over a slice of the chunk.
__global__ void partialMinMax(const float* src, size_t numel, size_t c, size_t firstChunk,
                              size_t parts, float* partials) {
  const size_t chunk = firstChunk + blockIdx.x / parts;
  const size_t part = blockIdx.x % parts;
  const size_t begin = chunk * c < numel ? chunk * c : numel;
  const size_t end = begin + c < numel ? begin + c : numel;
  const size_t n = end - begin;
  const size_t per = (n + parts - 1) / parts;
  const size_t lo = begin + (part * per < n ? part * per : n);
  const size_t hi = begin + ((part + 1) * per < n ? (part + 1) * per : n);
  __shared__ float smin[kThreads];
  __shared__ float smax[kThreads];
  __shared__ int sbad[kThreads];
  __shared__ int shas[kThreads];
  float mn = 0.0f, mx = 0.0f;
  int bad = 0, has = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float v = src[i];
    if (!has) {
      mn = v;
      mx = v;
      has = 1;
    } else {
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    bad |= nonFinite(v) ? 1 : 0;
  }
  smin[threadIdx.x] = mn;
  smax[threadIdx.x] = mx;
  sbad[threadIdx.x] = bad;
  shas[threadIdx.x] = has;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const unsigned o = threadIdx.x + s;
      if (shas[o]) {
        if (!shas[threadIdx.x]) {
          smin[threadIdx.x] = smin[o];
          smax[threadIdx.x] = smax[o];
          shas[threadIdx.x] = 1;
        } else {
          smin[threadIdx.x] = smin[o] < smin[threadIdx.x] ? smin[o] : smin[threadIdx.x];
          smax[threadIdx.x] = smax[o] > smax[threadIdx.x] ? smax[o] : smax[threadIdx.x];
        }
      }
      sbad[threadIdx.x] |= sbad[o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float* p = partials + 4 * blockIdx.x;
    p[0] = smin[0];
    p[1] = smax[0];
    p[2] = sbad[0] ? 1.0f : 0.0f;
    p[3] = shas[0] ? 1.0f : 0.0f;
  }
}

// Pass 2: one thread per chunk folds its partials and writes the 32-byte header.
__global__ void writeHeaders(const float* partials, size_t numel, size_t c, size_t firstChunk,
                             size_t count, size_t parts, size_t stride, uint8_t* dst) {
  const size_t k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= count) {
    return;
  }
  const size_t chunk = firstChunk + k;
  const size_t begin = chunk * c < numel ? chunk * c : numel;
  const size_t end = begin + c < numel ? begin + c : numel;
  float mn = 0.0f, mx = 0.0f;
  bool bad = false, has = false;
  for (size_t p = 0; p < parts; ++p) {
    const float* q = partials + 4 * (k * parts + p);
    if (q[3] != 0.0f) {
      if (!has) {
        mn = q[0];
        mx = q[1];
        has = true;
      } else {
        mn = q[0] < mn ? q[0] : mn;
        mx = q[1] > mx ? q[1] : mx;
      }
    }
    bad = bad || q[2] != 0.0f;
  }
  mn = mn + 0.0f;
  mx = mx + 0.0f;
  if (end > begin) {
    const float range = mx - mn + kEps;
    if (bad || nonFinite(range)) {
      mn = __uint_as_float(kNanBits);
      mx = __uint_as_float(kNanBits);
    }
  } else {
    mn = 0.0f;
    mx = 0.0f;
  }
  uint8_t* seg = dst + chunk * stride;
  const float h[8] = {mn, mx, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < 8; ++i) {
    reinterpret_cast<float*>(seg)[i] = h[i];
  }
}

// Pass 3: quantise; one thread per payload byte (padding bytes written as zero).
__global__ void quantise(const float* src, size_t numel, size_t c, size_t firstChunk, size_t count,
                         size_t payload, size_t stride, uint8_t* dst) {
  const size_t total = count * payload;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t chunk = firstChunk + e / payload;
    const size_t i = e % payload;
    const size_t begin = chunk * c < numel ? chunk * c : numel;
    const size_t end = begin + c < numel ? begin + c : numel;
    uint8_t* seg = dst + chunk * stride;
    uint8_t out = 0;
    const float mn = reinterpret_cast<const float*>(seg)[0];
    const float mx = reinterpret_cast<const float*>(seg)[1];
    if (begin + i < end && !(mn != mn)) {
      const float scale = 255.0f / (mx - mn + kEps);
      const float upper = rintf(mx * scale);
      const float lower = upper - 255.0f;
      const float r = rintf(src[begin + i] * scale);
      float v = (r < upper ? r : upper) - lower;
      v = v < 0.0f ? 0.0f : v;
      v = v > 255.0f ? 255.0f : v;
      out = static_cast<uint8_t>(static_cast<int>(v));
    }
    seg[32 + i] = out;
  }
}

__global__ void dequantise(const uint8_t* src, size_t numel, size_t c, size_t lo, size_t hi,
                           size_t stride, float* dst) {
  for (size_t e = lo + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < hi;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t chunk = e / c;
    const uint8_t* seg = src + chunk * stride;
    const float mn = reinterpret_cast<const float*>(seg)[0];
    const float mx = reinterpret_cast<const float*>(seg)[1];
    // A NaN header marks a non-finite chunk. Write the CPU's quiet NaN explicitly: arithmetic
    // on a NaN yields the GPU's canonical 0x7fffffff, not the header's bits.
    if (isnan(mn) || isnan(mx)) {
      dst[e] = __uint_as_float(kNanBits);
      continue;
    }
    const float scale = 255.0f / (mx - mn + kEps);
    const float lower = rintf(mx * scale) - 255.0f;
    dst[e] = (static_cast<float>(seg[32 + (e - chunk * c)]) + lower) / scale;
  }
  (void)numel;
}

unsigned gridFor(size_t work) {
  size_t g = (work + kThreads - 1) / kThreads;
  g = g == 0 ? 1 : g;
  return static_cast<unsigned>(g > 65535 ? 65535 : g);
}

}  // namespace

int compress(const float* src, size_t numel, size_t chunks, uint8_t* dst, float* partials,
             int targetChunk, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t c = (numel + chunks - 1) / chunks;
  const size_t payload = (c + 31) / 32 * 32;
  const size_t stride = payload + 32;
  const size_t first = targetChunk >= 0 ? static_cast<size_t>(targetChunk) : 0;
  const size_t count = targetChunk >= 0 ? 1 : chunks;
  const size_t parts = partialsPerChunk(c);
  partialMinMax<<<static_cast<unsigned>(count * parts), kThreads, 0, s>>>(src, numel, c, first,
                                                                          parts, partials);
  writeHeaders<<<gridFor(count), kThreads, 0, s>>>(partials, numel, c, first, count, parts, stride,
                                                   dst);
  if (payload > 0) {
    quantise<<<gridFor(count * payload), kThreads, 0, s>>>(src, numel, c, first, count, payload,
                                                           stride, dst);
  }
  return static_cast<int>(cudaGetLastError());
}

int decompress(const uint8_t* src, size_t numel, size_t chunks, float* dst, int targetChunk,
               void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t c = (numel + chunks - 1) / chunks;
  if (c == 0) {
    return 0;
  }
  const size_t stride = (c + 31) / 32 * 32 + 32;
  size_t lo = 0, hi = numel;
  if (targetChunk >= 0) {
    lo =
        static_cast<size_t>(targetChunk) * c < numel ? static_cast<size_t>(targetChunk) * c : numel;
    hi = lo + c < numel ? lo + c : numel;
  }
  if (hi > lo) {
    dequantise<<<gridFor(hi - lo), kThreads, 0, s>>>(src, numel, c, lo, hi, stride, dst);
  }
  return static_cast<int>(cudaGetLastError());
}

const char* errorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace bagua::algo::cudakernels
