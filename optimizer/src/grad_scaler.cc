#include "bagua/optimizer/grad_scaler.h"

#include <cmath>
#include <cstring>

namespace bagua::optim {

Result<GradScaler> GradScaler::create(const GradScalerOptions& options) {
  if (!(options.initScale > 0.0) || !std::isfinite(static_cast<float>(options.initScale))) {
    return BAGUA_ERROR(kInvalidArgument, "GradScaler: init_scale %g must be a positive f32 value",
                       options.initScale);
  }
  if (!(options.growthFactor > 1.0)) {
    return BAGUA_ERROR(kInvalidArgument, "GradScaler: growth_factor %g must be > 1",
                       options.growthFactor);
  }
  if (!(options.backoffFactor > 0.0 && options.backoffFactor < 1.0)) {
    return BAGUA_ERROR(kInvalidArgument, "GradScaler: backoff_factor %g must be in (0, 1)",
                       options.backoffFactor);
  }
  if (options.growthInterval < 1) {
    return BAGUA_ERROR(kInvalidArgument, "GradScaler: growth_interval %lld must be >= 1",
                       static_cast<long long>(options.growthInterval));
  }
  return GradScaler(options);
}

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(static_cast<float>(options.initScale)) {}

float GradScaler::invScale() const {
  if (!options_.enabled) {
    return 1.0f;
  }
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

void GradScaler::update(bool foundInf) {
  if (!options_.enabled) {
    return;
  }
  if (foundInf) {
    scale_ = scale_ * static_cast<float>(options_.backoffFactor);
    tracker_ = 0;
    return;
  }
  const int64_t successful = tracker_ + 1;
  if (successful == options_.growthInterval) {
    const float grown = scale_ * static_cast<float>(options_.growthFactor);
    if (std::isfinite(grown)) {
      scale_ = grown;
    }
    tracker_ = 0;
  } else {
    tracker_ = successful;
  }
}

std::vector<uint8_t> GradScaler::save() const {
  std::vector<uint8_t> out(sizeof scale_ + sizeof tracker_);
  std::memcpy(out.data(), &scale_, sizeof scale_);
  std::memcpy(out.data() + sizeof scale_, &tracker_, sizeof tracker_);
  return out;
}

Status GradScaler::load(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != sizeof scale_ + sizeof tracker_) {
    return BAGUA_ERROR(kInvalidArgument, "GradScaler::load: %zu bytes, expected %zu", bytes.size(),
                       sizeof scale_ + sizeof tracker_);
  }
  float s;
  int64_t t;
  std::memcpy(&s, bytes.data(), sizeof s);
  std::memcpy(&t, bytes.data() + sizeof s, sizeof t);
  if (!(s > 0.0f) || !std::isfinite(s) || t < 0) {
    return BAGUA_ERROR(kInvalidArgument, "GradScaler::load: bad scale %g or tracker %lld",
                       static_cast<double>(s), static_cast<long long>(t));
  }
  scale_ = s;
  tracker_ = t;
  return Status::ok();
}

}  // namespace bagua::optim
