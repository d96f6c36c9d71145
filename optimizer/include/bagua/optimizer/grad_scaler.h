// Dynamic loss scaling as torch.cuda.amp.GradScaler does it: the trainer multiplies its loss by
// scale() before backward; the optimizer step (FusedOptimizer::setGradScaler) unscales gradients
// by invScale() inside the kernel, skips the step when any unscaled gradient is inf/NaN, and calls
// update(): on inf/NaN the scale is multiplied by backoffFactor and the growth tracker reset;
// after growthInterval consecutive good steps it is multiplied by growthFactor (kept only if
// finite). The scale is an f32 value like PyTorch's scale tensor; invScale() is
// float(1 / double(scale)) as GradScaler computes it.
//
// Thread safety: none; owned by the trainer thread.
#pragma once

#include <cstdint>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::optim {

struct GradScalerOptions {
  double initScale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  static Result<GradScaler> create(const GradScalerOptions& options = {});

  bool enabled() const { return options_.enabled; }
  float scale() const { return scale_; }
  // The gradient multiplier: 1 when disabled.
  float invScale() const;
  int64_t growthTracker() const { return tracker_; }
  void update(bool foundInf);

  // scale (f32 bits) and growth tracker, for checkpoints.
  std::vector<uint8_t> save() const;
  Status load(const std::vector<uint8_t>& bytes);

 private:
  explicit GradScaler(const GradScalerOptions& options);
  GradScalerOptions options_;
  float scale_ = 65536.0f;
  int64_t tracker_ = 0;
};

}  // namespace bagua::optim
