// Element-wise CUDA kernels of the algorithms. Each mirrors the host loop of vec_ops.cc operation
// by operation (compiled with -fmad=false: no FMA contraction), so device and host results are
// bit-identical.
#include <cuda_runtime.h>

#include "minmax_kernels.h"
#include "vector_kernels.h"

namespace bagua::algo::cudakernels {

namespace {

constexpr float kThird = 1.0f / 3.0f;
constexpr float kFiveThirds = 5.0f / 3.0f;

unsigned blocksFor(size_t n) {
  size_t g = (n + kThreads - 1) / kThreads;
  g = g == 0 ? 1 : g;
  return static_cast<unsigned>(g > 65535 ? 65535 : g);
}

#define BAGUA_GRID_LOOP(i, n)                                                          \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void reduceChunksKernel(const float* chunks, size_t n, size_t c, int average,
                                   float* out) {
  BAGUA_GRID_LOOP(i, c) {
    float acc = chunks[i];
    for (size_t j = 1; j < n; ++j) {
      acc += chunks[j * c + i];
    }
    if (average) {
      acc /= static_cast<float>(n);
    }
    out[i] = acc;
  }
}

__global__ void averagePairKernel(float* a, const float* b, size_t n) {
  BAGUA_GRID_LOOP(i, n) {
    a[i] = (a[i] + b[i]) / 2.0f;
  }
}

__global__ void lowPrecisionDiffKernel(float* d, const float* x, const float* l, const float* r,
                                       const float* w, size_t n) {
  BAGUA_GRID_LOOP(i, n) {
    d[i] = x[i] + l[i] * kThird + r[i] * kThird - w[i] * kFiveThirds;
  }
}

__global__ void addInPlaceKernel(float* a, const float* b, size_t n) {
  BAGUA_GRID_LOOP(i, n) {
    a[i] += b[i];
  }
}

__global__ void addAndCopyKernel(float* w, const float* d, float* x, size_t n) {
  BAGUA_GRID_LOOP(i, n) {
    w[i] += d[i];
    x[i] = w[i];
  }
}

__global__ void divideInPlaceKernel(float* a, float divisor, size_t n) {
  BAGUA_GRID_LOOP(i, n) {
    a[i] /= divisor;
  }
}

// QAdam's step (vec_ops.cc qadamStep is the host reference, same operations in the same order;
// sqrtf and the division are IEEE correctly rounded without -use_fast_math).
__global__ void qadamStepKernel(float* x, const float* grad, float* m, float* v, size_t n, int warm,
                                float weightDecay, float b1, float b2, float ob1, float ob2,
                                float stepSize, float bc2Sqrt, float eps, int hold) {
  BAGUA_GRID_LOOP(i, n) {
    float mi = m[i];
    float vi = v[i];
    const float xi = x[i];
    if (warm) {
      float g = grad[i];
      if (weightDecay != 0.0f) {
        g = g + xi * weightDecay;
      }
      mi = mi * b1 + g * ob1;
      vi = vi * b2 + g * g * ob2;
      m[i] = mi;
      v[i] = vi;
    }
    if (hold && vi == 0.0f) {
      continue;  // zero frozen variance: no update (qadam.h)
    }
    const float denom = sqrtf(vi) / bc2Sqrt + eps;
    x[i] = xi + (-stepSize) * (mi / denom);
  }
}

__global__ void momentumMixKernel(float* slot, const float* m, float b1, float ob1, size_t n) {
  BAGUA_GRID_LOOP(i, n) {
    slot[i] = m[i] * b1 + slot[i] * ob1;
  }
}

__global__ void addMeanMinusSnapshotKernel(float* w, const float* sum, const float* snap, float n,
                                           size_t count) {
  BAGUA_GRID_LOOP(i, count) {
    w[i] += sum[i] / n - snap[i];
  }
}

int launched() {
  return static_cast<int>(cudaGetLastError());
}

// Launches `kernel` with blocksFor(count) blocks on this thread's stream; nothing for count == 0.
template <class... Params, class... Args>
int launchOver(size_t count, void (*kernel)(Params...), Args... args) {
  if (count == 0) {
    return 0;
  }
  kernel<<<blocksFor(count), kThreads, 0, cudaStreamPerThread>>>(args...);
  return launched();
}

// A stream or event query as the entry points return it: 0 done, 1 not yet, else the error
// (cleared from the thread's last-error slot).
int queryResult(cudaError_t e) {
  if (e == cudaSuccess) {
    return 0;
  }
  if (e == cudaErrorNotReady) {
    return 1;
  }
  (void)cudaGetLastError();
  return static_cast<int>(e);
}

// A copy between host and device after this thread's stream work, waited for.
int copySync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) {
    return 0;
  }
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, cudaStreamPerThread);
  if (e == cudaSuccess) {
    e = cudaStreamSynchronize(cudaStreamPerThread);
  }
  return static_cast<int>(e);
}

}  // namespace

int setDevice(int device) {
  return static_cast<int>(cudaSetDevice(device));
}

int deviceAlloc(void** out, size_t bytes) {
  cudaError_t e = cudaMalloc(out, bytes == 0 ? 1 : bytes);
  if (e == cudaSuccess) {
    e = cudaMemset(*out, 0, bytes == 0 ? 1 : bytes);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return static_cast<int>(e);
}

void deviceFree(void* p) {
  cudaFree(p);
}

int copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) {
    return 0;
  }
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread));
}

int copyToHost(void* hostDst, const void* src, size_t bytes) {
  return copySync(hostDst, src, bytes, cudaMemcpyDeviceToHost);
}

int copyFromHost(void* dst, const void* hostSrc, size_t bytes) {
  return copySync(dst, hostSrc, bytes, cudaMemcpyHostToDevice);
}

int zero(void* dst, size_t bytes) {
  if (bytes == 0) {
    return 0;
  }
  return static_cast<int>(cudaMemsetAsync(dst, 0, bytes, cudaStreamPerThread));
}

int queryStream() {
  return queryResult(cudaStreamQuery(cudaStreamPerThread));
}

void* perThreadStream() {
  return static_cast<void*>(cudaStreamPerThread);
}

int eventRecord(void** event, void* stream) {
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      cudaEventDestroy(ev);
      ev = nullptr;
    }
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
  }
  *event = ev;
  return static_cast<int>(e);
}

int eventQuery(void* event) {
  return queryResult(cudaEventQuery(static_cast<cudaEvent_t>(event)));
}

void eventDestroy(void* event) {
  if (event != nullptr) {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
}

int reduceChunks(const float* chunks, size_t n, size_t c, bool average, float* out) {
  return launchOver(c, reduceChunksKernel, chunks, n, c, average ? 1 : 0, out);
}

int averagePair(float* a, const float* b, size_t n) {
  return launchOver(n, averagePairKernel, a, b, n);
}

int lowPrecisionDiff(float* d, const float* x, const float* l, const float* r, const float* w,
                     size_t n) {
  return launchOver(n, lowPrecisionDiffKernel, d, x, l, r, w, n);
}

int addInPlace(float* a, const float* b, size_t n) {
  return launchOver(n, addInPlaceKernel, a, b, n);
}

int addAndCopy(float* w, const float* d, float* x, size_t n) {
  return launchOver(n, addAndCopyKernel, w, d, x, n);
}

int divideInPlace(float* a, float divisor, size_t n) {
  return launchOver(n, divideInPlaceKernel, a, divisor, n);
}

int qadamStep(float* x, const float* grad, float* m, float* v, size_t n, bool warm,
              float weightDecay, float b1, float b2, float ob1, float ob2, float stepSize,
              float bc2Sqrt, float eps, bool hold) {
  return launchOver(n, qadamStepKernel, x, grad, m, v, n, warm ? 1 : 0, weightDecay, b1, b2, ob1,
                    ob2, stepSize, bc2Sqrt, eps, hold ? 1 : 0);
}

int momentumMix(float* slot, const float* m, float b1, float ob1, size_t n) {
  return launchOver(n, momentumMixKernel, slot, m, b1, ob1, n);
}

int addMeanMinusSnapshot(float* w, const float* sum, const float* snap, float n, size_t count) {
  return launchOver(count, addMeanMinusSnapshotKernel, w, sum, snap, n, count);
}

}  // namespace bagua::algo::cudakernels
