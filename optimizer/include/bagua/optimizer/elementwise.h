// ElementwiseOptimizer<Rule>: any rule of rules.h's shape becomes a FusedOptimizer (flattening,
// fused runs, per-tensor fallback, mixed precision, save/load) with no extra code. The same
// kernel function runs a fused run and a single tensor (only the range differs), and chunking
// across threads never changes which operations an element sees, so the fused step equals the
// per-tensor step bit for bit.
//
// Built-in instances (compiled once in the library): Sgd, Adam, AdamW, Adagrad, Rmsprop, Adadelta,
// Adamax, Lamb. A user rule only needs this header; its CUDA kernel needs a kCudaId the library
// knows (otherwise creating it over CUDA parameters fails with InvalidArgument).
#pragma once

#include <cmath>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/fused_optimizer.h"
#include "bagua/optimizer/rules.h"

namespace bagua::optim {

namespace detail {

template <class Rule>
concept TrustRatioRule = requires {
  Rule::kTrustRatio;
};

template <class Rule, class T>
using ScalarsOf = typename Rule::template Scalars<T>;

// Loads a state element only when the configuration uses it (Mask is a compile-time constant, so
// the branch folds away and the loop stays vectorisable).
template <class Rule, class P, class T, bool kMaster, unsigned Mask>
void elementwiseKernel(const ScalarsOf<Rule, T>& c, const KernelArgs& a, size_t begin, size_t end) {
  P* __restrict param = static_cast<P*>(a.param);
  const P* __restrict grad = static_cast<const P*>(a.grad);
  float* __restrict master = a.master;
  const StatePtrs<T> st(a);
  const T inv = static_cast<T>(a.invScale);
  for (size_t i = begin; i < end; ++i) {
    T s[Rule::kStates];
    loadStates<Mask>(st.p, i, s);
    T w;
    if constexpr (kMaster) {
      w = static_cast<T>(master[i]);
    } else {
      w = load<T>(param[i]);
    }
    Rule::apply(c, w, load<T>(grad[i]) * inv, s);
    storeStates<Mask>(st.p, i, s);
    if constexpr (kMaster) {
      master[i] = static_cast<float>(w);
    }
    store(param[i], w);
  }
}

template <class P, class T, bool kMaster>
T weightAt(const KernelArgs& a, size_t i) {
  if constexpr (kMaster) {
    return static_cast<T>(a.master[i]);
  } else {
    return load<T>(static_cast<const P*>(a.param)[i]);
  }
}

// Trust-ratio rules, pass 1: states and the update u (into `u`), parameters untouched.
template <class Rule, class P, class T, bool kMaster, unsigned Mask>
void trustUpdateKernel(const ScalarsOf<Rule, T>& c, const KernelArgs& a, T* u, size_t begin,
                       size_t end) {
  const P* grad = static_cast<const P*>(a.grad);
  const StatePtrs<T> st(a);
  const T inv = static_cast<T>(a.invScale);
  for (size_t i = begin; i < end; ++i) {
    T s[Rule::kStates];
    loadStates<Mask>(st.p, i, s);
    u[i] = Rule::update(c, weightAt<P, T, kMaster>(a, i), load<T>(grad[i]) * inv, s);
    storeStates<Mask>(st.p, i, s);
  }
}

// Trust-ratio rules, pass 3: p = applyTrust(p, u, trust) with one trust value for [begin, end).
template <class Rule, class P, class T, bool kMaster>
void trustApplyKernel(const ScalarsOf<Rule, T>& c, const KernelArgs& a, const T* u, T trust,
                      size_t begin, size_t end) {
  P* param = static_cast<P*>(a.param);
  for (size_t i = begin; i < end; ++i) {
    T w = weightAt<P, T, kMaster>(a, i);
    Rule::applyTrust(c, w, u[i], trust);
    if constexpr (kMaster) {
      a.master[i] = static_cast<float>(w);
    }
    store(param[i], w);
  }
}

// Splits [0, numel) into chunks of `chunk` elements and runs fn(begin, end) for each on the pool:
// the one place a range is cut up for the threads (every pass of every rule uses it).
template <class Fn>
Status forEachChunk(ThreadPool& pool, size_t numel, size_t chunk, Fn&& fn) {
  return pool.parallelFor((numel + chunk - 1) / chunk, [&](size_t k) {
    fn(k * chunk, numel < (k + 1) * chunk ? numel : (k + 1) * chunk);
  });
}

}  // namespace detail

template <class Rule>
class ElementwiseOptimizer final : public FusedOptimizer {
 public:
  using RuleType = Rule;
  using Hyper = typename Rule::Hyper;
  struct Group {
    std::vector<int> params;  // indices into the trainer's parameter list
    Hyper hyper;
  };

  // Validates the groups and hyper-parameters and allocates state. `params` is borrowed.
  static Result<std::unique_ptr<ElementwiseOptimizer>> create(
      std::vector<core::Parameter>& params, std::vector<Group> groups,
      const OptimizerOptions& options = {}) {
    std::vector<std::vector<int>> lists;
    std::vector<Hyper> hypers;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (const char* why = Rule::validate(groups[g].hyper)) {
        return BAGUA_ERROR(kInvalidArgument, "%s: group %zu: %s", Rule::kName, g, why);
      }
      lists.push_back(groups[g].params);
      hypers.push_back(groups[g].hyper);
    }
    std::unique_ptr<ElementwiseOptimizer> opt(
        new ElementwiseOptimizer(params, std::move(lists), std::move(hypers), options));
    BAGUA_RETURN_IF_ERROR(opt->init());
    return opt;
  }

  // One group holding every parameter that requires a gradient.
  static Result<std::unique_ptr<ElementwiseOptimizer>> create(
      std::vector<core::Parameter>& params, const Hyper& hyper = Hyper(),
      const OptimizerOptions& options = {}) {
    Group g;
    g.hyper = hyper;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requiresGrad) {
        g.params.push_back(static_cast<int>(i));
      }
    }
    return create(params, std::vector<Group>{g}, options);
  }

  // The group's hyper-parameters; may be changed between steps (learning-rate schedules), but not
  // so that the rule needs a state it did not allocate (the next step fails then).
  Hyper& hyper(int group) { return hypers_[group]; }
  const char* ruleName() const override { return Rule::kName; }

 protected:
  Status applyRange(const Range& r) override {
    const Hyper& h = hypers_[r.group];
    if (const char* why = Rule::validate(h)) {
      return BAGUA_ERROR(kInvalidArgument, "%s: group %d: %s", Rule::kName, r.group, why);
    }
    if (r.device.type == core::DeviceType::kCuda) {
      if constexpr (Rule::kCudaId < 0) {
        return BAGUA_ERROR(kInvalidArgument, "%s has no CUDA kernel", Rule::kName);
      } else {
        if (r.args.storage == StorageType::kF64) {
          return runCuda<double>(r, h);
        }
        return runCuda<float>(r, h);
      }
    }
    switch (r.args.storage) {
    case StorageType::kF32:
      return runCpu<float, float, false>(r, h);
    case StorageType::kF64:
      return runCpu<double, double, false>(r, h);
    case StorageType::kF16:
      return r.args.master != nullptr ? runCpu<Half, float, true>(r, h)
                                      : runCpu<Half, float, false>(r, h);
    case StorageType::kBF16:
      return r.args.master != nullptr ? runCpu<BFloat16, float, true>(r, h)
                                      : runCpu<BFloat16, float, false>(r, h);
    }
    return BAGUA_ERROR(kInternal, "%s: unknown storage type", Rule::kName);
  }
  int numStates() const override { return Rule::kStates; }
  unsigned stateMask(int group) const override { return Rule::stateMask(hypers_[group]); }
  const char* stateName(int k) const override { return Rule::stateName(k); }
  double initialState(int group, int k) const override {
    return Rule::initialState(hypers_[group], k);
  }
  bool hasCudaKernel() const override { return Rule::kCudaId >= 0; }

 private:
  ElementwiseOptimizer(std::vector<core::Parameter>& params, std::vector<std::vector<int>> groups,
                       std::vector<Hyper> hypers, const OptimizerOptions& options)
      : FusedOptimizer(params, std::move(groups), options), hypers_(std::move(hypers)) {}

  template <class P, class T, bool kMaster, unsigned... M>
  static auto pickKernel(unsigned mask, std::integer_sequence<unsigned, M...>) {
    using Fn = void (*)(const detail::ScalarsOf<Rule, T>&, const KernelArgs&, size_t, size_t);
    if constexpr (detail::TrustRatioRule<Rule>) {
      using Tf = void (*)(const detail::ScalarsOf<Rule, T>&, const KernelArgs&, T*, size_t, size_t);
      static constexpr Tf table[] = {&detail::trustUpdateKernel<Rule, P, T, kMaster, M>...};
      return table[mask];
    } else {
      static constexpr Fn table[] = {&detail::elementwiseKernel<Rule, P, T, kMaster, M>...};
      return table[mask];
    }
  }

  template <class T>
  Status runCuda(const Range& r, const Hyper& h) {
    const auto c = Rule::template prepare<T>(h, r.step);
    if constexpr (detail::TrustRatioRule<Rule>) {
      // The library's kernels run this kCudaId's update, trust and applyTrust on the device.
      return cudaTrustRatio(Rule::kCudaId, &c, r.args, r.segments, r.numSegments, cudaScratch_,
                            r.device.index);
    } else {
      return cudaElementwise(Rule::kCudaId, &c, r.args, r.device.index);
    }
  }

  template <class P, class T, bool kMaster>
  Status runCpu(const Range& r, const Hyper& h) {
    const auto c = Rule::template prepare<T>(h, r.step);
    const KernelArgs& a = r.args;
    const size_t mask = a.mask & ((1u << Rule::kStates) - 1u);
    const auto kernel = pickKernel<P, T, kMaster>(
        static_cast<unsigned>(mask), std::make_integer_sequence<unsigned, 1u << Rule::kStates>());
    if constexpr (!detail::TrustRatioRule<Rule>) {
      return detail::forEachChunk(pool(), a.numel, chunkElements(),
                                  [&](size_t b, size_t e) { kernel(c, a, b, e); });
    } else {
      std::vector<T>& u = scratch<T>();
      if (u.size() < a.numel) {
        u.resize(a.numel);
      }
      BAGUA_RETURN_IF_ERROR(
          detail::forEachChunk(pool(), a.numel, chunkElements(),
                               [&](size_t b, size_t e) { kernel(c, a, u.data(), b, e); }));
      // Per-tensor norms of the weights and of u, in fixed blocks from each tensor's start.
      blocks_.clear();
      forEachNormBlock(r.segments, r.numSegments, [&](size_t s, size_t b, size_t e) {
        blocks_.push_back({s, b, e});
      });
      partial_.assign(blocks_.size() * 2, 0.0);
      BAGUA_RETURN_IF_ERROR(pool().parallelFor(blocks_.size(), [&](size_t bi) {
        const auto& b = blocks_[bi];
        double pw = 0.0, uu = 0.0;
        for (size_t i = b.begin; i < b.end; ++i) {
          const double w = static_cast<double>(detail::weightAt<P, T, kMaster>(a, i));
          const double v = static_cast<double>(u[i]);
          pw += w * w;
          uu += v * v;
        }
        partial_[bi * 2] = pw;
        partial_[bi * 2 + 1] = uu;
      }));
      trust_.assign(r.numSegments, 1.0);
      pn_.assign(r.numSegments, 0.0);
      un_.assign(r.numSegments, 0.0);
      for (size_t bi = 0; bi < blocks_.size(); ++bi) {
        pn_[blocks_[bi].seg] += partial_[bi * 2];
        un_[blocks_[bi].seg] += partial_[bi * 2 + 1];
      }
      for (size_t s = 0; s < r.numSegments; ++s) {
        trust_[s] = static_cast<double>(Rule::template trust<T>(c, pn_[s], un_[s]));
      }
      return pool().parallelFor(blocks_.size(), [&](size_t bi) {
        const auto& b = blocks_[bi];
        detail::trustApplyKernel<Rule, P, T, kMaster>(c, a, u.data(), static_cast<T>(trust_[b.seg]),
                                                      b.begin, b.end);
      });
    }
  }

  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::is_same_v<T, double>) {
      return scratchD_;
    } else {
      return scratchF_;
    }
  }

  std::vector<Hyper> hypers_;
  // Trust-ratio scratch, CPU and CUDA (reused across steps: a step allocates nothing).
  std::vector<float> scratchF_;
  std::vector<double> scratchD_;
  struct NormBlock {
    size_t seg, begin, end;
  };
  std::vector<NormBlock> blocks_;
  std::vector<double> partial_;
  std::vector<double> trust_;
  std::vector<double> pn_, un_;
  CudaTrustScratch cudaScratch_;
};

using Sgd = ElementwiseOptimizer<SgdRule>;
using Adam = ElementwiseOptimizer<AdamRule>;
using AdamW = ElementwiseOptimizer<AdamWRule>;
using Adagrad = ElementwiseOptimizer<AdagradRule>;
using Rmsprop = ElementwiseOptimizer<RmspropRule>;
using Adadelta = ElementwiseOptimizer<AdadeltaRule>;
using Adamax = ElementwiseOptimizer<AdamaxRule>;
using Lamb = ElementwiseOptimizer<LambRule>;

extern template class ElementwiseOptimizer<SgdRule>;
extern template class ElementwiseOptimizer<AdamRule>;
extern template class ElementwiseOptimizer<AdamWRule>;
extern template class ElementwiseOptimizer<AdagradRule>;
extern template class ElementwiseOptimizer<RmspropRule>;
extern template class ElementwiseOptimizer<AdadeltaRule>;
extern template class ElementwiseOptimizer<AdamaxRule>;
extern template class ElementwiseOptimizer<LambRule>;

}  // namespace bagua::optim
