// Each built-in rule against an independent double-precision implementation of PyTorch's
// documented update (written out here from the torch.optim docs, not from rules.h), for several
// steps: f64 parameters agree to rounding (1e-12 relative), f32 parameters within 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "bagua/optimizer/elementwise.h"
#include "optimizer_support.h"

namespace bagua::optim {
namespace {

using core::DataType;
using testing::Model;

// One tensor's reference state: named buffers, lazily sized.
struct RefState {
  std::vector<double> a, b, c;
  int64_t step = 0;
};

// Reference step for one tensor: p and g in double.
using RefStep =
    std::function<void(std::vector<double>& p, const std::vector<double>& g, RefState& s)>;

template <class Opt>
void compareWithReference(const typename Opt::Hyper& hyper, const RefStep& ref, int steps) {
  for (DataType dt : {DataType::kF64, DataType::kF32}) {
    const std::vector<testing::Spec> specs = {{37, dt}, {1, dt}, {2000, dt}, {5, dt}};
    Model m(specs);
    std::vector<std::vector<double>> p(specs.size());
    std::vector<RefState> st(specs.size());
    for (size_t t = 0; t < specs.size(); ++t) {
      for (size_t i = 0; i < specs[t].numel; ++i) {
        p[t].push_back(testing::loadAs(dt, m.params()[t].data, i));
      }
    }
    OptimizerOptions o;
    o.threads = 2;
    o.chunkElements = 1024;
    auto opt = Opt::create(m.params(), hyper, o);
    ASSERT_TRUE(opt.isOk()) << opt.status().toString();
    ASSERT_TRUE((*opt)->fuse().isOk());
    for (int step = 0; step < steps; ++step) {
      m.fillGrads(static_cast<uint64_t>(step));
      for (size_t t = 0; t < specs.size(); ++t) {
        std::vector<double> g;
        for (size_t i = 0; i < specs[t].numel; ++i) {
          g.push_back(testing::loadAs(dt, m.params()[t].grad, i));
        }
        st[t].step += 1;
        ref(p[t], g, st[t]);
      }
      ASSERT_TRUE((*opt)->step().isOk());
    }
    const double tol = dt == DataType::kF64 ? 1e-12 : 1e-5;
    for (size_t t = 0; t < specs.size(); ++t) {
      for (size_t i = 0; i < specs[t].numel; ++i) {
        const double got = testing::loadAs(dt, m.params()[t].data, i);
        ASSERT_NEAR(got, p[t][i], tol * std::max(1.0, std::fabs(p[t][i])))
            << Opt::RuleType::kName << " " << core::dataTypeName(dt) << " tensor " << t
            << " element " << i;
      }
    }
  }
}

void sized(std::vector<double>& v, size_t n, double init = 0.0) {
  if (v.size() != n) {
    v.assign(n, init);
  }
}

TEST(Reference, SgdMomentumNesterovDampeningWeightDecay) {
  for (bool nesterov : {false, true}) {
    SgdRule::Hyper h;
    h.lr = 0.1;
    h.momentum = 0.9;
    h.dampening = nesterov ? 0.0 : 0.3;
    h.nesterov = nesterov;
    h.weightDecay = 0.01;
    compareWithReference<Sgd>(
        h,
        [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
          const bool first = s.a.empty();
          sized(s.a, p.size());
          for (size_t i = 0; i < p.size(); ++i) {
            double d = g[i] + h.weightDecay * p[i];
            s.a[i] = first ? d : h.momentum * s.a[i] + (1 - h.dampening) * d;
            d = h.nesterov ? d + h.momentum * s.a[i] : s.a[i];
            p[i] -= h.lr * d;
          }
        },
        6);
  }
}

TEST(Reference, AdamAndAdamWWithAmsgrad) {
  for (bool decoupled : {false, true}) {
    AdamRule::Hyper h;
    h.lr = 0.01;
    h.weightDecay = 0.1;
    h.amsgrad = true;
    h.decoupled = decoupled;
    compareWithReference<Adam>(
        h,
        [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
          sized(s.a, p.size());
          sized(s.b, p.size());
          sized(s.c, p.size());
          const double t = static_cast<double>(s.step);
          for (size_t i = 0; i < p.size(); ++i) {
            double gi = g[i];
            if (h.decoupled) {
              p[i] *= 1 - h.lr * h.weightDecay;
            } else {
              gi += h.weightDecay * p[i];
            }
            s.a[i] = h.beta1 * s.a[i] + (1 - h.beta1) * gi;
            s.b[i] = h.beta2 * s.b[i] + (1 - h.beta2) * gi * gi;
            s.c[i] = std::max(s.c[i], s.b[i]);
            const double mhat = s.a[i] / (1 - std::pow(h.beta1, t));
            const double vhat = s.c[i] / (1 - std::pow(h.beta2, t));
            p[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
          }
        },
        6);
  }
}

TEST(Reference, Adagrad) {
  AdagradRule::Hyper h;
  h.lr = 0.1;
  h.lrDecay = 0.05;
  h.weightDecay = 0.01;
  h.initialAccumulatorValue = 0.2;
  compareWithReference<Adagrad>(
      h,
      [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
        sized(s.a, p.size(), h.initialAccumulatorValue);
        const double clr = h.lr / (1 + static_cast<double>(s.step - 1) * h.lrDecay);
        for (size_t i = 0; i < p.size(); ++i) {
          const double gi = g[i] + h.weightDecay * p[i];
          s.a[i] += gi * gi;
          p[i] -= clr * gi / (std::sqrt(s.a[i]) + h.eps);
        }
      },
      6);
}

TEST(Reference, RmspropCenteredWithMomentum) {
  RmspropRule::Hyper h;
  h.lr = 0.01;
  h.momentum = 0.5;
  h.centered = true;
  h.weightDecay = 0.01;
  compareWithReference<Rmsprop>(
      h,
      [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
        sized(s.a, p.size());
        sized(s.b, p.size());
        sized(s.c, p.size());
        for (size_t i = 0; i < p.size(); ++i) {
          const double gi = g[i] + h.weightDecay * p[i];
          s.a[i] = h.alpha * s.a[i] + (1 - h.alpha) * gi * gi;
          s.c[i] = h.alpha * s.c[i] + (1 - h.alpha) * gi;
          const double avg = std::sqrt(s.a[i] - s.c[i] * s.c[i]) + h.eps;
          s.b[i] = h.momentum * s.b[i] + gi / avg;
          p[i] -= h.lr * s.b[i];
        }
      },
      6);
}

TEST(Reference, Adadelta) {
  AdadeltaRule::Hyper h;
  h.lr = 0.5;
  h.weightDecay = 0.01;
  compareWithReference<Adadelta>(
      h,
      [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
        sized(s.a, p.size());
        sized(s.b, p.size());
        for (size_t i = 0; i < p.size(); ++i) {
          const double gi = g[i] + h.weightDecay * p[i];
          s.a[i] = h.rho * s.a[i] + (1 - h.rho) * gi * gi;
          const double d = std::sqrt(s.b[i] + h.eps) / std::sqrt(s.a[i] + h.eps) * gi;
          s.b[i] = h.rho * s.b[i] + (1 - h.rho) * d * d;
          p[i] -= h.lr * d;
        }
      },
      6);
}

TEST(Reference, Adamax) {
  AdamaxRule::Hyper h;
  h.lr = 0.01;
  h.weightDecay = 0.01;
  compareWithReference<Adamax>(
      h,
      [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
        sized(s.a, p.size());
        sized(s.b, p.size());
        const double clr = h.lr / (1 - std::pow(h.beta1, static_cast<double>(s.step)));
        for (size_t i = 0; i < p.size(); ++i) {
          const double gi = g[i] + h.weightDecay * p[i];
          s.a[i] = h.beta1 * s.a[i] + (1 - h.beta1) * gi;
          s.b[i] = std::max(h.beta2 * s.b[i], std::fabs(gi) + h.eps);
          p[i] -= clr * s.a[i] / s.b[i];
        }
      },
      6);
}

TEST(Reference, LambTrustRatioPerTensor) {
  LambRule::Hyper h;
  h.lr = 0.01;
  h.weightDecay = 0.01;
  compareWithReference<Lamb>(
      h,
      [h](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
        sized(s.a, p.size());
        sized(s.b, p.size());
        const double t = static_cast<double>(s.step);
        std::vector<double> u(p.size());
        double pn = 0, un = 0;
        for (size_t i = 0; i < p.size(); ++i) {
          s.a[i] = h.beta1 * s.a[i] + (1 - h.beta1) * g[i];
          s.b[i] = h.beta2 * s.b[i] + (1 - h.beta2) * g[i] * g[i];
          u[i] = (s.a[i] / (1 - std::pow(h.beta1, t))) /
                     (std::sqrt(s.b[i] / (1 - std::pow(h.beta2, t))) + h.eps) +
                 h.weightDecay * p[i];
          pn += p[i] * p[i];
          un += u[i] * u[i];
        }
        const double trust = pn > 0 && un > 0 ? std::sqrt(pn) / std::sqrt(un) : 1.0;
        for (size_t i = 0; i < p.size(); ++i) {
          p[i] -= h.lr * trust * u[i];
        }
      },
      5);
}

}  // namespace
}  // namespace bagua::optim
