// PowerSGD's batched kernels: each launch covers every matrix (or segment) of a bucket through a
// tile list built once per bucket layout on the host, so a bucket costs a fixed number of
// launches whatever its number of matrices. Products are memory-bound at the small ranks
// PowerSGD uses (a pass over M per product), so these are plain tiled loops: one warp per row
// for P = M Q, one thread per column over a chunk of rows for M^T P (partial sums reduced in a
// fixed order: deterministic), one block per matrix for Gram-Schmidt.
#include <cuda_runtime.h>

#include "powersgd_kernels.h"

namespace bagua::algo::cudakernels {

namespace {

using psgd::Matrix;
using psgd::Segment;
using psgd::Tile;

constexpr int kBlock = 256;
constexpr int kOrthBlock = 512;
// Ranks handled per pass of the products (register accumulators).
constexpr int kRankStep = 8;

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

// Sum over the block, in a fixed order; every thread gets it. `smem`: 33 floats.
__device__ float blockSum(float v, float* smem) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warpSum(v);
  if (lane == 0) {
    smem[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    float s = lane < warps ? smem[lane] : 0.0f;
    s = warpSum(s);
    if (lane == 0) {
      smem[32] = s;
    }
  }
  __syncthreads();
  const float out = smem[32];
  __syncthreads();  // smem is reused by the next call
  return out;
}

__global__ void projectKernel(float* flat, float* err, const float* q, float* p, const Matrix* mats,
                              const Tile* tiles) {
  const Tile t = tiles[blockIdx.x];
  const Matrix mt = mats[t.item];
  const int lane = threadIdx.x & 31;
  const int64_t i = t.begin + (threadIdx.x >> 5);
  if (i >= t.end) {
    return;  // the whole warp
  }
  const int64_t cols = mt.cols;
  const int r = mt.rank;
  float* row = flat + mt.offset + i * cols;
  float* erow = err != nullptr ? err + mt.errOffset + i * cols : nullptr;
  const float* qm = q + mt.qOffset;
  for (int k0 = 0; k0 < r; k0 += kRankStep) {
    const int kn = r - k0 < kRankStep ? r - k0 : kRankStep;
    float acc[kRankStep];
#pragma unroll
    for (int kk = 0; kk < kRankStep; ++kk) {
      acc[kk] = 0.0f;
    }
    for (int64_t j = lane; j < cols; j += 32) {
      float v = row[j];
      if (erow != nullptr && k0 == 0) {
        v = v + erow[j];
        row[j] = v;  // M, read back by this lane in the later rank passes
      }
      const float* qj = qm + j * r + k0;
#pragma unroll
      for (int kk = 0; kk < kRankStep; ++kk) {
        if (kk < kn) {
          acc[kk] += v * qj[kk];
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kRankStep; ++kk) {
      const float s = warpSum(acc[kk]);
      if (lane == 0 && kk < kn) {
        p[mt.pOffset + i * r + k0 + kk] = s;
      }
    }
  }
}

__global__ void orthogonalizeKernel(float* buf, const Matrix* mats, int which, float eps,
                                    int redraw, uint64_t seed, uint64_t generation) {
  __shared__ float smem[33];
  const Matrix mt = mats[blockIdx.x];
  const int r = mt.rank;
  const int64_t dim = which == 0 ? mt.rows : mt.cols;
  float* x = buf + (which == 0 ? mt.pOffset : mt.qOffset);
  // Each thread owns rows threadIdx.x + t * blockDim.x: only blockSum crosses threads.
  for (int k = 0; k < r; ++k) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = x[i * r + k];
      s += v * v;
    }
    float nrm2 = blockSum(s, smem);
    if (redraw && nrm2 == 0.0f) {
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        x[i * r + k] =
            psgd::uniformDraw(seed, mt.key, generation, static_cast<uint64_t>(i * r + k));
      }
      for (int c = 0; c < k; ++c) {
        float d = 0.0f;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
          d += x[i * r + c] * x[i * r + k];
        }
        d = blockSum(d, smem);
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
          x[i * r + k] -= d * x[i * r + c];
        }
      }
      s = 0.0f;
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = x[i * r + k];
        s += v * v;
      }
      nrm2 = blockSum(s, smem);
    }
    const float nrm = sqrtf(nrm2);
    if (nrm > 0.0f || eps > 0.0f) {
      const float den = nrm + eps;
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        x[i * r + k] = x[i * r + k] / den;
      }
    }
    for (int c = k + 1; c < r; ++c) {
      float d = 0.0f;
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        d += x[i * r + k] * x[i * r + c];
      }
      d = blockSum(d, smem);
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        x[i * r + c] -= d * x[i * r + k];
      }
    }
  }
}

// Partial sums of M^T P over one chunk of kRowChunk rows, for kColBlock columns.
__global__ void backProjectPartialKernel(const float* flat, const float* p, float* partials,
                                         const Matrix* mats, const Tile* tiles) {
  const Tile t = tiles[blockIdx.x];
  const Matrix mt = mats[t.item];
  const int64_t c0 = t.begin;
  const int64_t j = t.end + threadIdx.x;
  const int64_t cols = mt.cols;
  if (j >= cols) {
    return;
  }
  const int r = mt.rank;
  const int64_t rowsHere = mt.rows - c0 < psgd::kRowChunk ? mt.rows - c0 : psgd::kRowChunk;
  const int64_t chunk = c0 / psgd::kRowChunk;
  const float* m = flat + mt.offset + c0 * cols + j;
  const float* pm = p + mt.pOffset + c0 * r;  // the same address across the warp: a broadcast
  float* out = partials + mt.partOffset + (chunk * cols + j) * r;
  for (int k0 = 0; k0 < r; k0 += kRankStep) {
    const int kn = r - k0 < kRankStep ? r - k0 : kRankStep;
    float acc[kRankStep];
#pragma unroll
    for (int kk = 0; kk < kRankStep; ++kk) {
      acc[kk] = 0.0f;
    }
    for (int64_t ii = 0; ii < rowsHere; ++ii) {
      const float v = m[ii * cols];
#pragma unroll
      for (int kk = 0; kk < kRankStep; ++kk) {
        if (kk < kn) {
          acc[kk] += v * pm[ii * r + k0 + kk];
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kRankStep; ++kk) {
      if (kk < kn) {
        out[k0 + kk] = acc[kk];
      }
    }
  }
}

// One warp per element of Q: its lanes sum the element's partials (one per row chunk) in a
// fixed order, so the result does not depend on scheduling.
__global__ void backProjectReduceKernel(const float* partials, float* q, const Matrix* mats,
                                        const Tile* tiles) {
  const Tile t = tiles[blockIdx.x];
  const Matrix mt = mats[t.item];
  const int64_t chunks = (mt.rows + psgd::kRowChunk - 1) / psgd::kRowChunk;
  const int64_t stride = static_cast<int64_t>(mt.cols) * mt.rank;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  for (int64_t e = t.begin + (threadIdx.x >> 5); e < t.end; e += warps) {
    const float* src = partials + mt.partOffset + e;
    float s = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
      s += src[c * stride];
    }
    s = warpSum(s);
    if (lane == 0) {
      q[mt.qOffset + e] = s;
    }
  }
}

__global__ void reconstructKernel(float* flat, float* err, const float* p, const float* q,
                                  const Matrix* mats, const Tile* tiles) {
  const Tile t = tiles[blockIdx.x];
  const Matrix mt = mats[t.item];
  const int64_t cols = mt.cols;
  const int r = mt.rank;
  for (int64_t e = t.begin + threadIdx.x; e < t.end; e += blockDim.x) {
    const int64_t i = e / cols;
    const int64_t j = e - i * cols;
    const float* pi = p + mt.pOffset + i * r;
    const float* qj = q + mt.qOffset + j * r;
    float a = 0.0f;
    for (int k = 0; k < r; ++k) {
      a += pi[k] * qj[k];
    }
    float* m = flat + mt.offset + e;
    if (err != nullptr) {
      err[mt.errOffset + e] = *m - a;
    }
    *m = a;
  }
}

__global__ void fillRandomKernel(float* q, const Matrix* mats, const Tile* tiles, uint64_t seed,
                                 uint64_t generation) {
  const Tile t = tiles[blockIdx.x];
  const Matrix mt = mats[t.item];
  for (int64_t e = t.begin + threadIdx.x; e < t.end; e += blockDim.x) {
    q[mt.qOffset + e] = psgd::uniformDraw(seed, mt.key, generation, static_cast<uint64_t>(e));
  }
}

__global__ void segmentsKernel(float* flat, float* pack, const Segment* segs, const Tile* tiles,
                               int toPack, float divisor) {
  const Tile t = tiles[blockIdx.x];
  const Segment s = segs[t.item];
  for (int64_t e = t.begin + threadIdx.x; e < t.end; e += blockDim.x) {
    if (toPack) {
      pack[s.dst + e] = flat[s.src + e];
    } else {
      flat[s.src + e] = pack[s.dst + e] / divisor;
    }
  }
}

__global__ void columnNormsKernel(const float* q, float* norms, const Matrix* mats) {
  __shared__ float smem[33];
  const Matrix mt = mats[blockIdx.x];
  const int r = mt.rank;
  const float* x = q + mt.qOffset;
  for (int k = 0; k < r; ++k) {
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < mt.cols; j += blockDim.x) {
      const float v = x[j * r + k];
      s += v * v;
    }
    s = blockSum(s, smem);
    if (threadIdx.x == 0) {
      norms[mt.normOffset + k] = sqrtf(s);
    }
  }
}

__global__ void scaleColumnsKernel(float* buf, const float* norms, const Matrix* mats,
                                   const Tile* tiles, int which, int divide) {
  const Tile t = tiles[blockIdx.x];
  const Matrix mt = mats[t.item];
  const int r = mt.rank;
  const float dim = static_cast<float>(which == 0 ? mt.rows : mt.cols);
  float* x = buf + (which == 0 ? mt.pOffset : mt.qOffset);
  for (int64_t e = t.begin + threadIdx.x; e < t.end; e += blockDim.x) {
    const float nrm = norms[mt.normOffset + static_cast<int>(e % r)];
    const float s = nrm > 0.0f && isfinite(nrm) ? sqrtf(dim) / nrm : 1.0f;
    x[e] = divide ? x[e] / s : x[e] * s;
  }
}

int launched() {
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int psgdProject(float* flat, float* err, const float* q, float* p, const Matrix* mats,
                const Tile* rowTiles, int tiles) {
  if (tiles == 0) {
    return 0;
  }
  projectKernel<<<tiles, psgd::kRowsPerTile * 32, 0, cudaStreamPerThread>>>(flat, err, q, p, mats,
                                                                            rowTiles);
  return launched();
}

int psgdOrthogonalize(float* buf, const Matrix* mats, int count, int which, float eps, bool redraw,
                      uint64_t seed, uint64_t generation) {
  if (count == 0) {
    return 0;
  }
  orthogonalizeKernel<<<count, kOrthBlock, 0, cudaStreamPerThread>>>(
      buf, mats, which, eps, redraw ? 1 : 0, seed, generation);
  return launched();
}

int psgdBackProject(const float* flat, const float* p, float* partials, float* q,
                    const Matrix* mats, const Tile* qTiles, int tiles, const Tile* qReduceTiles,
                    int reduceTiles) {
  if (tiles == 0) {
    return 0;
  }
  backProjectPartialKernel<<<tiles, psgd::kColBlock, 0, cudaStreamPerThread>>>(flat, p, partials,
                                                                               mats, qTiles);
  const int e = launched();
  if (e != 0 || reduceTiles == 0) {
    return e;
  }
  backProjectReduceKernel<<<reduceTiles, kBlock, 0, cudaStreamPerThread>>>(partials, q, mats,
                                                                           qReduceTiles);
  return launched();
}

int psgdReconstruct(float* flat, float* err, const float* p, const float* q, const Matrix* mats,
                    const Tile* elemTiles, int tiles) {
  if (tiles == 0) {
    return 0;
  }
  reconstructKernel<<<tiles, kBlock, 0, cudaStreamPerThread>>>(flat, err, p, q, mats, elemTiles);
  return launched();
}

int psgdFillRandom(float* q, const Matrix* mats, const Tile* qElemTiles, int tiles, uint64_t seed,
                   uint64_t generation) {
  if (tiles == 0) {
    return 0;
  }
  fillRandomKernel<<<tiles, kBlock, 0, cudaStreamPerThread>>>(q, mats, qElemTiles, seed,
                                                              generation);
  return launched();
}

int psgdSegments(float* flat, float* pack, const Segment* segs, const Tile* segTiles, int tiles,
                 bool toPack, float divisor) {
  if (tiles == 0) {
    return 0;
  }
  segmentsKernel<<<tiles, kBlock, 0, cudaStreamPerThread>>>(flat, pack, segs, segTiles,
                                                            toPack ? 1 : 0, divisor);
  return launched();
}

int psgdColumnNorms(const float* q, float* norms, const Matrix* mats, int count) {
  if (count == 0) {
    return 0;
  }
  columnNormsKernel<<<count, kBlock, 0, cudaStreamPerThread>>>(q, norms, mats);
  return launched();
}

int psgdScaleColumns(float* buf, const float* norms, const Matrix* mats, const Tile* tiles,
                     int count, int which, bool divide) {
  if (count == 0) {
    return 0;
  }
  scaleColumnsKernel<<<count, kBlock, 0, cudaStreamPerThread>>>(buf, norms, mats, tiles, which,
                                                                divide ? 1 : 0);
  return launched();
}

}  // namespace bagua::algo::cudakernels
