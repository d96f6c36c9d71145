// CUDA MinMaxUInt8 kernels. Every float operation per element mirrors src/compression.cc in the
// same order (compiled with -fmad=false so nothing is contracted into an FMA; IEEE division and
// rintf), so the bytes equal the CPU ones. Only the visiting order of the min/max reduction
// differs, which cannot change the result: NaN never wins a comparison, a non-finite chunk is
// replaced by the NaN header anyway, and -0/+0 is canonicalised to +0 as on the CPU.
//
// Shape, for bandwidth (the data is read twice by compress, once by decompress), and for few
// launches (a 16 MiB bucket compresses in about 10 us, so every launch gap counts):
//   pass 1 minMaxFold     grid (parts, chunks): each block strides over 4096-element tiles of its
//                         chunk with 16-byte loads (scalar head/tail up to the first 16-byte
//                         boundary), warp-shuffle reduction, then thread 0 folds the block's
//                         min/max into the chunk's accumulator in the workspace with two
//                         atomicMax on order-preserving integer encodings (and an atomicOr for a
//                         non-finite element). No block waits for another and there is no
//                         serial fold at the end: the previous shape (one partial per block, the
//                         last block to arrive folding them all and writing the header) spent a
//                         few microseconds of a 16 MiB call in that one block;
//   pass 2 quantise       grid (tiles, chunks), launched with programmatic stream serialisation
//                         (pass 1 lets it in at its start; it waits for pass 1's completion in
//                         griddepcontrol.wait before reading an accumulator), so its blocks are
//                         resident when pass 1 ends: the chunk's min/max decoded and the chunk
//                         constants (scale, upper, lower) computed once per thread, the 32-byte
//                         header written by the chunk's block x = 0, 4 elements per thread step
//                         (float4 load when the chunk is 16-byte aligned, else 4 scalar loads),
//                         one uchar4 store; tiles visited last-to-first so that the tail pass 1
//                         read last is still in L2. Each block counts itself on the chunk's
//                         counter after reading the accumulator; the last one sets the chunk's
//                         four words back to 0 for the next call;
//   decompress            grid (tiles, chunks): uchar4 loads, float4 stores where aligned.
// Grids are one wave of the device (occupancy x SM count, queried once per kernel and device)
// and stride, so no 65535 cap applies to the element count. At 4 Mi floats on 132 SMs (8 blocks
// of 256 threads each), pass 1 and quantise both run 1024 blocks of one tile, with 1 chunk
// (1024 x 1) and with 8 (128 x 8): 97% of the 1056 resident slots.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "minmax_kernels.h"

namespace bagua::algo::cudakernels {

namespace {

constexpr float kEps = 1e-7f;
constexpr unsigned kNanBits = 0x7fc00000u;  // std::numeric_limits<float>::quiet_NaN()
constexpr unsigned kPosInfBits = 0x7f800000u;
constexpr unsigned kNegInfBits = 0xff800000u;
constexpr int kUnroll = 4;                                 // quads in flight per thread
constexpr size_t kTileQuads = size_t{kThreads} * kUnroll;  // 4096 elements per block step
constexpr int kWarps = kThreads / 32;
constexpr unsigned kMaxGridY = 65535;
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");

__device__ __forceinline__ bool nonFinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

struct Range {
  size_t begin;
  size_t n;
};

// Elements of chunk `chunk`: [min(chunk * c, numel), min(begin + c, numel)).
__device__ __forceinline__ Range chunkRange(size_t chunk, size_t numel, size_t c) {
  const size_t b = chunk * c < numel ? chunk * c : numel;
  const size_t e = b + c < numel ? b + c : numel;
  return {b, e - b};
}

struct MinMax {
  float mn;
  float mx;
  unsigned bad;
};

__device__ __forceinline__ MinMax identity() {
  return {__uint_as_float(kPosInfBits), __uint_as_float(kNegInfBits), 0u};
}

// NaN never wins a comparison (the flag records it), so the identity and any visiting order give
// the chunk's min and max whenever the chunk is finite.
__device__ __forceinline__ void fold(MinMax& m, float v) {
  m.mn = v < m.mn ? v : m.mn;
  m.mx = v > m.mx ? v : m.mx;
  m.bad |= nonFinite(v) ? 1u : 0u;
}

__device__ __forceinline__ void merge(MinMax& m, float mn, float mx, unsigned bad) {
  m.mn = mn < m.mn ? mn : m.mn;
  m.mx = mx > m.mx ? mx : m.mx;
  m.bad |= bad;
}

__device__ __forceinline__ void warpReduce(MinMax& m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float mn = __shfl_xor_sync(kFullMask, m.mn, o);
    const float mx = __shfl_xor_sync(kFullMask, m.mx, o);
    const unsigned bad = __shfl_xor_sync(kFullMask, m.bad, o);
    merge(m, mn, mx, bad);
  }
}

// Every thread of the block calls it; the result is valid in thread 0. Ends with a barrier so
// the block may call it again (the next chunk of a grid-stride loop).
__device__ MinMax blockReduce(MinMax m) {
  __shared__ float smn[kWarps];
  __shared__ float smx[kWarps];
  __shared__ unsigned sbad[kWarps];
  warpReduce(m);
  const unsigned warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (lane == 0) {
    smn[warp] = m.mn;
    smx[warp] = m.mx;
    sbad[warp] = m.bad;
  }
  __syncthreads();
  if (warp == 0) {
    m = identity();
    if (lane < kWarps) {
      merge(m, smn[lane], smx[lane], sbad[lane]);
    }
    warpReduce(m);
  }
  __syncthreads();
  return m;
}

// Lets the dependent launch (quantise, launched with programmatic stream serialisation) be
// scheduled as this grid's blocks retire; it reads nothing this grid writes before its
// waitForPrimary(). No-op on a launch without the attribute.
__device__ __forceinline__ void allowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the preceding grid of the stream has completed and its writes are visible;
// returns at once when the kernel was launched without programmatic stream serialisation.
__device__ __forceinline__ void waitForPrimary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The chunk accumulator: 4 words of the workspace per chunk, all 0 between calls.
//   word 0  max, as keyOf(v) ^ 0x80000000 (unsigned order = float order; 0 below every key)
//   word 1  min, as ~(keyOf(v) ^ 0x80000000) (so atomicMax keeps the minimum; 0 = none yet)
//   word 2  1 when the chunk holds a non-finite element
//   word 3  quantise blocks that have read words 0-2 (the last one zeroes all four)
// keyOf maps a non-NaN float to a signed integer of the same order (-0 below +0; NaN never
// reaches it: fold() keeps NaN out of min/max and flags it instead).
__device__ __forceinline__ unsigned keyOf(float v) {
  const int i = __float_as_int(v);
  return static_cast<unsigned>(i >= 0 ? i : i ^ 0x7fffffff) ^ 0x80000000u;
}

__device__ __forceinline__ float floatOfKey(unsigned key) {
  const int i = static_cast<int>(key ^ 0x80000000u);
  return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff);
}

// The header's min and max from a chunk's accumulator words, exactly as the CPU computes them
// from its sequential fold: 0/0 for an empty chunk, -0 canonicalised to +0, the NaN pair for a
// chunk with a non-finite element or a non-finite range.
__device__ __forceinline__ void headerOf(unsigned maxWord, unsigned minWord, unsigned bad, size_t n,
                                         float* mnOut, float* mxOut) {
  float mn = 0.0f;
  float mx = 0.0f;
  if (n > 0) {
    // +0.0f: -0 becomes +0, as on the CPU.
    mn = floatOfKey(~minWord) + 0.0f;
    mx = floatOfKey(maxWord) + 0.0f;
    const float range = mx - mn + kEps;
    if (bad != 0u || nonFinite(range)) {
      mn = __uint_as_float(kNanBits);
      mx = __uint_as_float(kNanBits);
    }
  }
  *mnOut = mn;
  *mxOut = mx;
}

// Pass 1: block (x, y) folds tiles x, x + gridDim.x, ... of chunk firstChunk + y and adds its
// min/max to the chunk's accumulator (workspace words 4k .. 4k + 2 for the k-th chunk of the
// call). A block that saw no element of a non-empty chunk adds the identity, which changes
// nothing; an empty chunk is not touched (the words stay 0).
__global__ void __launch_bounds__(kThreads)
    minMaxFold(const float* __restrict__ src, size_t numel, size_t c, size_t firstChunk,
               size_t count, unsigned* acc) {
  allowDependentLaunch();
  for (size_t k = blockIdx.y; k < count; k += gridDim.y) {
    const Range r = chunkRange(firstChunk + k, numel, c);
    if (r.n == 0) {
      continue;  // uniform in the block
    }
    const float* p = src + r.begin;
    // Elements before the first 16-byte boundary (p is 4-byte aligned as a float pointer).
    size_t head = ((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) / 4;
    head = head < r.n ? head : r.n;
    const size_t quads = (r.n - head) / 4;
    const size_t tailStart = head + 4 * quads;
    const float4* q4 = reinterpret_cast<const float4*>(p + head);
    MinMax m = identity();
    if (blockIdx.x == 0) {
      if (threadIdx.x < head) {
        fold(m, p[threadIdx.x]);
      }
      if (threadIdx.x < r.n - tailStart) {
        fold(m, p[tailStart + threadIdx.x]);
      }
    }
    for (size_t t = blockIdx.x * kTileQuads; t < quads; t += gridDim.x * kTileQuads) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = t + threadIdx.x + static_cast<size_t>(u) * kThreads;
        // Past the end: quad 0 again (already folded, so it changes nothing).
        v[u] = __ldg(q4 + (i < quads ? i : 0));
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        fold(m, v[u].x);
        fold(m, v[u].y);
        fold(m, v[u].z);
        fold(m, v[u].w);
      }
    }
    m = blockReduce(m);
    if (threadIdx.x == 0) {
      unsigned* a = acc + 4 * k;
      atomicMax(a, keyOf(m.mx));
      atomicMax(a + 1, ~keyOf(m.mn));
      if (m.bad != 0u) {
        atomicOr(a + 2, 1u);
      }
    }
  }
}

__device__ __forceinline__ uint8_t quantiseOne(float x, bool valid, float scale, float upper,
                                               float lower) {
  if (!valid) {
    return 0;
  }
  const float r = rintf(x * scale);
  float v = (r < upper ? r : upper) - lower;
  v = v < 0.0f ? 0.0f : v;
  v = v > 255.0f ? 255.0f : v;
  return static_cast<uint8_t>(static_cast<int>(v));
}

// Pass 2: every payload byte of the chunks (padding and non-finite chunks as zero). Chunks and
// tiles are visited in reverse so the first tiles read are the ones pass 1 read last.
__global__ void __launch_bounds__(kThreads)
    quantise(const float* __restrict__ src, size_t numel, size_t c, size_t firstChunk, size_t count,
             size_t stride, unsigned* acc, uint8_t* dst) {
  __shared__ unsigned words[3];
  const size_t payloadQuads = (stride - 32) / 4;
  const size_t tiles = (payloadQuads + kTileQuads - 1) / kTileQuads;
  // Every block waits before reading an accumulator (pass 1 complete and visible).
  waitForPrimary();
  for (size_t ky = blockIdx.y; ky < count; ky += gridDim.y) {
    const size_t chunk = firstChunk + (count - 1 - ky);
    const Range r = chunkRange(chunk, numel, c);
    uint8_t* seg = dst + chunk * stride;
    unsigned* a = acc + 4 * (chunk - firstChunk);
    if (threadIdx.x == 0) {
      // Through L2: pass 1's atomics live there.
      words[0] = __ldcg(a);
      words[1] = __ldcg(a + 1);
      words[2] = __ldcg(a + 2);
      __threadfence();  // the reads are done before this block is counted
      if (atomicAdd(a + 3, 1u) == gridDim.x - 1) {
        // Every block of this chunk has read the accumulator: ready for the next call.
        a[0] = 0u;
        a[1] = 0u;
        a[2] = 0u;
        a[3] = 0u;
      }
    }
    __syncthreads();
    float mn = 0.0f;
    float mx = 0.0f;
    headerOf(words[0], words[1], words[2], r.n, &mn, &mx);
    __syncthreads();  // words[] is rewritten for the next chunk of this block only after this
    if (blockIdx.x == 0 && threadIdx.x < 8) {
      float* h = reinterpret_cast<float*>(seg);
      h[threadIdx.x] = threadIdx.x == 0 ? mn : (threadIdx.x == 1 ? mx : 0.0f);
    }
    const bool skip = r.n == 0 || mn != mn;
    float scale = 0.0f;
    float upper = 0.0f;
    float lower = 0.0f;
    if (!skip) {
      scale = 255.0f / (mx - mn + kEps);
      upper = rintf(mx * scale);
      lower = upper - 255.0f;
    }
    const float* p = src + r.begin;
    const bool vec = (reinterpret_cast<uintptr_t>(p) & 15) == 0;
    uchar4* out = reinterpret_cast<uchar4*>(seg + 32);
    for (size_t tx = blockIdx.x; tx < tiles; tx += gridDim.x) {
      const size_t t = (tiles - 1 - tx) * kTileQuads;
      if (!skip && vec && 4 * (t + kTileQuads) <= r.n) {
        // Whole tile inside the chunk, 16-byte aligned: no bounds checks.
        const float4* p4 = reinterpret_cast<const float4*>(p);
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          v[u] = __ldg(p4 + t + threadIdx.x + u * kThreads);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          uchar4 o;
          o.x = quantiseOne(v[u].x, true, scale, upper, lower);
          o.y = quantiseOne(v[u].y, true, scale, upper, lower);
          o.z = quantiseOne(v[u].z, true, scale, upper, lower);
          o.w = quantiseOne(v[u].w, true, scale, upper, lower);
          out[t + threadIdx.x + u * kThreads] = o;
        }
        continue;
      }
      // Chunk edge, unaligned chunk, padding or a non-finite chunk.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t q = t + threadIdx.x + static_cast<size_t>(u) * kThreads;
        if (q >= payloadQuads) {
          continue;
        }
        const size_t e = 4 * q;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (!skip) {
          if (vec && e + 4 <= r.n) {
            v = __ldg(reinterpret_cast<const float4*>(p + e));
          } else {
            v.x = e < r.n ? __ldg(p + e) : 0.0f;
            v.y = e + 1 < r.n ? __ldg(p + e + 1) : 0.0f;
            v.z = e + 2 < r.n ? __ldg(p + e + 2) : 0.0f;
            v.w = e + 3 < r.n ? __ldg(p + e + 3) : 0.0f;
          }
        }
        uchar4 o;
        o.x = quantiseOne(v.x, !skip && e < r.n, scale, upper, lower);
        o.y = quantiseOne(v.y, !skip && e + 1 < r.n, scale, upper, lower);
        o.z = quantiseOne(v.z, !skip && e + 2 < r.n, scale, upper, lower);
        o.w = quantiseOne(v.w, !skip && e + 3 < r.n, scale, upper, lower);
        out[q] = o;
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    dequantise(const uint8_t* __restrict__ src, size_t numel, size_t c, size_t firstChunk,
               size_t count, size_t stride, float* __restrict__ dst) {
  for (size_t k = blockIdx.y; k < count; k += gridDim.y) {
    const size_t chunk = firstChunk + k;
    const Range r = chunkRange(chunk, numel, c);
    const uint8_t* seg = src + chunk * stride;
    const float mn = __ldg(reinterpret_cast<const float*>(seg));
    const float mx = __ldg(reinterpret_cast<const float*>(seg) + 1);
    // A NaN header marks a non-finite chunk. Write the CPU's quiet NaN explicitly: arithmetic
    // on a NaN yields the GPU's canonical 0x7fffffff, not the header's bits.
    const bool nan = isnan(mn) || isnan(mx);
    float scale = 1.0f;
    float lower = 0.0f;
    if (!nan) {
      scale = 255.0f / (mx - mn + kEps);
      lower = rintf(mx * scale) - 255.0f;
    }
    const uchar4* in = reinterpret_cast<const uchar4*>(seg + 32);
    float* p = dst + r.begin;
    const bool vec = (reinterpret_cast<uintptr_t>(p) & 15) == 0;
    const size_t quads = (r.n + 3) / 4;  // within the padded payload
    for (size_t t = blockIdx.x * kTileQuads; t < quads; t += gridDim.x * kTileQuads) {
      if (!nan && vec && 4 * (t + kTileQuads) <= r.n) {
        // Whole tile inside the chunk, 16-byte aligned: no bounds checks.
        float4* p4 = reinterpret_cast<float4*>(p);
        uchar4 b[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          b[u] = __ldg(in + t + threadIdx.x + u * kThreads);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          float4 o;
          o.x = (static_cast<float>(b[u].x) + lower) / scale;
          o.y = (static_cast<float>(b[u].y) + lower) / scale;
          o.z = (static_cast<float>(b[u].z) + lower) / scale;
          o.w = (static_cast<float>(b[u].w) + lower) / scale;
          p4[t + threadIdx.x + u * kThreads] = o;
        }
        continue;
      }
      // Chunk edge, unaligned destination or a non-finite chunk.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t q = t + threadIdx.x + static_cast<size_t>(u) * kThreads;
        if (q >= quads) {
          continue;
        }
        float4 o;
        if (nan) {
          o.x = o.y = o.z = o.w = __uint_as_float(kNanBits);
        } else {
          const uchar4 b = __ldg(in + q);
          o.x = (static_cast<float>(b.x) + lower) / scale;
          o.y = (static_cast<float>(b.y) + lower) / scale;
          o.z = (static_cast<float>(b.z) + lower) / scale;
          o.w = (static_cast<float>(b.w) + lower) / scale;
        }
        const size_t e = 4 * q;
        if (vec && e + 4 <= r.n) {
          *reinterpret_cast<float4*>(p + e) = o;
        } else {
          p[e] = o.x;  // e < r.n since q < quads
          if (e + 1 < r.n) {
            p[e + 1] = o.y;
          }
          if (e + 2 < r.n) {
            p[e + 2] = o.z;
          }
          if (e + 3 < r.n) {
            p[e + 3] = o.w;
          }
        }
      }
    }
  }
}

// Blocks of `kernel` that fit on the whole current device at once (occupancy x SM count),
// queried once per (kernel, device): grids of exactly one wave, so no block starts late and
// leaves a tail.
enum KernelSlot { kFoldSlot = 0, kQuantiseSlot, kDequantiseSlot, kSlots };

size_t residentBlocks(const void* kernel, KernelSlot slot) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kSlots][kCachedDevices] = {};
  constexpr int kFallback = 132 * 4;  // an H100/H200 at half occupancy
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return kFallback;
  }
  const bool cacheable = dev >= 0 && dev < kCachedDevices;
  if (cacheable) {
    const int known = cache[slot][dev].load(std::memory_order_relaxed);
    if (known > 0) {
      return static_cast<size_t>(known);
    }
  }
  int sms = 0;
  int perSm = 0;
  int blocks = kFallback;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, kThreads, 0) == cudaSuccess &&
      sms > 0 && perSm > 0) {
    blocks = sms * perSm;
  } else {
    (void)cudaGetLastError();
  }
  if (cacheable) {
    cache[slot][dev].store(blocks, std::memory_order_relaxed);
  }
  return static_cast<size_t>(blocks);
}

// Grid of `count` chunks (y) by at most `perChunkMax` blocks (x), about `resident` in all.
dim3 chunkGrid(size_t perChunkMax, size_t count, size_t resident) {
  size_t perChunk = (resident + count - 1) / count;
  perChunk = perChunk == 0 ? 1 : perChunk;
  size_t x = perChunkMax < perChunk ? perChunkMax : perChunk;
  x = x == 0 ? 1 : x;
  const size_t y = count < kMaxGridY ? count : kMaxGridY;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y == 0 ? 1 : y), 1);
}

// Launches quantise with programmatic stream serialisation, so its blocks are scheduled while
// pass 1 drains (they wait in waitForPrimary) instead of after a full launch gap. Falls back to a
// plain launch, for good, where the attribute is refused.
cudaError_t launchQuantise(dim3 grid, cudaStream_t s, const float* src, size_t numel, size_t c,
                           size_t first, size_t count, size_t stride, unsigned* acc, uint8_t* dst) {
  static std::atomic<bool> refused{false};
  if (!refused.load(std::memory_order_relaxed)) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e =
        cudaLaunchKernelEx(&cfg, quantise, src, numel, c, first, count, stride, acc, dst);
    if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue) {
      return e;
    }
    (void)cudaGetLastError();
    refused.store(true, std::memory_order_relaxed);
  }
  quantise<<<grid, kThreads, 0, s>>>(src, numel, c, first, count, stride, acc, dst);
  return cudaGetLastError();
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
  // The chunk accumulators: 4 words per chunk of this call, in the caller's workspace (sized
  // for partialsPerChunk(c) >= 1 slots of 4 words per chunk).
  // c == 0 (no element) still runs both: quantise writes the zero headers.
  unsigned* acc = reinterpret_cast<unsigned*>(partials);
  // Pass 1: at most partialsPerChunk(c) blocks per chunk, fewer when one wave of the device is
  // reached.
  const dim3 g1 = chunkGrid(partialsPerChunk(c), count,
                            residentBlocks(reinterpret_cast<const void*>(&minMaxFold), kFoldSlot));
  minMaxFold<<<g1, kThreads, 0, s>>>(src, numel, c, first, count, acc);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return static_cast<int>(e);
  }
  const size_t tiles = (payload / 4 + kTileQuads - 1) / kTileQuads;
  const dim3 g2 = chunkGrid(
      tiles, count, residentBlocks(reinterpret_cast<const void*>(&quantise), kQuantiseSlot));
  return static_cast<int>(launchQuantise(g2, s, src, numel, c, first, count, stride, acc, dst));
}

int decompress(const uint8_t* src, size_t numel, size_t chunks, float* dst, int targetChunk,
               void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t c = (numel + chunks - 1) / chunks;
  if (c == 0) {
    return 0;
  }
  const size_t stride = (c + 31) / 32 * 32 + 32;
  const size_t first = targetChunk >= 0 ? static_cast<size_t>(targetChunk) : 0;
  const size_t count = targetChunk >= 0 ? 1 : chunks;
  const size_t tiles = ((c + 3) / 4 + kTileQuads - 1) / kTileQuads;
  const dim3 g = chunkGrid(
      tiles, count, residentBlocks(reinterpret_cast<const void*>(&dequantise), kDequantiseSlot));
  dequantise<<<g, kThreads, 0, s>>>(src, numel, c, first, count, stride, dst);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace bagua::algo::cudakernels
