// Buffers and element-wise steps of the algorithms on host or device memory, so one algorithm
// body serves both (ByteGrad, decentralized, low-precision decentralized, gradient all-reduce's
// average fallback). Private to algorithms/.
//
// Device work runs on the calling thread's per-thread default stream (cudaStreamPerThread, which
// orders itself after the legacy default stream the trainer uses by default); every call only
// enqueues, and sync() waits for it with a deadline. Call sync() before a collective reads what
// a step wrote, and after a collective's Work completed the host may enqueue steps on its result.
// The host versions run at once and are the reference: the device kernels do the same float32
// operations in the same order (compiled with -fmad=false), so results are bit-identical.
//
// Thread safety: as the memory they touch; each thread syncs its own stream.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "bagua/base/status.h"
#include "bagua/core/types.h"

namespace bagua::algo::detail {

// Where a bucket or weight view lives.
struct Exec {
  bool device = false;
  int deviceIndex = 0;
};

// FailedPrecondition naming `what` when `device` is a CUDA device and the algorithms' CUDA half
// (cuda_kernels.h) is not built or does not load; the first device tensor loads it.
Result<Exec> execFor(const core::Device& device, const char* what);

// Host (heap) or device (cudaMalloc) bytes, zero-initialised. Move-only.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Keeps the buffer if it already holds `bytes` on `exec`, else reallocates (contents lost).
  [[nodiscard]] Status ensure(const Exec& exec, size_t bytes);
  float* f32() { return static_cast<float*>(data_); }
  uint8_t* u8() { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool device_ = false;
  int deviceIndex_ = 0;
};

[[nodiscard]] Status copyBytes(const Exec& exec, void* dst, const void* src, size_t bytes);
// Device (or host) to host, synchronous: for tests and debugging, never on the data path.
[[nodiscard]] Status copyToHost(const Exec& exec, void* hostDst, const void* src, size_t bytes);
// Host to device (or host), synchronous: checkpoints and tests, never on the data path.
[[nodiscard]] Status copyFromHost(const Exec& exec, void* dst, const void* hostSrc, size_t bytes);
[[nodiscard]] Status zeroBytes(const Exec& exec, void* dst, size_t bytes);
// MinMaxUInt8 (compression.h) on either side; `workspace` is grown as the device needs.
[[nodiscard]] Status compress(const Exec& exec, const float* src, size_t numel, size_t chunks,
                              uint8_t* dst, size_t dstBytes, Buffer& workspace,
                              int targetChunk = -1);
[[nodiscard]] Status decompress(const Exec& exec, const uint8_t* src, size_t srcBytes, size_t numel,
                                size_t chunks, float* dst, int targetChunk = -1);
// out[i] = chunks[i] + chunks[c + i] + ... (rank order), then / n if average.
[[nodiscard]] Status reduceChunks(const Exec& exec, const float* chunks, size_t n, size_t c,
                                  bool average, float* out);
// a[i] = (a[i] + b[i]) / 2.
[[nodiscard]] Status averagePair(const Exec& exec, float* a, const float* b, size_t n);
// d[i] = x[i] + l[i] * (1/3) + r[i] * (1/3) - w[i] * (5/3).
[[nodiscard]] Status lowPrecisionDiff(const Exec& exec, float* d, const float* x, const float* l,
                                      const float* r, const float* w, size_t n);
// a[i] += b[i].
[[nodiscard]] Status addInPlace(const Exec& exec, float* a, const float* b, size_t n);
// w[i] += d[i]; x[i] = w[i].
[[nodiscard]] Status addAndCopy(const Exec& exec, float* w, const float* d, float* x, size_t n);
// a[i] /= divisor (the average of a summed all-reduce).
[[nodiscard]] Status divideInPlace(const Exec& exec, float* a, float divisor, size_t n);
// QAdam's per-element step (qadam.h), parameters of one step:
struct QAdamStepArgs {
  bool warm = false;  // t < warmup_steps: update m and v from the gradient first
  float weightDecay = 0.0f;
  float b1 = 0.0f;
  float b2 = 0.0f;
  float ob1 = 0.0f;       // 1 - b1
  float ob2 = 0.0f;       // 1 - b2
  float stepSize = 0.0f;  // lr / (1 - b1^t)
  float bc2Sqrt = 0.0f;   // sqrt(1 - b2^t)
  float eps = 0.0f;
  bool holdZeroVariance = false;  // skip the update of elements with v == 0 (not with warm)
};
// if warm: g = grad[i] (+ x[i] * weightDecay); m = m*b1 + g*ob1; v = v*b2 + g*g*ob2;
// then, unless holdZeroVariance and v == 0 (x[i] stays as it is),
// x[i] = x[i] + (-stepSize) * (m / (sqrt(v) / bc2Sqrt + eps)).
[[nodiscard]] Status qadamStep(const Exec& exec, float* x, const float* grad, float* m, float* v,
                               size_t n, const QAdamStepArgs& a);
// slot[i] = m[i] * b1 + slot[i] * ob1 (QAdam's momentum from the local gradient in slot).
[[nodiscard]] Status momentumMix(const Exec& exec, float* slot, const float* m, float b1, float ob1,
                                 size_t n);
// w[i] += sum[i] / n - snap[i] (async model average: the mean minus the snapshot it was taken
// from, so local updates made meanwhile are kept).
[[nodiscard]] Status addMeanMinusSnapshot(const Exec& exec, float* w, const float* sum,
                                          const float* snap, float n, size_t count);
// Waits, within `timeout`, for the work enqueued so far on another stream of the device (a
// cudaStream_t; nullptr: the legacy default stream), e.g. the trainer's. No-op on the host.
[[nodiscard]] Status waitForStream(const Exec& exec, void* stream,
                                   std::chrono::milliseconds timeout);
// Waits for the device work this thread enqueued (no-op on the host).
[[nodiscard]] Status sync(const Exec& exec, std::chrono::milliseconds timeout);

}  // namespace bagua::algo::detail
