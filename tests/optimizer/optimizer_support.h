// Test helpers for the optimizer suites: a model of parameters of mixed sizes and dtypes with
// their own scattered storage, deterministic index-dependent patterns, and byte snapshots.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bagua/core/parameter.h"
#include "bagua/optimizer/elementwise.h"
#include "bagua/optimizer/rules.h"

namespace bagua::optim::testing {

struct Spec {
  size_t numel;
  core::DataType dtype;
};

// A pattern value in about [-1, 1], different for every (seed, tensor, index).
inline double pattern(uint64_t seed, size_t tensor, size_t i) {
  uint64_t x =
      seed * 0x9E3779B97F4A7C15ull + tensor * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x % 20001) / 10000.0 - 1.0;
}

inline void storeAs(core::DataType dt, void* base, size_t i, double v) {
  switch (dt) {
  case core::DataType::kF32:
    static_cast<float*>(base)[i] = static_cast<float>(v);
    break;
  case core::DataType::kF64:
    static_cast<double*>(base)[i] = v;
    break;
  case core::DataType::kF16:
    static_cast<uint16_t*>(base)[i] = toHalfBits(static_cast<float>(v));
    break;
  case core::DataType::kBF16:
    static_cast<uint16_t*>(base)[i] = toBf16Bits(static_cast<float>(v));
    break;
  default:
    break;
  }
}

inline double loadAs(core::DataType dt, const void* base, size_t i) {
  switch (dt) {
  case core::DataType::kF32:
    return static_cast<const float*>(base)[i];
  case core::DataType::kF64:
    return static_cast<const double*>(base)[i];
  case core::DataType::kF16:
    return fromHalfBits(static_cast<const uint16_t*>(base)[i]);
  case core::DataType::kBF16:
    return fromBf16Bits(static_cast<const uint16_t*>(base)[i]);
  default:
    return 0.0;
  }
}

// Parameters with separate allocations (never adjacent: a guard gap after each), as a trainer
// that allocates tensor by tensor has them.
class Model {
 public:
  explicit Model(const std::vector<Spec>& specs, uint64_t seed = 1) {
    for (size_t t = 0; t < specs.size(); ++t) {
      const size_t bytes = specs[t].numel * core::dataTypeSize(specs[t].dtype);
      storage_.push_back(std::make_unique<uint8_t[]>(bytes + 64));
      gradStorage_.push_back(std::make_unique<uint8_t[]>(bytes + 64));
      core::Parameter p;
      p.name = "layer" + std::to_string(t) + ".w";
      p.data = storage_.back().get();
      p.grad = gradStorage_.back().get();
      p.numel = specs[t].numel;
      p.dtype = specs[t].dtype;
      const size_t idx = t;
      p.setGrad = [this, idx](void* g) {
        params_[idx].grad = g;
        ++setGradCalls_;
      };
      params_.push_back(std::move(p));
      for (size_t i = 0; i < specs[t].numel; ++i) {
        storeAs(specs[t].dtype, params_[t].data, i, pattern(seed, t, i));
      }
    }
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  std::vector<core::Parameter>& params() { return params_; }
  int setGradCalls() const { return setGradCalls_; }

  // Gradients for `step`: pattern * scale (scale exact in every dtype for powers of two).
  void fillGrads(uint64_t step, double scale = 1.0) {
    for (size_t t = 0; t < params_.size(); ++t) {
      if (params_[t].grad == nullptr) {
        continue;
      }
      for (size_t i = 0; i < params_[t].numel; ++i) {
        storeAs(params_[t].dtype, params_[t].grad, i, 0.5 * pattern(1000 + step, t, i) * scale);
      }
    }
  }

  // All parameter bytes, tensor by tensor.
  std::vector<uint8_t> snapshot() const {
    std::vector<uint8_t> out;
    for (const auto& p : params_) {
      const auto* b = static_cast<const uint8_t*>(p.data);
      out.insert(out.end(), b, b + p.bytes());
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
  std::vector<std::unique_ptr<uint8_t[]>> gradStorage_;
  std::vector<core::Parameter> params_;
  int setGradCalls_ = 0;
};

// LAMB with zero-norm tensors, stepped on the CPU by fused_test.cc (fused against per tensor) and
// on the GPU by cuda_test.cc (CUDA against CPU): tensors of one norm block, of exactly a block
// and of many blocks, in f32, f64, f16 and bf16; tensor kLambZeroWeights is to be zeroed before
// the first step (|p| = 0: trust 1) and tensor kLambZeroGrads sits in group 1, which has no
// weight decay, so with its zero gradients |u| = 0 every step (trust 1, it never moves).
inline std::vector<Spec> lambZeroNormSpecs() {
  return {
      {3, core::DataType::kF32},     {4096, core::DataType::kF32},   {70000, core::DataType::kF32},
      {5000, core::DataType::kF32},  {4097, core::DataType::kF32},   {9000, core::DataType::kF32},
      {12289, core::DataType::kF64}, {1, core::DataType::kF64},      {8193, core::DataType::kF16},
      {33, core::DataType::kF16},    {20000, core::DataType::kBF16}, {513, core::DataType::kBF16}};
}
constexpr size_t kLambZeroWeights = 3;
constexpr size_t kLambZeroGrads = 5;

// The two groups of that layout: group 0 lr 0.01 with weight decay 0.05, group 1 lr 0.02 without.
inline std::vector<Lamb::Group> lambZeroNormGroups() {
  std::vector<Lamb::Group> groups(2);
  groups[0].hyper.lr = 0.01;
  groups[0].hyper.weightDecay = 0.05;
  groups[1].hyper.lr = 0.02;
  groups[1].hyper.weightDecay = 0.0;
  const size_t n = lambZeroNormSpecs().size();
  for (size_t i = 0; i < n; ++i) {
    groups[(i == kLambZeroGrads || i % 3 == 1) ? 1 : 0].params.push_back(static_cast<int>(i));
  }
  return groups;
}

}  // namespace bagua::optim::testing
