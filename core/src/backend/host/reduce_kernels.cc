#include "backend/host/reduce_kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "bagua/base/thread.h"

namespace bagua::core::host {

namespace {

template <typename T>
void reduceTyped(T* __restrict d, const T* __restrict s, size_t n, ReduceOp op) {
  switch (op) {
  case ReduceOp::kSum:
  case ReduceOp::kAvg:
    for (size_t i = 0; i < n; ++i) {
      d[i] = static_cast<T>(d[i] + s[i]);
    }
    break;
  case ReduceOp::kProduct:
    for (size_t i = 0; i < n; ++i) {
      d[i] = static_cast<T>(d[i] * s[i]);
    }
    break;
  case ReduceOp::kMin:
    for (size_t i = 0; i < n; ++i) {
      d[i] = s[i] < d[i] ? s[i] : d[i];
    }
    break;
  case ReduceOp::kMax:
    for (size_t i = 0; i < n; ++i) {
      d[i] = s[i] > d[i] ? s[i] : d[i];
    }
    break;
  }
}

inline float bf16Load(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline uint16_t bf16Store(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

constexpr size_t kBlock = 512;

template <bool kBf16>
void reduce16(uint16_t* d, const uint16_t* s, size_t n, ReduceOp op) {
  float a[kBlock];
  float b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) {
      a[i] = kBf16 ? bf16Load(d[base + i]) : halfToFloat(d[base + i]);
      b[i] = kBf16 ? bf16Load(s[base + i]) : halfToFloat(s[base + i]);
    }
    reduceTyped<float>(a, b, m, op);
    for (size_t i = 0; i < m; ++i) {
      d[base + i] = kBf16 ? bf16Store(a[i]) : floatToHalf(a[i]);
    }
  }
}

template <typename T>
void divideTyped(T* d, size_t n, int by) {
  if constexpr (std::is_floating_point_v<T>) {
    const T k = static_cast<T>(by);
    for (size_t i = 0; i < n; ++i) {
      d[i] = d[i] / k;
    }
  } else {
    const T k = static_cast<T>(by);
    for (size_t i = 0; i < n; ++i) {
      d[i] = static_cast<T>(d[i] / k);
    }
  }
}

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
  case DataType::kF32:
    reduceTyped(static_cast<float*>(dst), static_cast<const float*>(src), count, op);
    break;
  case DataType::kF64:
    reduceTyped(static_cast<double*>(dst), static_cast<const double*>(src), count, op);
    break;
  case DataType::kI32:
    reduceTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, op);
    break;
  case DataType::kI64:
    reduceTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, op);
    break;
  case DataType::kU8:
    reduceTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op);
    break;
  case DataType::kF16:
    reduce16<false>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, op);
    break;
  case DataType::kBF16:
    reduce16<true>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, op);
    break;
  }
}

void divideBy(void* data, size_t count, DataType dtype, int n) {
  switch (dtype) {
  case DataType::kF32:
    divideTyped(static_cast<float*>(data), count, n);
    break;
  case DataType::kF64:
    divideTyped(static_cast<double*>(data), count, n);
    break;
  case DataType::kI32:
    divideTyped(static_cast<int32_t*>(data), count, n);
    break;
  case DataType::kI64:
    divideTyped(static_cast<int64_t*>(data), count, n);
    break;
  case DataType::kU8:
    divideTyped(static_cast<uint8_t*>(data), count, n);
    break;
  case DataType::kF16: {
    auto* d = static_cast<uint16_t*>(data);
    for (size_t i = 0; i < count; ++i) {
      d[i] = floatToHalf(halfToFloat(d[i]) / static_cast<float>(n));
    }
    break;
  }
  case DataType::kBF16: {
    auto* d = static_cast<uint16_t*>(data);
    for (size_t i = 0; i < count; ++i) {
      d[i] = bf16Store(bf16Load(d[i]) / static_cast<float>(n));
    }
    break;
  }
  }
}

ReduceEngine::ReduceEngine(int threads) : threads_(std::max(1, threads)) {
  for (int i = 1; i < threads_; ++i) {
    helpers_.emplace_back([this, i](std::stop_token st) { helperLoop(st, i); });
  }
}

ReduceEngine::~ReduceEngine() {
  for (auto& h : helpers_) {
    h.request_stop();
  }
  cv_.notify_all();
}

void ReduceEngine::helperLoop(std::stop_token stop, int index) {
  setThreadName("bagua-reduce" + std::to_string(index));
  uint64_t seen = 0;
  while (!stop.stop_requested()) {
    std::function<void(int)> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, stop, std::chrono::milliseconds(200),
                        [&] { return generation_ != seen; })) {
        continue;
      }
      seen = generation_;
      job = job_;
    }
    job(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    doneCv_.notify_one();
  }
}

void ReduceEngine::reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  const size_t es = dataTypeSize(dtype);
  constexpr size_t kMinBytesPerThread = 128 * 1024;
  int parts = static_cast<int>(std::min<size_t>(threads_, count * es / kMinBytesPerThread));
  if (parts <= 1) {
    reduceInto(dst, src, count, dtype, op);
    return;
  }
  // Chunks aligned to 64 elements so every helper works on whole vectors.
  const size_t per = ((count + parts - 1) / parts + 63) / 64 * 64;
  auto work = [=](int i) {
    size_t begin = std::min(count, static_cast<size_t>(i) * per);
    size_t end = std::min(count, begin + per);
    if (end > begin) {
      reduceInto(static_cast<uint8_t*>(dst) + begin * es,
                 static_cast<const uint8_t*>(src) + begin * es, end - begin, dtype, op);
    }
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = [work, parts](int i) {
      if (i < parts) {
        work(i);
      }
    };
    pending_ = threads_ - 1;
    ++generation_;
  }
  cv_.notify_all();
  work(0);
  std::unique_lock<std::mutex> lock(mu_);
  // Helpers only compute; this wait ends as soon as they finish their slices.
  while (!doneCv_.wait_for(lock, std::chrono::seconds(1), [&] { return pending_ == 0; })) {
  }
}

}  // namespace bagua::core::host
