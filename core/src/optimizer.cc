#include <algorithm>

#include "bagua/core/parameter.h"

namespace bagua::core {

Sgd::Sgd(std::vector<Parameter>& params, float lr, float momentum, float weightDecay)
    : params_(params), lr_(lr), momentum_(momentum), weightDecay_(weightDecay) {
  velocity_.resize(params_.size());
  if (momentum_ != 0.0f) {
    for (size_t i = 0; i < params_.size(); ++i) {
      velocity_[i].assign(params_[i].numel, 0.0f);
    }
  }
}

Status Sgd::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    if (!p.requiresGrad || p.grad == nullptr) {
      continue;
    }
    if (p.dtype != DataType::kF32 || p.device.type != DeviceType::kCpu) {
      return BAGUA_ERROR(kInvalidArgument, "Sgd handles f32 CPU parameters; %s is %s on %s",
                         p.name.c_str(), dataTypeName(p.dtype), deviceTypeName(p.device.type));
    }
    auto* w = static_cast<float*>(p.data);
    const auto* g = static_cast<const float*>(p.grad);
    if (momentum_ == 0.0f) {
      for (size_t k = 0; k < p.numel; ++k) {
        w[k] -= lr_ * (g[k] + weightDecay_ * w[k]);
      }
    } else {
      float* v = velocity_[i].data();
      for (size_t k = 0; k < p.numel; ++k) {
        v[k] = momentum_ * v[k] + g[k] + weightDecay_ * w[k];
        w[k] -= lr_ * v[k];
      }
    }
  }
  return Status::ok();
}

void Sgd::zeroGrad() {
  for (Parameter& p : params_) {
    if (p.grad != nullptr) {
      std::fill_n(static_cast<uint8_t*>(p.grad), p.bytes(), uint8_t{0});
    }
  }
}

std::vector<Parameter> Sgd::stateTensors() {
  std::vector<Parameter> out;
  for (size_t i = 0; i < velocity_.size(); ++i) {
    if (velocity_[i].empty()) {
      continue;
    }
    Parameter s;
    s.name = params_[i].name + ".momentum_buffer";
    s.data = velocity_[i].data();
    s.numel = velocity_[i].size();
    s.requiresGrad = false;
    out.push_back(s);
  }
  return out;
}

}  // namespace bagua::core
