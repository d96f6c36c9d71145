// The arguments of one kernel call over a contiguous range of elements, shared by the CPU kernels
// (elementwise.h) and the CUDA ones (compiled by nvcc: keep this header self-contained, C++17).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bagua/optimizer/rules.h"

namespace bagua::optim {

// How parameters (and gradients) are stored; states are f64 for kF64, else f32.
enum class StorageType : int { kF32 = 0, kF64, kF16, kBF16 };

struct KernelArgs {
  StorageType storage = StorageType::kF32;
  void* param = nullptr;          // numel elements of `storage`
  const void* grad = nullptr;     // numel elements of `storage`
  float* master = nullptr;        // f32 master weights (f16/bf16 only), or null
  void* states[kMaxStates] = {};  // used states (bit k of mask), numel each
  size_t numel = 0;
  unsigned mask = 0;      // Rule::stateMask of the group
  double invScale = 1.0;  // gradient multiplier (1 / loss scale)
};

}  // namespace bagua::optim
