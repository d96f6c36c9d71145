// The seam between algorithms and its CUDA half (algorithms-private).
//
// libbagua_algorithms holds everything a CPU-only program needs and neither links nor includes
// CUDA or NCCL. The CUDA half, libbagua_algorithms_cuda (src/cuda/: the kernels and
// cuda_kernels_impl.cc), implements CudaKernels and registers it from a static initializer; the
// CPU library reaches it through cudaKernels(), which loads the shared half by its SONAME the
// first time a tensor on a CUDA device needs it (bagua/base/cuda_half.h: the one loading
// mechanism every bagua library shares). Host tensors never load it.
//
// Each call is the entry point of the same name in cuda/vector_kernels.h, cuda/minmax_kernels.h
// or cuda/powersgd_kernels.h: they return cudaError_t values as int (0: success; eventQuery and
// queryStream: 1 while pending), which status() turns into a kCudaError Status.
//
// Thread safety: as the CUDA runtime (per-thread current device, cudaStreamPerThread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bagua/base/status.h"
#include "cuda/powersgd_kernels.h"

namespace bagua::algo::detail {

class CudaKernels {
 public:
  virtual ~CudaKernels() = default;

  // Ok for 0, else kCudaError "<what>: <the runtime's text> (<error name>)" at file:line.
  virtual Status status(int err, const std::string& what, const char* file, int line) = 0;
  // ncclGetVersion (e.g. 22809), or 0 where the half was built without NCCL.
  virtual int ncclVersion() = 0;

  // ---- cuda/vector_kernels.h ---------------------------------------------------------------
  virtual int setDevice(int device) = 0;
  virtual int deviceAlloc(void** out, size_t bytes) = 0;
  virtual void deviceFree(void* p) = 0;
  virtual int copy(void* dst, const void* src, size_t bytes) = 0;
  virtual int zero(void* dst, size_t bytes) = 0;
  virtual int copyToHost(void* hostDst, const void* src, size_t bytes) = 0;
  virtual int copyFromHost(void* dst, const void* hostSrc, size_t bytes) = 0;
  virtual int queryStream() = 0;
  virtual void* perThreadStream() = 0;
  virtual int eventRecord(void** event, void* stream) = 0;
  virtual int eventQuery(void* event) = 0;
  virtual void eventDestroy(void* event) = 0;
  virtual int reduceChunks(const float* chunks, size_t n, size_t c, bool average, float* out) = 0;
  virtual int averagePair(float* a, const float* b, size_t n) = 0;
  virtual int lowPrecisionDiff(float* d, const float* x, const float* l, const float* r,
                               const float* w, size_t n) = 0;
  virtual int addInPlace(float* a, const float* b, size_t n) = 0;
  virtual int addAndCopy(float* w, const float* d, float* x, size_t n) = 0;
  virtual int divideInPlace(float* a, float divisor, size_t n) = 0;
  virtual int qadamStep(float* x, const float* grad, float* m, float* v, size_t n, bool warm,
                        float weightDecay, float b1, float b2, float ob1, float ob2, float stepSize,
                        float bc2Sqrt, float eps, bool hold) = 0;
  virtual int momentumMix(float* slot, const float* m, float b1, float ob1, size_t n) = 0;
  virtual int addMeanMinusSnapshot(float* w, const float* sum, const float* snap, float n,
                                   size_t count) = 0;

  // ---- cuda/minmax_kernels.h -----------------------------------------------------------------
  virtual int compress(const float* src, size_t numel, size_t chunks, uint8_t* dst, float* partials,
                       int targetChunk, void* stream) = 0;
  virtual int decompress(const uint8_t* src, size_t numel, size_t chunks, float* dst,
                         int targetChunk, void* stream) = 0;

  // ---- cuda/powersgd_kernels.h ---------------------------------------------------------------
  virtual int psgdProject(float* flat, float* err, const float* q, float* p,
                          const algo::psgd::Matrix* mats, const algo::psgd::Tile* rowTiles,
                          int tiles) = 0;
  virtual int psgdOrthogonalize(float* buf, const algo::psgd::Matrix* mats, int count, int which,
                                float eps, bool redraw, uint64_t seed, uint64_t generation) = 0;
  virtual int psgdBackProject(const float* flat, const float* p, float* partials, float* q,
                              const algo::psgd::Matrix* mats, const algo::psgd::Tile* qTiles,
                              int tiles, const algo::psgd::Tile* qReduceTiles, int reduceTiles) = 0;
  virtual int psgdReconstruct(float* flat, float* err, const float* p, const float* q,
                              const algo::psgd::Matrix* mats, const algo::psgd::Tile* elemTiles,
                              int tiles) = 0;
  virtual int psgdFillRandom(float* q, const algo::psgd::Matrix* mats,
                             const algo::psgd::Tile* qElemTiles, int tiles, uint64_t seed,
                             uint64_t generation) = 0;
  virtual int psgdSegments(float* flat, float* pack, const algo::psgd::Segment* segs,
                           const algo::psgd::Tile* segTiles, int tiles, bool toPack,
                           float divisor) = 0;
  virtual int psgdColumnNorms(const float* q, float* norms, const algo::psgd::Matrix* mats,
                              int count) = 0;
  virtual int psgdScaleColumns(float* buf, const float* norms, const algo::psgd::Matrix* mats,
                               const algo::psgd::Tile* tiles, int count, int which,
                               bool divide) = 0;
};

// Called once by the CUDA half (a later call replaces the pointer).
void registerCudaKernels(CudaKernels* kernels);

// The registered half, or null: for paths that run only once it is in use (freeing a device
// buffer it allocated).
CudaKernels* registeredCudaKernels();

// The CUDA half, loading libbagua_algorithms_cuda when it is not registered yet; the error says
// what is missing and how to get it (kFailedPrecondition).
Result<CudaKernels*> cudaKernels();

}  // namespace bagua::algo::detail
