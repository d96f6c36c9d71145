#include "example_mlp.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace bagua::example {

using core::DataType;
using core::Parameter;

Mlp::Mlp(const MlpConfig& config) : config_(config) {
  std::mt19937_64 rng(config.seed);
  const int nLayers = static_cast<int>(config.sizes.size()) - 1;
  auto addParam = [&](size_t numel, float scale) {
    std::vector<float> w(numel);
    std::normal_distribution<float> dist(0.0f, scale);
    for (float& v : w) {
      v = scale > 0 ? dist(rng) : 0.0f;
    }
    storage_.push_back(std::move(w));
    storage_.emplace_back(numel, 0.0f);  // gradient
    return static_cast<int>(storage_.size() - 2);
  };
  std::vector<std::pair<std::string, int>> made;
  std::vector<std::vector<size_t>> shapes;
  for (int i = 0; i < nLayers; ++i) {
    Layer l;
    l.in = config.sizes[i];
    l.out = config.sizes[i + 1];
    const float scale = std::sqrt(2.0f / static_cast<float>(l.in));
    made.push_back(
        {"fc" + std::to_string(i) + ".weight", addParam(static_cast<size_t>(l.in) * l.out, scale)});
    made.push_back({"fc" + std::to_string(i) + ".bias", addParam(l.out, 0.0f)});
    shapes.push_back({static_cast<size_t>(l.out), static_cast<size_t>(l.in)});
    shapes.push_back({static_cast<size_t>(l.out)});
    l.weight = static_cast<int>(made.size()) - 2;
    l.bias = static_cast<int>(made.size()) - 1;
    layers_.push_back(l);
  }
  if (config.auxHead) {
    aux_.in = config.sizes[nLayers - 1];
    aux_.out = config.sizes[nLayers];
    made.push_back({"aux.weight", addParam(static_cast<size_t>(aux_.in) * aux_.out,
                                           std::sqrt(1.0f / static_cast<float>(aux_.in)))});
    made.push_back({"aux.bias", addParam(aux_.out, 0.0f)});
    shapes.push_back({static_cast<size_t>(aux_.out), static_cast<size_t>(aux_.in)});
    shapes.push_back({static_cast<size_t>(aux_.out)});
    aux_.weight = static_cast<int>(made.size()) - 2;
    aux_.bias = static_cast<int>(made.size()) - 1;
  }
  for (size_t i = 0; i < made.size(); ++i) {
    Parameter p;
    p.name = made[i].first;
    const int s = made[i].second;
    p.data = storage_[s].data();
    p.grad = storage_[s + 1].data();
    p.numel = storage_[s].size();
    p.shape = shapes[i];
    p.dtype = DataType::kF32;
    const size_t idx = i;
    p.setGrad = [this, idx](void* g) { params_[idx].grad = g; };
    params_.push_back(std::move(p));
  }
  runningMean_.assign(config.sizes[0], 0.0f);
  Parameter rm;
  rm.name = "input_norm.running_mean";
  rm.data = runningMean_.data();
  rm.numel = runningMean_.size();
  rm.requiresGrad = false;
  buffers_.push_back(rm);
}

size_t Mlp::numParams() const {
  size_t n = 0;
  for (const auto& p : params_) {
    n += p.numel;
  }
  return n;
}

namespace {

// y[b][o] = sum_i x[b][i] * w[o][i] + bias[o]
void linear(const float* x, const float* w, const float* bias, float* y, int batch, int in,
            int out) {
  for (int b = 0; b < batch; ++b) {
    const float* xb = x + static_cast<size_t>(b) * in;
    float* yb = y + static_cast<size_t>(b) * out;
    for (int o = 0; o < out; ++o) {
      const float* wo = w + static_cast<size_t>(o) * in;
      float acc = bias[o];
      for (int i = 0; i < in; ++i) {
        acc += xb[i] * wo[i];
      }
      yb[o] = acc;
    }
  }
}

// dW[o][i] += sum_b dy[b][o] x[b][i]; db[o] += sum_b dy[b][o]; dx[b][i] = sum_o dy[b][o] w[o][i]
void linearBackward(const float* x, const float* w, const float* dy, float* dw, float* db,
                    float* dx, int batch, int in, int out) {
  for (int b = 0; b < batch; ++b) {
    const float* xb = x + static_cast<size_t>(b) * in;
    const float* dyb = dy + static_cast<size_t>(b) * out;
    for (int o = 0; o < out; ++o) {
      const float g = dyb[o];
      float* dwo = dw + static_cast<size_t>(o) * in;
      for (int i = 0; i < in; ++i) {
        dwo[i] += g * xb[i];
      }
      db[o] += g;
    }
  }
  if (dx != nullptr) {
    std::fill_n(dx, static_cast<size_t>(batch) * in, 0.0f);
    for (int b = 0; b < batch; ++b) {
      const float* dyb = dy + static_cast<size_t>(b) * out;
      float* dxb = dx + static_cast<size_t>(b) * in;
      for (int o = 0; o < out; ++o) {
        const float* wo = w + static_cast<size_t>(o) * in;
        const float g = dyb[o];
        for (int i = 0; i < in; ++i) {
          dxb[i] += g * wo[i];
        }
      }
    }
  }
}

}  // namespace

float Mlp::forward(const float* x, const int32_t* labels, int batch, bool useAux) {
  batch_ = batch;
  usedAux_ = useAux && config_.auxHead;
  const int nLayers = static_cast<int>(layers_.size());
  acts_.resize(nLayers + 1);
  acts_[0].assign(x, x + static_cast<size_t>(batch) * config_.sizes[0]);
  // Buffer update (like batch norm's running mean): not used by the output.
  for (int i = 0; i < config_.sizes[0]; ++i) {
    float m = 0;
    for (int b = 0; b < batch; ++b) {
      m += x[static_cast<size_t>(b) * config_.sizes[0] + i];
    }
    runningMean_[i] = 0.9f * runningMean_[i] + 0.1f * (batch > 0 ? m / batch : 0.0f);
  }
  for (int l = 0; l < nLayers; ++l) {
    const Layer& L = layers_[l];
    acts_[l + 1].resize(static_cast<size_t>(batch) * L.out);
    linear(acts_[l].data(), data(L.weight), data(L.bias), acts_[l + 1].data(), batch, L.in, L.out);
    if (l + 1 < nLayers) {
      for (float& v : acts_[l + 1]) {
        v = v > 0 ? v : 0;
      }
    }
  }
  const int classes = config_.sizes.back();
  probs_ = acts_[nLayers];
  if (usedAux_) {
    std::vector<float> extra(static_cast<size_t>(batch) * classes);
    linear(acts_[nLayers - 1].data(), data(aux_.weight), data(aux_.bias), extra.data(), batch,
           aux_.in, aux_.out);
    for (size_t k = 0; k < extra.size(); ++k) {
      probs_[k] += extra[k];
    }
  }
  labels_.assign(labels, labels + batch);
  double loss = 0;
  correct_ = 0;
  for (int b = 0; b < batch; ++b) {
    float* z = probs_.data() + static_cast<size_t>(b) * classes;
    const float mx = *std::max_element(z, z + classes);
    int arg = static_cast<int>(std::max_element(z, z + classes) - z);
    float sum = 0;
    for (int c = 0; c < classes; ++c) {
      z[c] = std::exp(z[c] - mx);
      sum += z[c];
    }
    for (int c = 0; c < classes; ++c) {
      z[c] /= sum;
    }
    loss -= std::log(std::max(z[labels[b]], 1e-30f));
    correct_ += arg == labels[b] ? 1 : 0;
  }
  return batch > 0 ? static_cast<float>(loss / batch) : 0.0f;
}

void Mlp::backward(const std::function<void(int)>& ready) {
  const int nLayers = static_cast<int>(layers_.size());
  const int classes = config_.sizes.back();
  std::vector<float> dy(probs_);
  for (int b = 0; b < batch_; ++b) {
    dy[static_cast<size_t>(b) * classes + labels_[b]] -= 1.0f;
  }
  for (float& v : dy) {
    v /= static_cast<float>(batch_);
  }
  std::vector<float> dx;
  if (usedAux_) {
    std::vector<float> dxa(static_cast<size_t>(batch_) * aux_.in);
    linearBackward(acts_[nLayers - 1].data(), data(aux_.weight), dy.data(), grad(aux_.weight),
                   grad(aux_.bias), dxa.data(), batch_, aux_.in, aux_.out);
    ready(aux_.bias);
    ready(aux_.weight);
    dx = std::move(dxa);
  }
  for (int l = nLayers - 1; l >= 0; --l) {
    const Layer& L = layers_[l];
    std::vector<float> dIn(l > 0 ? static_cast<size_t>(batch_) * L.in : 0);
    linearBackward(acts_[l].data(), data(L.weight), dy.data(), grad(L.weight), grad(L.bias),
                   l > 0 ? dIn.data() : nullptr, batch_, L.in, L.out);
    ready(L.bias);
    ready(L.weight);
    if (l > 0) {
      if (l == nLayers - 1 && !dx.empty()) {
        for (size_t k = 0; k < dIn.size(); ++k) {
          dIn[k] += dx[k];
        }
      }
      // ReLU of layer l-1's output.
      const std::vector<float>& a = acts_[l];
      for (size_t k = 0; k < dIn.size(); ++k) {
        dIn[k] = a[k] > 0 ? dIn[k] : 0.0f;
      }
      dy = std::move(dIn);
    }
  }
}

void Mlp::zeroGrad() {
  for (Parameter& p : params_) {
    std::fill_n(static_cast<float*>(p.grad), p.numel, 0.0f);
  }
}

}  // namespace bagua::example
