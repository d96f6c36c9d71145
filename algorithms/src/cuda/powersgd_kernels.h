// PowerSGD's batched steps on the device (compiled by nvcc, called from powersgd_ops.cc), and
// the plain-old-data layout they share with the host loops. Every entry point enqueues on the
// calling thread's per-thread default stream, launches a fixed number of kernels for a whole
// bucket (never one per matrix) and returns a cudaError_t value (0: success). Private.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define BAGUA_PSGD_HD __host__ __device__
#else
#define BAGUA_PSGD_HD
#endif

namespace bagua::algo::psgd {

// One compressed matrix of a bucket (rows x cols, row-major in the bucket at `offset`), and
// where its pieces live in the bucket state's buffers. Copied to the device as is.
struct Matrix {
  int64_t offset = 0;      // first element in the bucket
  int64_t errOffset = 0;   // in the error buffer (compressed matrices back to back)
  int64_t pOffset = 0;     // in P (rows x rank, row-major)
  int64_t qOffset = 0;     // in Q (cols x rank, row-major)
  int64_t partOffset = 0;  // in the device's partial sums of M^T P
  int32_t rows = 0;
  int32_t cols = 0;
  int32_t rank = 0;
  int32_t normOffset = 0;  // in the column norms (rank floats per matrix)
  uint32_t key = 0;        // the tensor's identity for the random Q (its parameter index)
  uint32_t pad = 0;
};

// A run of uncompressed elements: bucket[src, src + len) <-> pack[dst, dst + len).
struct Segment {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t len = 0;
};

// A block's share of a batched kernel: `item` (a matrix or a segment) and a range whose meaning
// depends on the kernel (rows, elements, or a row chunk and a column block).
struct Tile {
  int32_t item = 0;
  int32_t pad = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// Rows of M summed per partial in the device's M^T P (and so partial sums per column).
inline constexpr int kRowChunk = 32;
// Columns of M per block of the device's M^T P.
inline constexpr int kColBlock = 256;
// Rows per block of P = M Q (one warp each).
inline constexpr int kRowsPerTile = 8;
// Elements per block of the element-wise kernels.
inline constexpr int64_t kElemTile = 4096;
// Elements of Q per block of the sum of M^T P's partials (a warp per element).
inline constexpr int64_t kReduceTile = 64;

// SplitMix64's finaliser.
BAGUA_PSGD_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform draw in [-1, 1) that depends only on its arguments (so every rank, and the host and
// the device, draw the same Q): 24 random bits, exact in float.
BAGUA_PSGD_HD inline float uniformDraw(uint64_t seed, uint32_t key, uint64_t generation,
                                       uint64_t index) {
  const uint64_t h =
      mix64(seed ^ mix64((static_cast<uint64_t>(key) << 32) ^ mix64(generation ^ mix64(index))));
  return static_cast<float>(static_cast<uint32_t>(h >> 40)) * (1.0f / 8388608.0f) - 1.0f;
}

}  // namespace bagua::algo::psgd

namespace bagua::algo::cudakernels {

// flat[M] += err[M] (err may be null: no error feedback), then P = M Q for every matrix.
// rowTiles: item = matrix, [begin, end) rows (at most kRowsPerTile).
int psgdProject(float* flat, float* err, const float* q, float* p, const psgd::Matrix* mats,
                const psgd::Tile* rowTiles, int tiles);
// Gram-Schmidt on the columns of each matrix's factor in `buf` (which = 0: P, rows x rank;
// 1: Q, cols x rank), one block per matrix. A column of norm 0 is redrawn at random when
// `redraw` (seed, generation) and is otherwise left at 0; eps is added to each norm.
int psgdOrthogonalize(float* buf, const psgd::Matrix* mats, int count, int which, float eps,
                      bool redraw, uint64_t seed, uint64_t generation);
// Q = M^T P in two passes: partial sums over row chunks (qTiles: item = matrix, begin = first
// row of the chunk, end = first column of the block), then their sum in a fixed order
// (qReduceTiles: item = matrix, [begin, end) elements of its Q, at most kReduceTile).
int psgdBackProject(const float* flat, const float* p, float* partials, float* q,
                    const psgd::Matrix* mats, const psgd::Tile* qTiles, int tiles,
                    const psgd::Tile* qReduceTiles, int reduceTiles);
// approx = P Q^T; err = M - approx (err may be null); flat[M] = approx.
// elemTiles: item = matrix, [begin, end) elements of the matrix.
int psgdReconstruct(float* flat, float* err, const float* p, const float* q,
                    const psgd::Matrix* mats, const psgd::Tile* elemTiles, int tiles);
// Q = uniform draws (seed, the matrix's key, generation, element index).
int psgdFillRandom(float* q, const psgd::Matrix* mats, const psgd::Tile* qElemTiles, int tiles,
                   uint64_t seed, uint64_t generation);
// toPack: pack[dst..] = flat[src..]; else flat[src..] = pack[dst..] / divisor.
// segTiles: item = segment, [begin, end) elements of it.
int psgdSegments(float* flat, float* pack, const psgd::Segment* segs, const psgd::Tile* segTiles,
                 int tiles, bool toPack, float divisor);
// norms[normOffset + k] = |column k| of each matrix's Q, one block per matrix.
int psgdColumnNorms(const float* q, float* norms, const psgd::Matrix* mats, int count);
// Each column k of each matrix's factor (which = 0: P, 1: Q) times (divide: divided by)
// s = sqrt(dim) / norms[normOffset + k] (dim: rows for P, cols for Q; s = 1 when the norm is 0
// or not finite). tiles: item = matrix, [begin, end) elements of its factor.
int psgdScaleColumns(float* buf, const float* norms, const psgd::Matrix* mats,
                     const psgd::Tile* tiles, int count, int which, bool divide);

}  // namespace bagua::algo::cudakernels
