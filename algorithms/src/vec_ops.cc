#include "vec_ops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "bagua/algorithms/compression.h"
#include "bagua/algorithms/cuda_compression.h"
#include "cuda_kernels.h"

namespace bagua::algo::detail {

namespace {

// The kernels' entry points return cudaError_t values as int (cuda_kernels.h).
Status cudaResult(CudaKernels& k, int err, const char* what, size_t n) {
  if (err == 0) {
    return Status::ok();
  }
  return k.status(err, strPrintf("%s (%zu)", what, n), __FILE__, __LINE__);
}

// Runs `call` (an expression over `k`, the CUDA half) on exec's device.
#define BAGUA_ON_DEVICE(exec, what, n, call)                                                      \
  do {                                                                                            \
    BAGUA_ASSIGN_OR_RETURN(CudaKernels* kp, cudaKernels());                                       \
    CudaKernels& k = *kp;                                                                         \
    BAGUA_RETURN_IF_ERROR(                                                                        \
        cudaResult(k, k.setDevice((exec).deviceIndex), "cudaSetDevice", static_cast<size_t>(0))); \
    return cudaResult(k, (call), what, n);                                                        \
  } while (0)

}  // namespace

Result<Exec> execFor(const core::Device& device, const char* what) {
  Exec e;
  if (device.type == core::DeviceType::kCpu) {
    return e;
  }
  // Loads the CUDA half on the first device tensor; its error names what is missing.
  Result<CudaKernels*> k = cudaKernels();
  if (!k.isOk()) {
    return BAGUA_ERROR(kFailedPrecondition, "%s: tensors on cuda:%d: %s", what, device.index,
                       k.status().message().c_str());
  }
  e.device = true;
  e.deviceIndex = device.index;
  return e;
}

Buffer::~Buffer() {
  release();
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      deviceIndex_(other.deviceIndex_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    deviceIndex_ = other.deviceIndex_;
  }
  return *this;
}

void Buffer::release() {
  if (data_ == nullptr) {
    return;
  }
  if (device_) {
    // A device buffer exists only once the CUDA half allocated it.
    if (CudaKernels* k = registeredCudaKernels()) {
      (void)k->setDevice(deviceIndex_);
      k->deviceFree(data_);
    }
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

Status Buffer::ensure(const Exec& exec, size_t bytes) {
  if (data_ != nullptr && bytes_ >= bytes && device_ == exec.device &&
      (!exec.device || deviceIndex_ == exec.deviceIndex)) {
    return Status::ok();
  }
  release();
  if (exec.device) {
    BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
    BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->setDevice(exec.deviceIndex), "cudaSetDevice", 0));
    void* p = nullptr;
    BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->deviceAlloc(&p, bytes), "cudaMalloc", bytes));
    data_ = p;
  } else {
    // 64-byte aligned, rounded up as aligned_alloc wants; zeroed like the device side.
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (data_ == nullptr) {
      return BAGUA_ERROR(kResourceExhausted, "host buffer of %zu bytes", bytes);
    }
    std::memset(data_, 0, rounded == 0 ? 64 : rounded);
  }
  bytes_ = bytes;
  device_ = exec.device;
  deviceIndex_ = exec.deviceIndex;
  return Status::ok();
}

Status copyBytes(const Exec& exec, void* dst, const void* src, size_t bytes) {
  if (!exec.device) {
    if (bytes > 0) {
      std::memmove(dst, src, bytes);
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "copy", bytes, k.copy(dst, src, bytes));
}

Status copyToHost(const Exec& exec, void* hostDst, const void* src, size_t bytes) {
  if (!exec.device) {
    if (bytes > 0) {
      std::memmove(hostDst, src, bytes);
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "copy to host", bytes, k.copyToHost(hostDst, src, bytes));
}

Status copyFromHost(const Exec& exec, void* dst, const void* hostSrc, size_t bytes) {
  if (!exec.device) {
    if (bytes > 0) {
      std::memmove(dst, hostSrc, bytes);
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "copy from host", bytes, k.copyFromHost(dst, hostSrc, bytes));
}

Status zeroBytes(const Exec& exec, void* dst, size_t bytes) {
  if (!exec.device) {
    if (bytes > 0) {
      std::memset(dst, 0, bytes);
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "zero", bytes, k.zero(dst, bytes));
}

Status compress(const Exec& exec, const float* src, size_t numel, size_t chunks, uint8_t* dst,
                size_t dstBytes, Buffer& workspace, int targetChunk) {
  if (!exec.device) {
    return minMaxCompress(src, numel, chunks, dst, dstBytes, targetChunk);
  }
  BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
  BAGUA_RETURN_IF_ERROR(workspace.ensure(exec, minMaxCudaWorkspaceBytes(numel, chunks)));
  BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->setDevice(exec.deviceIndex), "cudaSetDevice", 0));
  return minMaxCompressCuda(src, numel, chunks, dst, dstBytes, workspace.u8(), workspace.bytes(),
                            targetChunk, k->perThreadStream());
}

Status decompress(const Exec& exec, const uint8_t* src, size_t srcBytes, size_t numel,
                  size_t chunks, float* dst, int targetChunk) {
  if (!exec.device) {
    return minMaxDecompress(src, srcBytes, numel, chunks, dst, targetChunk);
  }
  BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
  BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->setDevice(exec.deviceIndex), "cudaSetDevice", 0));
  return minMaxDecompressCuda(src, srcBytes, numel, chunks, dst, targetChunk, k->perThreadStream());
}

Status reduceChunks(const Exec& exec, const float* chunks, size_t n, size_t c, bool average,
                    float* out) {
  if (!exec.device) {
    // out may alias chunk 0 (or any chunk): each element reads all its inputs before writing.
    const float fn = static_cast<float>(n);
    for (size_t i = 0; i < c; ++i) {
      float acc = chunks[i];
      for (size_t j = 1; j < n; ++j) {
        acc += chunks[j * c + i];
      }
      if (average) {
        acc /= fn;
      }
      out[i] = acc;
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "reduce chunks", c, k.reduceChunks(chunks, n, c, average, out));
}

Status averagePair(const Exec& exec, float* a, const float* b, size_t n) {
  if (!exec.device) {
    for (size_t i = 0; i < n; ++i) {
      a[i] = (a[i] + b[i]) / 2.0f;
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "average pair", n, k.averagePair(a, b, n));
}

Status lowPrecisionDiff(const Exec& exec, float* d, const float* x, const float* l, const float* r,
                        const float* w, size_t n) {
  if (!exec.device) {
    const float third = 1.0f / 3.0f;
    const float fiveThirds = 5.0f / 3.0f;
    for (size_t i = 0; i < n; ++i) {
      d[i] = x[i] + l[i] * third + r[i] * third - w[i] * fiveThirds;
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "low-precision difference", n, k.lowPrecisionDiff(d, x, l, r, w, n));
}

Status addInPlace(const Exec& exec, float* a, const float* b, size_t n) {
  if (!exec.device) {
    for (size_t i = 0; i < n; ++i) {
      a[i] += b[i];
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "add", n, k.addInPlace(a, b, n));
}

Status addAndCopy(const Exec& exec, float* w, const float* d, float* x, size_t n) {
  if (!exec.device) {
    for (size_t i = 0; i < n; ++i) {
      w[i] += d[i];
      x[i] = w[i];
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "add and copy", n, k.addAndCopy(w, d, x, n));
}

Status divideInPlace(const Exec& exec, float* a, float divisor, size_t n) {
  if (!exec.device) {
    for (size_t i = 0; i < n; ++i) {
      a[i] /= divisor;
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "divide", n, k.divideInPlace(a, divisor, n));
}

Status qadamStep(const Exec& exec, float* x, const float* grad, float* m, float* v, size_t n,
                 const QAdamStepArgs& a) {
  if (!exec.device) {
    if (a.warm) {
      for (size_t i = 0; i < n; ++i) {
        float g = grad[i];
        if (a.weightDecay != 0.0f) {
          g = g + x[i] * a.weightDecay;
        }
        m[i] = m[i] * a.b1 + g * a.ob1;
        v[i] = v[i] * a.b2 + g * g * a.ob2;
      }
    }
    const bool hold = a.holdZeroVariance && !a.warm;
    for (size_t i = 0; i < n; ++i) {
      if (hold && v[i] == 0.0f) {
        continue;
      }
      const float denom = std::sqrt(v[i]) / a.bc2Sqrt + a.eps;
      x[i] = x[i] + (-a.stepSize) * (m[i] / denom);
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "qadam step", n,
                  k.qadamStep(x, grad, m, v, n, a.warm, a.weightDecay, a.b1, a.b2, a.ob1, a.ob2,
                              a.stepSize, a.bc2Sqrt, a.eps, a.holdZeroVariance && !a.warm));
}

Status momentumMix(const Exec& exec, float* slot, const float* m, float b1, float ob1, size_t n) {
  if (!exec.device) {
    for (size_t i = 0; i < n; ++i) {
      slot[i] = m[i] * b1 + slot[i] * ob1;
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "qadam momentum", n, k.momentumMix(slot, m, b1, ob1, n));
}

Status addMeanMinusSnapshot(const Exec& exec, float* w, const float* sum, const float* snap,
                            float n, size_t count) {
  if (!exec.device) {
    for (size_t i = 0; i < count; ++i) {
      w[i] += sum[i] / n - snap[i];
    }
    return Status::ok();
  }
  BAGUA_ON_DEVICE(exec, "async average", count, k.addMeanMinusSnapshot(w, sum, snap, n, count));
}

Status waitForStream(const Exec& exec, void* stream, std::chrono::milliseconds timeout) {
  if (!exec.device) {
    return Status::ok();
  }
  BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
  BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->setDevice(exec.deviceIndex), "cudaSetDevice", 0));
  void* ev = nullptr;
  BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->eventRecord(&ev, stream), "cudaEventRecord", 0));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status s;
  while (true) {
    const int q = k->eventQuery(ev);
    if (q == 0) {
      break;
    }
    if (q != 1) {
      s = cudaResult(*k, q, "waiting for a stream", 0);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      s = BAGUA_ERROR(kDeadlineExceeded, "cuda:%d: the stream's work took over %lld ms",
                      exec.deviceIndex, static_cast<long long>(timeout.count()));
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
  k->eventDestroy(ev);
  return s;
}

Status sync(const Exec& exec, std::chrono::milliseconds timeout) {
  if (!exec.device) {
    return Status::ok();
  }
  BAGUA_ASSIGN_OR_RETURN(CudaKernels * k, cudaKernels());
  BAGUA_RETURN_IF_ERROR(cudaResult(*k, k->setDevice(exec.deviceIndex), "cudaSetDevice", 0));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const int q = k->queryStream();
    if (q == 0) {
      return Status::ok();
    }
    if (q != 1) {
      return cudaResult(*k, q, "device work of the algorithm", 0);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return BAGUA_ERROR(kDeadlineExceeded,
                         "cuda:%d: the algorithm's device work took over %lld ms", exec.deviceIndex,
                         static_cast<long long>(timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

}  // namespace bagua::algo::detail
