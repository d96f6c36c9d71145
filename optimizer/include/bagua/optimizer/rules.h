// Element-wise update rules: each optimizer is one struct that says how a single element of a
// parameter moves given its gradient and its state values. The engine (elementwise.h) turns a
// rule into a fused kernel over a contiguous run of tensors and a per-tensor kernel, both calling
// the same apply(), so fused and unfused results are equal bit for bit by construction.
//
// A rule provides (see SgdRule for the smallest complete one):
//   kName, kStates (state tensors per parameter, at most kMaxStates), kCudaId (-1: no CUDA kernel)
//   Hyper                          the group's hyper-parameters, PyTorch's names and defaults
//   validate(Hyper) -> const char* null when valid, else why not
//   stateMask(Hyper) -> unsigned   which states this configuration uses (bit k: state k)
//   stateName(k), initialState(Hyper, k)
//   Scalars<T>, prepare<T>(Hyper, step)   per-step constants (bias corrections, ...) computed
//                                  once per range from the 1-based step count, in double
//   apply<T>(Scalars, p&, g, s[])  the element update; compute type T is float (also for
//                                  f16/bf16 parameters) or double (f64 parameters)
// A rule with kTrustRatio (LAMB) instead provides update() -> u, trust(Scalars, |p|^2, |u|^2) and
// applyTrust(); the engine computes the per-tensor norms between the two element-wise passes.
// All three are BAGUA_OPTIM_HD: on CUDA the trust factor is computed on the device too.
//
// This header is also compiled by nvcc (C++17, no bagua/base): keep it self-contained.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BAGUA_OPTIM_HD __host__ __device__ __forceinline__
#else
#define BAGUA_OPTIM_HD inline
#endif

namespace bagua::optim {

inline constexpr int kMaxStates = 3;

// ---- 16-bit storage types and their conversions (round to nearest even; NaN stays NaN) -------

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

BAGUA_OPTIM_HD uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

BAGUA_OPTIM_HD float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

BAGUA_OPTIM_HD uint16_t toHalfBits(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {
    return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (a >= 0x477ff000u) {  // >= 65520 rounds to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (a < 0x38800000u) {  // below 2^-14: subnormal half or zero
    if (a < 0x33000000u) {
      return static_cast<uint16_t>(sign);
    }
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) {
      ++r;
    }
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t m = a - 0x38000000u;
  uint32_t r = m >> 13;
  const uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
    ++r;
  }
  return static_cast<uint16_t>(sign | r);
}

BAGUA_OPTIM_HD float fromHalfBits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return bitsFloat(floatBits(v) | sign);
  }
  if (e == 31) {
    return bitsFloat(sign | 0x7f800000u | (m << 13));
  }
  return bitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

BAGUA_OPTIM_HD uint16_t toBf16Bits(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

BAGUA_OPTIM_HD float fromBf16Bits(uint16_t b) {
  return bitsFloat(static_cast<uint32_t>(b) << 16);
}

// load<T>(storage) / store(storage&, T): the element conversions the kernels use.
template <class T>
BAGUA_OPTIM_HD T load(float v) {
  return static_cast<T>(v);
}
template <class T>
BAGUA_OPTIM_HD T load(double v) {
  return static_cast<T>(v);
}
template <class T>
BAGUA_OPTIM_HD T load(Half v) {
  return static_cast<T>(fromHalfBits(v.bits));
}
template <class T>
BAGUA_OPTIM_HD T load(BFloat16 v) {
  return static_cast<T>(fromBf16Bits(v.bits));
}
template <class T>
BAGUA_OPTIM_HD void store(float& dst, T v) {
  dst = static_cast<float>(v);
}
template <class T>
BAGUA_OPTIM_HD void store(double& dst, T v) {
  dst = static_cast<double>(v);
}
template <class T>
BAGUA_OPTIM_HD void store(Half& dst, T v) {
  dst.bits = toHalfBits(static_cast<float>(v));
}
template <class T>
BAGUA_OPTIM_HD void store(BFloat16& dst, T v) {
  dst.bits = toBf16Bits(static_cast<float>(v));
}

template <class T>
BAGUA_OPTIM_HD T sqrtT(T v) {
  return std::sqrt(v);
}

// torch.lerp(start, end, w): start + w * (end - start) for |w| < 0.5, else end - (end - start) *
// (1 - w), with w fixed per step (so the branch is uniform).
template <class T>
BAGUA_OPTIM_HD T lerpT(T start, T end, T w, T oneMinusW, bool small) {
  return small ? start + w * (end - start) : end - (end - start) * oneMinusW;
}

// ---- The Adam family's first moment (Adam, AdamW, Adamax) --------------------------------------
// g = -g when maximising; L2 decay g += wd * p, or AdamW's decoupled p *= 1 - lr * wd; then
// m = lerp(m, g, 1 - beta1). One helper, so the rules cannot drift apart.
template <class T>
struct MomentScalars {
  T oneMinusBeta1, beta1, weightDecay, decayFactor;
  bool decay, decoupled, maximize, lerpSmall;
};

template <class T, class Hyper>
MomentScalars<T> prepareMoment(const Hyper& h, bool decoupled) {
  return {static_cast<T>(1.0 - h.beta1),
          static_cast<T>(h.beta1),
          static_cast<T>(h.weightDecay),
          static_cast<T>(1.0 - h.lr * h.weightDecay),
          h.weightDecay != 0.0,
          decoupled,
          h.maximize,
          (1.0 - h.beta1) < 0.5};
}

// Applies maximize and weight decay to g (or p) and returns the new first moment.
template <class T>
BAGUA_OPTIM_HD T firstMoment(const MomentScalars<T>& c, T& p, T& g, T m) {
  if (c.maximize) {
    g = -g;
  }
  if (c.decay) {
    if (c.decoupled) {
      p = p * c.decayFactor;
    } else {
      g = g + c.weightDecay * p;
    }
  }
  return lerpT(m, g, c.oneMinusBeta1, c.beta1, c.lerpSmall);
}

// ---- SGD: torch.optim.SGD -----------------------------------------------------------------------
// d = g (+ wd * p); with momentum: b = d on the first step, else b = momentum * b + (1 - dampening)
// * d; d = nesterov ? d + momentum * b : b; p = p - lr * d.
struct SgdRule {
  static constexpr const char* kName = "sgd";
  static constexpr int kStates = 1;
  static constexpr int kCudaId = 0;
  struct Hyper {
    double lr = 1e-3;
    double momentum = 0.0;
    double dampening = 0.0;
    double weightDecay = 0.0;
    bool nesterov = false;
    bool maximize = false;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0)) {
      return "lr must be >= 0";
    }
    if (!(h.momentum >= 0.0)) {
      return "momentum must be >= 0";
    }
    if (!(h.weightDecay >= 0.0)) {
      return "weight_decay must be >= 0";
    }
    if (h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0)) {
      return "nesterov needs momentum > 0 and dampening = 0";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& h) { return h.momentum != 0.0 ? 1u : 0u; }
  static const char* stateName(int /*k*/) { return "momentum_buffer"; }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    T lr, momentum, oneMinusDampening, weightDecay;
    bool useMomentum, nesterov, first, maximize, decay;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t step) {
    return {static_cast<T>(h.lr),
            static_cast<T>(h.momentum),
            static_cast<T>(1.0 - h.dampening),
            static_cast<T>(h.weightDecay),
            h.momentum != 0.0,
            h.nesterov,
            step == 1,
            h.maximize,
            h.weightDecay != 0.0};
  }
  template <class T>
  BAGUA_OPTIM_HD static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    T d = c.maximize ? -g : g;
    if (c.decay) {
      d = d + c.weightDecay * p;
    }
    if (c.useMomentum) {
      const T b = c.first ? d : c.momentum * s[0] + c.oneMinusDampening * d;
      s[0] = b;
      d = c.nesterov ? d + c.momentum * b : b;
    }
    p = p - c.lr * d;
  }
};

// ---- Adam / AdamW: torch.optim.Adam, torch.optim.AdamW (single-tensor formulas) -----------------
// g (+ wd * p for Adam) | p *= 1 - lr * wd (AdamW); m = lerp(m, g, 1 - beta1);
// v = beta2 * v + (1 - beta2) * g * g; vmax = max(vmax, v) (amsgrad);
// p = p - (lr / (1 - beta1^t)) * m / (sqrt(v or vmax) / sqrt(1 - beta2^t) + eps).
struct AdamRule {
  static constexpr const char* kName = "adam";
  static constexpr int kStates = 3;
  static constexpr int kCudaId = 1;
  struct Hyper {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weightDecay = 0.0;
    bool amsgrad = false;
    bool decoupled = false;  // AdamW
    bool maximize = false;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0)) {
      return "lr must be >= 0";
    }
    if (!(h.eps >= 0.0)) {
      return "eps must be >= 0";
    }
    if (!(h.beta1 >= 0.0 && h.beta1 < 1.0) || !(h.beta2 >= 0.0 && h.beta2 < 1.0)) {
      return "betas must be in [0, 1)";
    }
    if (!(h.weightDecay >= 0.0)) {
      return "weight_decay must be >= 0";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& h) { return h.amsgrad ? 7u : 3u; }
  static const char* stateName(int k) {
    return k == 0 ? "exp_avg" : (k == 1 ? "exp_avg_sq" : "max_exp_avg_sq");
  }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    MomentScalars<T> moment;
    T beta2, oneMinusBeta2, eps, stepSize, bc2Sqrt;
    bool amsgrad;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t step) {
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(h.beta1, t);
    const double bc2 = 1.0 - std::pow(h.beta2, t);
    return {prepareMoment<T>(h, h.decoupled),
            static_cast<T>(h.beta2),
            static_cast<T>(1.0 - h.beta2),
            static_cast<T>(h.eps),
            static_cast<T>(h.lr / bc1),
            static_cast<T>(std::sqrt(bc2)),
            h.amsgrad};
  }
  template <class T>
  BAGUA_OPTIM_HD static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    const T m = firstMoment(c.moment, p, g, s[0]);
    const T v = c.beta2 * s[1] + c.oneMinusBeta2 * (g * g);
    s[0] = m;
    s[1] = v;
    T vv = v;
    if (c.amsgrad) {
      vv = s[2] > v ? s[2] : v;
      s[2] = vv;
    }
    const T denom = sqrtT(vv) / c.bc2Sqrt + c.eps;
    p = p - c.stepSize * (m / denom);
  }
};

struct AdamWRule : AdamRule {
  static constexpr const char* kName = "adamw";
  struct Hyper : AdamRule::Hyper {
    Hyper() {
      weightDecay = 1e-2;
      decoupled = true;
    }
  };
};

// ---- Adagrad: torch.optim.Adagrad ---------------------------------------------------------------
// g (+ wd * p); clr = lr / (1 + (t - 1) * lr_decay); sum += g * g; p = p - clr * g / (sqrt(sum) +
// eps).
struct AdagradRule {
  static constexpr const char* kName = "adagrad";
  static constexpr int kStates = 1;
  static constexpr int kCudaId = 2;
  struct Hyper {
    double lr = 1e-2;
    double lrDecay = 0.0;
    double weightDecay = 0.0;
    double initialAccumulatorValue = 0.0;
    double eps = 1e-10;
    bool maximize = false;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0) || !(h.lrDecay >= 0.0) || !(h.weightDecay >= 0.0) ||
        !(h.initialAccumulatorValue >= 0.0) || !(h.eps >= 0.0)) {
      return "lr, lr_decay, weight_decay, initial_accumulator_value and eps must be >= 0";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& /*h*/) { return 1u; }
  static const char* stateName(int /*k*/) { return "sum"; }
  static double initialState(const Hyper& h, int /*k*/) { return h.initialAccumulatorValue; }
  template <class T>
  struct Scalars {
    T clr, weightDecay, eps;
    bool decay, maximize;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t step) {
    return {static_cast<T>(h.lr / (1.0 + static_cast<double>(step - 1) * h.lrDecay)),
            static_cast<T>(h.weightDecay), static_cast<T>(h.eps), h.weightDecay != 0.0, h.maximize};
  }
  template <class T>
  BAGUA_OPTIM_HD static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    if (c.maximize) {
      g = -g;
    }
    if (c.decay) {
      g = g + c.weightDecay * p;
    }
    const T sum = s[0] + g * g;
    s[0] = sum;
    p = p - c.clr * (g / (sqrtT(sum) + c.eps));
  }
};

// ---- RMSprop: torch.optim.RMSprop ---------------------------------------------------------------
// g (+ wd * p); sq = alpha * sq + (1 - alpha) * g * g; centered: ga = lerp(ga, g, 1 - alpha),
// avg = sqrt(sq - ga * ga) + eps, else sqrt(sq) + eps; momentum: b = momentum * b + g / avg,
// p = p - lr * b; else p = p - lr * g / avg.
struct RmspropRule {
  static constexpr const char* kName = "rmsprop";
  static constexpr int kStates = 3;
  static constexpr int kCudaId = 3;
  struct Hyper {
    double lr = 1e-2;
    double alpha = 0.99;
    double eps = 1e-8;
    double weightDecay = 0.0;
    double momentum = 0.0;
    bool centered = false;
    bool maximize = false;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0) || !(h.eps >= 0.0) || !(h.weightDecay >= 0.0) || !(h.momentum >= 0.0)) {
      return "lr, eps, weight_decay and momentum must be >= 0";
    }
    if (!(h.alpha >= 0.0)) {
      return "alpha must be >= 0";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& h) {
    return 1u | (h.momentum > 0.0 ? 2u : 0u) | (h.centered ? 4u : 0u);
  }
  static const char* stateName(int k) {
    return k == 0 ? "square_avg" : (k == 1 ? "momentum_buffer" : "grad_avg");
  }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    T lr, alpha, oneMinusAlpha, eps, weightDecay, momentum;
    bool decay, useMomentum, centered, maximize, lerpSmall;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t /*step*/) {
    return {static_cast<T>(h.lr),
            static_cast<T>(h.alpha),
            static_cast<T>(1.0 - h.alpha),
            static_cast<T>(h.eps),
            static_cast<T>(h.weightDecay),
            static_cast<T>(h.momentum),
            h.weightDecay != 0.0,
            h.momentum > 0.0,
            h.centered,
            h.maximize,
            (1.0 - h.alpha) < 0.5};
  }
  template <class T>
  BAGUA_OPTIM_HD static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    if (c.maximize) {
      g = -g;
    }
    if (c.decay) {
      g = g + c.weightDecay * p;
    }
    const T sq = c.alpha * s[0] + c.oneMinusAlpha * (g * g);
    s[0] = sq;
    T avg;
    if (c.centered) {
      const T ga = lerpT(s[2], g, c.oneMinusAlpha, c.alpha, c.lerpSmall);
      s[2] = ga;
      avg = sqrtT(sq - ga * ga) + c.eps;
    } else {
      avg = sqrtT(sq) + c.eps;
    }
    if (c.useMomentum) {
      const T b = c.momentum * s[1] + g / avg;
      s[1] = b;
      p = p - c.lr * b;
    } else {
      p = p - c.lr * (g / avg);
    }
  }
};

// ---- Adadelta: torch.optim.Adadelta -------------------------------------------------------------
// g (+ wd * p); sq = rho * sq + (1 - rho) * g * g; d = sqrt(acc + eps) / sqrt(sq + eps) * g;
// acc = rho * acc + (1 - rho) * d * d; p = p - lr * d.
struct AdadeltaRule {
  static constexpr const char* kName = "adadelta";
  static constexpr int kStates = 2;
  static constexpr int kCudaId = 4;
  struct Hyper {
    double lr = 1.0;
    double rho = 0.9;
    double eps = 1e-6;
    double weightDecay = 0.0;
    bool maximize = false;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0) || !(h.eps >= 0.0) || !(h.weightDecay >= 0.0)) {
      return "lr, eps and weight_decay must be >= 0";
    }
    if (!(h.rho >= 0.0 && h.rho <= 1.0)) {
      return "rho must be in [0, 1]";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& /*h*/) { return 3u; }
  static const char* stateName(int k) { return k == 0 ? "square_avg" : "acc_delta"; }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    T lr, rho, oneMinusRho, eps, weightDecay;
    bool decay, maximize;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t /*step*/) {
    return {static_cast<T>(h.lr),
            static_cast<T>(h.rho),
            static_cast<T>(1.0 - h.rho),
            static_cast<T>(h.eps),
            static_cast<T>(h.weightDecay),
            h.weightDecay != 0.0,
            h.maximize};
  }
  template <class T>
  BAGUA_OPTIM_HD static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    if (c.maximize) {
      g = -g;
    }
    if (c.decay) {
      g = g + c.weightDecay * p;
    }
    const T sq = c.rho * s[0] + c.oneMinusRho * (g * g);
    s[0] = sq;
    const T d = sqrtT(s[1] + c.eps) / sqrtT(sq + c.eps) * g;
    s[1] = c.rho * s[1] + c.oneMinusRho * (d * d);
    p = p - c.lr * d;
  }
};

// ---- Adamax: torch.optim.Adamax -----------------------------------------------------------------
// g (+ wd * p); m = lerp(m, g, 1 - beta1); u = max(beta2 * u, |g| + eps);
// p = p - (lr / (1 - beta1^t)) * m / u.
struct AdamaxRule {
  static constexpr const char* kName = "adamax";
  static constexpr int kStates = 2;
  static constexpr int kCudaId = 6;
  struct Hyper {
    double lr = 2e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weightDecay = 0.0;
    bool maximize = false;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0) || !(h.eps >= 0.0) || !(h.weightDecay >= 0.0)) {
      return "lr, eps and weight_decay must be >= 0";
    }
    if (!(h.beta1 >= 0.0 && h.beta1 < 1.0) || !(h.beta2 >= 0.0 && h.beta2 < 1.0)) {
      return "betas must be in [0, 1)";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& /*h*/) { return 3u; }
  static const char* stateName(int k) { return k == 0 ? "exp_avg" : "exp_inf"; }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    MomentScalars<T> moment;
    T beta2, eps, clr;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t step) {
    const double bc = 1.0 - std::pow(h.beta1, static_cast<double>(step));
    return {prepareMoment<T>(h, false), static_cast<T>(h.beta2), static_cast<T>(h.eps),
            static_cast<T>(h.lr / bc)};
  }
  template <class T>
  BAGUA_OPTIM_HD static void apply(const Scalars<T>& c, T& p, T g, T* s) {
    const T m = firstMoment(c.moment, p, g, s[0]);
    const T a = (g < T(0) ? -g : g) + c.eps;
    const T b = c.beta2 * s[1];
    const T u = b > a ? b : a;
    s[0] = m;
    s[1] = u;
    p = p - c.clr * (m / u);
  }
};

// ---- LAMB (You et al. 2019, as NVIDIA Apex FusedLAMB with bias correction, no grad clipping)
// ----- m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g * g; u = (m / (1 - beta1^t)) /
// (sqrt(v / (1 - beta2^t)) + eps) + wd * p; trust = |p| > 0 and |u| > 0 ? |p| / |u| : 1 (norms per
// tensor); p = p - lr * trust * u.
struct LambRule {
  static constexpr const char* kName = "lamb";
  static constexpr int kStates = 2;
  static constexpr int kCudaId = 5;
  static constexpr bool kTrustRatio = true;
  struct Hyper {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-6;
    double weightDecay = 0.01;
  };
  static const char* validate(const Hyper& h) {
    if (!(h.lr >= 0.0) || !(h.eps >= 0.0) || !(h.weightDecay >= 0.0)) {
      return "lr, eps and weight_decay must be >= 0";
    }
    if (!(h.beta1 >= 0.0 && h.beta1 < 1.0) || !(h.beta2 >= 0.0 && h.beta2 < 1.0)) {
      return "betas must be in [0, 1)";
    }
    return nullptr;
  }
  static unsigned stateMask(const Hyper& /*h*/) { return 3u; }
  static const char* stateName(int k) { return k == 0 ? "exp_avg" : "exp_avg_sq"; }
  static double initialState(const Hyper& /*h*/, int /*k*/) { return 0.0; }
  template <class T>
  struct Scalars {
    T lr, beta1, oneMinusBeta1, beta2, oneMinusBeta2, bc1, bc2, eps, weightDecay;
    bool lerpSmall;
  };
  template <class T>
  static Scalars<T> prepare(const Hyper& h, int64_t step) {
    const double t = static_cast<double>(step);
    return {static_cast<T>(h.lr),
            static_cast<T>(h.beta1),
            static_cast<T>(1.0 - h.beta1),
            static_cast<T>(h.beta2),
            static_cast<T>(1.0 - h.beta2),
            static_cast<T>(1.0 - std::pow(h.beta1, t)),
            static_cast<T>(1.0 - std::pow(h.beta2, t)),
            static_cast<T>(h.eps),
            static_cast<T>(h.weightDecay),
            (1.0 - h.beta1) < 0.5};
  }
  template <class T>
  BAGUA_OPTIM_HD static T update(const Scalars<T>& c, T p, T g, T* s) {
    const T m = lerpT(s[0], g, c.oneMinusBeta1, c.beta1, c.lerpSmall);
    const T v = c.beta2 * s[1] + c.oneMinusBeta2 * (g * g);
    s[0] = m;
    s[1] = v;
    return (m / c.bc1) / (sqrtT(v / c.bc2) + c.eps) + c.weightDecay * p;
  }
  // Also compiled for the device (the CUDA path computes the factor there): double sqrt and
  // division are IEEE on both sides, so the factor is the same bits.
  template <class T>
  BAGUA_OPTIM_HD static T trust(const Scalars<T>& /*c*/, double pNormSq, double uNormSq) {
    if (pNormSq > 0.0 && uNormSq > 0.0) {
      return static_cast<T>(std::sqrt(pNormSq) / std::sqrt(uNormSq));
    }
    return T(1);
  }
  template <class T>
  BAGUA_OPTIM_HD static void applyTrust(const Scalars<T>& c, T& p, T u, T trust) {
    p = p - (c.lr * trust) * u;
  }
};

}  // namespace bagua::optim
