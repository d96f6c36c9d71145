// Bagua's test_fused_optimizer oracle, ported: a 2 -> 3 -> 1 sigmoid network with fixed initial
// weights, input [0.1 .. 0.6] as 3 x 2, loss = sum of the outputs, two parameter groups (weight
// decay 0.1 and 0.0 where the rule has one), 101 epochs alternating fuse_step (even epochs) and
// step; the parameters must equal plain step's bit for bit and fused_count must be 102 (2 groups x
// 51 fused steps). Options as Bagua's test: SGD momentum 1 with Nesterov on/off, dampening 0 or
// 0.5, weight decay 1; Adam and AdamW with weight decay 0 or 1 x amsgrad; RMSprop centered x
// momentum; Adadelta and Adamax with weight decay 0 or 1; plus Adagrad and LAMB.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bagua/optimizer/elementwise.h"

namespace bagua::optim {
namespace {

// The network: W1 [3x2], b1 [3], W2 [1x3], b2 [1], each in its own allocation.
class Net {
 public:
  Net() {
    const float w1[6] = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f};
    const float b1[3] = {0.05f, -0.05f, 0.1f};
    const float w2[3] = {0.7f, -0.8f, 0.9f};
    const float b2[1] = {-0.1f};
    add("fc1.weight", w1, 6);
    add("fc1.bias", b1, 3);
    add("fc2.weight", w2, 3);
    add("fc2.bias", b2, 1);
  }
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;
  std::vector<core::Parameter>& params() { return params_; }

  // Forward and backward of sum(sigmoid(W2 sigmoid(W1 x + b1) + b2)) over the 3 samples; writes
  // the gradients through params_[i].grad.
  void backward() {
    const float* w1 = f(0);
    const float* b1 = f(1);
    const float* w2 = f(2);
    const float* b2 = f(3);
    float* gw1 = g(0);
    float* gb1 = g(1);
    float* gw2 = g(2);
    float* gb2 = g(3);
    std::memset(gw1, 0, 6 * 4);
    std::memset(gb1, 0, 3 * 4);
    std::memset(gw2, 0, 3 * 4);
    std::memset(gb2, 0, 4);
    for (int n = 0; n < 3; ++n) {
      const float x[2] = {0.1f * static_cast<float>(2 * n + 1),
                          0.1f * static_cast<float>(2 * n + 2)};
      float h[3];
      float z2 = b2[0];
      for (int j = 0; j < 3; ++j) {
        const float z = w1[j * 2] * x[0] + w1[j * 2 + 1] * x[1] + b1[j];
        h[j] = 1.0f / (1.0f + std::exp(-z));
        z2 += w2[j] * h[j];
      }
      const float y = 1.0f / (1.0f + std::exp(-z2));
      const float dz2 = y * (1.0f - y);
      gb2[0] += dz2;
      for (int j = 0; j < 3; ++j) {
        gw2[j] += dz2 * h[j];
        const float dz = dz2 * w2[j] * h[j] * (1.0f - h[j]);
        gb1[j] += dz;
        gw1[j * 2] += dz * x[0];
        gw1[j * 2 + 1] += dz * x[1];
      }
    }
  }

  std::vector<float> weights() const {
    std::vector<float> out;
    for (const auto& p : params_) {
      const auto* d = static_cast<const float*>(p.data);
      out.insert(out.end(), d, d + p.numel);
    }
    return out;
  }

 private:
  void add(const char* name, const float* init, size_t n) {
    data_.push_back(std::make_unique<float[]>(n + 16));
    grad_.push_back(std::make_unique<float[]>(n + 16));
    std::memcpy(data_.back().get(), init, n * 4);
    core::Parameter p;
    p.name = name;
    p.data = data_.back().get();
    p.grad = grad_.back().get();
    p.numel = n;
    const size_t idx = params_.size();
    p.setGrad = [this, idx](void* gr) { params_[idx].grad = gr; };
    params_.push_back(std::move(p));
  }
  const float* f(int i) const { return static_cast<const float*>(params_[i].data); }
  float* g(int i) { return static_cast<float*>(params_[i].grad); }

  std::vector<std::unique_ptr<float[]>> data_, grad_;
  std::vector<core::Parameter> params_;
};

template <class Opt>
void oracle(typename Opt::Hyper h0, typename Opt::Hyper h1, const std::string& what) {
  SCOPED_TRACE(what);
  Net fusedNet, plainNet;
  auto groups = [&](std::vector<core::Parameter>&) {
    typename Opt::Group a, b;
    a.params = {0, 2};  // weights
    a.hyper = h0;
    b.params = {1, 3};  // biases
    b.hyper = h1;
    return std::vector<typename Opt::Group>{a, b};
  };
  OptimizerOptions o;
  o.threads = 1;
  auto fused = Opt::create(fusedNet.params(), groups(fusedNet.params()), o);
  auto plain = Opt::create(plainNet.params(), groups(plainNet.params()), o);
  ASSERT_TRUE(fused.isOk()) << fused.status().toString();
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  ASSERT_TRUE((*fused)->fuse().isOk());
  for (int epoch = 0; epoch < 101; ++epoch) {
    fusedNet.backward();
    plainNet.backward();
    ASSERT_TRUE((epoch % 2 == 0 ? (*fused)->fuseStep() : (*fused)->plainStep()).isOk());
    ASSERT_TRUE((*plain)->step().isOk());
  }
  const auto a = fusedNet.weights();
  const auto b = plainNet.weights();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "not bitwise equal";
  EXPECT_EQ((*fused)->fusedCount(), 102);
  for (float v : a) {
    EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(BaguaOracle, Sgd) {
  for (bool nesterov : {false, true}) {
    for (double dampening : {0.0, 0.5}) {
      if (nesterov && dampening != 0.0) {
        continue;  // PyTorch rejects Nesterov with dampening
      }
      SgdRule::Hyper h;
      h.lr = 0.01;
      h.momentum = 1.0;
      h.nesterov = nesterov;
      h.dampening = dampening;
      h.weightDecay = 1.0;
      SgdRule::Hyper h1 = h;
      h1.weightDecay = 0.0;
      oracle<Sgd>(
          h, h1,
          "sgd nesterov=" + std::to_string(nesterov) + " dampening=" + std::to_string(dampening));
    }
  }
}

TEST(BaguaOracle, AdamAndAdamW) {
  for (double wd : {0.0, 1.0}) {
    for (bool ams : {false, true}) {
      AdamRule::Hyper h;
      h.weightDecay = wd;
      h.amsgrad = ams;
      oracle<Adam>(h, h, "adam");
      AdamWRule::Hyper w;
      w.weightDecay = wd;
      w.amsgrad = ams;
      oracle<AdamW>(w, w, "adamw");
    }
  }
}

TEST(BaguaOracle, RmspropAdadeltaAdamaxAdagradLamb) {
  for (bool centered : {false, true}) {
    for (double momentum : {0.0, 0.9}) {
      RmspropRule::Hyper h;
      h.centered = centered;
      h.momentum = momentum;
      oracle<Rmsprop>(h, h, "rmsprop");
    }
  }
  for (double wd : {0.0, 1.0}) {
    AdadeltaRule::Hyper d;
    d.weightDecay = wd;
    oracle<Adadelta>(d, d, "adadelta");
    AdamaxRule::Hyper m;
    m.weightDecay = wd;
    oracle<Adamax>(m, m, "adamax");
  }
  AdagradRule::Hyper g;
  g.weightDecay = 0.1;
  oracle<Adagrad>(g, AdagradRule::Hyper{}, "adagrad");
  LambRule::Hyper l;
  l.weightDecay = 0.1;
  LambRule::Hyper l0;
  l0.weightDecay = 0.0;
  oracle<Lamb>(l, l0, "lamb");
}

}  // namespace
}  // namespace bagua::optim
