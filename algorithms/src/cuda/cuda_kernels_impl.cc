// The CUDA half's CudaKernels (cuda_kernels.h): each call forwards to the kernels' entry point of
// the same name; registered with algorithms when this library is loaded (or, linked statically,
// before main()).
#include <cuda_runtime_api.h>

#if BAGUA_ALGO_WITH_NCCL
#include <nccl.h>
#endif

#include "bagua/base/cuda_check.h"
#include "cuda/minmax_kernels.h"
#include "cuda/powersgd_kernels.h"
#include "cuda/vector_kernels.h"
#include "cuda_kernels.h"

namespace bagua::algo::detail {

namespace {

namespace k = cudakernels;

class CudaRuntimeKernels final : public CudaKernels {
 public:
  Status status(int err, const std::string& what, const char* file, int line) override {
    return cudaStatus(static_cast<cudaError_t>(err), what, file, line);
  }
  int ncclVersion() override {
#if BAGUA_ALGO_WITH_NCCL
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
#else
    return 0;
#endif
  }

  int setDevice(int device) override {
    return k::setDevice(device);
  }
  int deviceAlloc(void** out, size_t bytes) override {
    return k::deviceAlloc(out, bytes);
  }
  void deviceFree(void* p) override {
    k::deviceFree(p);
  }
  int copy(void* dst, const void* src, size_t bytes) override {
    return k::copy(dst, src, bytes);
  }
  int zero(void* dst, size_t bytes) override {
    return k::zero(dst, bytes);
  }
  int copyToHost(void* hostDst, const void* src, size_t bytes) override {
    return k::copyToHost(hostDst, src, bytes);
  }
  int copyFromHost(void* dst, const void* hostSrc, size_t bytes) override {
    return k::copyFromHost(dst, hostSrc, bytes);
  }
  int queryStream() override {
    return k::queryStream();
  }
  void* perThreadStream() override {
    return k::perThreadStream();
  }
  int eventRecord(void** event, void* stream) override {
    return k::eventRecord(event, stream);
  }
  int eventQuery(void* event) override {
    return k::eventQuery(event);
  }
  void eventDestroy(void* event) override {
    k::eventDestroy(event);
  }
  int reduceChunks(const float* chunks, size_t n, size_t c, bool average, float* out) override {
    return k::reduceChunks(chunks, n, c, average, out);
  }
  int averagePair(float* a, const float* b, size_t n) override {
    return k::averagePair(a, b, n);
  }
  int lowPrecisionDiff(float* d, const float* x, const float* l, const float* r, const float* w,
                       size_t n) override {
    return k::lowPrecisionDiff(d, x, l, r, w, n);
  }
  int addInPlace(float* a, const float* b, size_t n) override {
    return k::addInPlace(a, b, n);
  }
  int addAndCopy(float* w, const float* d, float* x, size_t n) override {
    return k::addAndCopy(w, d, x, n);
  }
  int divideInPlace(float* a, float divisor, size_t n) override {
    return k::divideInPlace(a, divisor, n);
  }
  int qadamStep(float* x, const float* grad, float* m, float* v, size_t n, bool warm,
                float weightDecay, float b1, float b2, float ob1, float ob2, float stepSize,
                float bc2Sqrt, float eps, bool hold) override {
    return k::qadamStep(x, grad, m, v, n, warm, weightDecay, b1, b2, ob1, ob2, stepSize, bc2Sqrt,
                        eps, hold);
  }
  int momentumMix(float* slot, const float* m, float b1, float ob1, size_t n) override {
    return k::momentumMix(slot, m, b1, ob1, n);
  }
  int addMeanMinusSnapshot(float* w, const float* sum, const float* snap, float n,
                           size_t count) override {
    return k::addMeanMinusSnapshot(w, sum, snap, n, count);
  }

  int compress(const float* src, size_t numel, size_t chunks, uint8_t* dst, float* partials,
               int targetChunk, void* stream) override {
    return k::compress(src, numel, chunks, dst, partials, targetChunk, stream);
  }
  int decompress(const uint8_t* src, size_t numel, size_t chunks, float* dst, int targetChunk,
                 void* stream) override {
    return k::decompress(src, numel, chunks, dst, targetChunk, stream);
  }

  int psgdProject(float* flat, float* err, const float* q, float* p, const algo::psgd::Matrix* mats,
                  const algo::psgd::Tile* rowTiles, int tiles) override {
    return k::psgdProject(flat, err, q, p, mats, rowTiles, tiles);
  }
  int psgdOrthogonalize(float* buf, const algo::psgd::Matrix* mats, int count, int which, float eps,
                        bool redraw, uint64_t seed, uint64_t generation) override {
    return k::psgdOrthogonalize(buf, mats, count, which, eps, redraw, seed, generation);
  }
  int psgdBackProject(const float* flat, const float* p, float* partials, float* q,
                      const algo::psgd::Matrix* mats, const algo::psgd::Tile* qTiles, int tiles,
                      const algo::psgd::Tile* qReduceTiles, int reduceTiles) override {
    return k::psgdBackProject(flat, p, partials, q, mats, qTiles, tiles, qReduceTiles, reduceTiles);
  }
  int psgdReconstruct(float* flat, float* err, const float* p, const float* q,
                      const algo::psgd::Matrix* mats, const algo::psgd::Tile* elemTiles,
                      int tiles) override {
    return k::psgdReconstruct(flat, err, p, q, mats, elemTiles, tiles);
  }
  int psgdFillRandom(float* q, const algo::psgd::Matrix* mats, const algo::psgd::Tile* qElemTiles,
                     int tiles, uint64_t seed, uint64_t generation) override {
    return k::psgdFillRandom(q, mats, qElemTiles, tiles, seed, generation);
  }
  int psgdSegments(float* flat, float* pack, const algo::psgd::Segment* segs,
                   const algo::psgd::Tile* segTiles, int tiles, bool toPack,
                   float divisor) override {
    return k::psgdSegments(flat, pack, segs, segTiles, tiles, toPack, divisor);
  }
  int psgdColumnNorms(const float* q, float* norms, const algo::psgd::Matrix* mats,
                      int count) override {
    return k::psgdColumnNorms(q, norms, mats, count);
  }
  int psgdScaleColumns(float* buf, const float* norms, const algo::psgd::Matrix* mats,
                       const algo::psgd::Tile* tiles, int count, int which, bool divide) override {
    return k::psgdScaleColumns(buf, norms, mats, tiles, count, which, divide);
  }
};

// Registers at load time: before main() where the CUDA half is linked in, during dlopen() where
// algorithms loads it (cudaKernels()).
[[maybe_unused]] const bool kRegistered = [] {
  static CudaRuntimeKernels kernels;
  registerCudaKernels(&kernels);
  return true;
}();

}  // namespace

}  // namespace bagua::algo::detail
