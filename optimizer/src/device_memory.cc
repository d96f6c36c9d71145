// Memory of the fused optimizer's tensors on their device (device_memory.h).
#include "device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/rules.h"

namespace bagua::optim::detail {

using core::Device;
using core::DeviceType;

size_t stateElemSize(StorageType s) {
  return s == StorageType::kF64 ? 8 : 4;
}

bool isHalfLike(StorageType s) {
  return s == StorageType::kF16 || s == StorageType::kBF16;
}

Result<void*> deviceAlloc(const Device& d, size_t bytes) {
  const size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (d.type == DeviceType::kCpu) {
    void* p = std::aligned_alloc(64, n);
    if (p == nullptr) {
      return BAGUA_ERROR(kResourceExhausted, "optimizer: cannot allocate %zu bytes", n);
    }
    std::memset(p, 0, n);
    return p;
  }
  void* p = nullptr;
  BAGUA_RETURN_IF_ERROR(cudaAllocZeroed(d.index, n, &p));
  return p;
}

void deviceFree(const Device& d, void* p) {
  if (p == nullptr) {
    return;
  }
  if (d.type == DeviceType::kCpu) {
    std::free(p);
  } else {
    cudaRelease(d.index, p);
  }
}

Status copyOn(const Device& d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memmove(dst, src, bytes);
    return Status::ok();
  }
  return cudaCopy(d.index, dst, src, bytes, 0);
}

Status toHost(const Device& d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  return cudaCopy(d.index, dst, src, bytes, 2);
}

Status fromHost(const Device& d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  return cudaCopy(d.index, dst, src, bytes, 1);
}

Status zeroOn(const Device& d, void* p, size_t bytes) {
  if (bytes == 0 || p == nullptr) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memset(p, 0, bytes);
    return Status::ok();
  }
  return cudaZero(d.index, p, bytes);
}

// Fills `numel` state elements with `value` (f32 or f64).
Status fillState(const Device& d, void* p, size_t numel, StorageType s, double value) {
  if (value == 0.0) {
    return zeroOn(d, p, numel * stateElemSize(s));
  }
  std::vector<uint8_t> host(numel * stateElemSize(s));
  if (s == StorageType::kF64) {
    std::fill_n(reinterpret_cast<double*>(host.data()), numel, value);
  } else {
    std::fill_n(reinterpret_cast<float*>(host.data()), numel, static_cast<float>(value));
  }
  return fromHost(d, p, host.data(), host.size());
}

// 16-bit parameter values as f32 master weights.
Status initMaster(const Device& d, float* master, const void* param, size_t numel, StorageType s) {
  std::vector<uint16_t> bits(numel);
  BAGUA_RETURN_IF_ERROR(toHost(d, bits.data(), param, numel * 2));
  std::vector<float> f(numel);
  for (size_t i = 0; i < numel; ++i) {
    f[i] = s == StorageType::kF16 ? fromHalfBits(bits[i]) : fromBf16Bits(bits[i]);
  }
  return fromHost(d, master, f.data(), numel * 4);
}

std::string deviceString(const Device& d) {
  return d.type == DeviceType::kCpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

}  // namespace bagua::optim::detail
