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
  unsigned mask = 0;       // Rule::stateMask of the group
  double invScale = 1.0;   // gradient multiplier (1 / loss scale)
  void* stream = nullptr;  // CUDA: the cudaStream_t of the launches (null: legacy default stream)
};

// The state elements of index i, shared by every CPU and CUDA kernel: loads the states a
// configuration uses (bit k of Mask) and zero for the others, and stores the used ones back. Mask
// is a compile-time constant, so unused states cost nothing and CPU loops stay vectorisable.
template <unsigned Mask, int N, class T>
BAGUA_OPTIM_HD void loadStates(T* const (&st)[kMaxStates], size_t i, T (&s)[N]) {
  for (int k = 0; k < N; ++k) {
    s[k] = ((Mask >> k) & 1u) ? st[k][i] : T(0);
  }
}

template <unsigned Mask, int N, class T>
BAGUA_OPTIM_HD void storeStates(T* const (&st)[kMaxStates], size_t i, const T (&s)[N]) {
  for (int k = 0; k < N; ++k) {
    if ((Mask >> k) & 1u) {
      st[k][i] = s[k];
    }
  }
}

// Trust-ratio norm blocks: fixed-size blocks from each tensor's start (a tensor's norm is summed in
// double per block, then block by block, so it does not depend on its range or on threads). Calls
// fn(segment, begin, end) for every block of a range of `numSegments` tensors, in order; the CPU
// kernels and the CUDA host side both cut blocks here.
inline constexpr size_t kNormBlock = 4096;
template <class Fn>
void forEachNormBlock(const size_t* segments, size_t numSegments, Fn&& fn) {
  size_t start = 0;
  for (size_t s = 0; s < numSegments; ++s) {
    const size_t end = start + segments[s];
    for (size_t b = start; b < end; b += kNormBlock) {
      fn(s, b, end - b > kNormBlock ? b + kNormBlock : end);
    }
    start = end;
  }
}

// The typed state pointers of a range.
template <class T>
struct StatePtrs {
  T* p[kMaxStates];
  BAGUA_OPTIM_HD explicit StatePtrs(const KernelArgs& a) {
    for (int k = 0; k < kMaxStates; ++k) {
      p[k] = static_cast<T*>(a.states[k]);
    }
  }
};

}  // namespace bagua::optim
