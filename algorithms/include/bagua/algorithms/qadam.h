// QAdamOptimizer: Bagua's QAdam optimizer (arXiv 2102.02888) for f32 CPU parameters. Pair it
// with the `qadam` algorithm (algorithms.h), which averages the gradients in full precision
// during warm-up and the compressed momentum afterwards.
//
// Step t (1-based, after the increment), per parameter with a gradient:
//   g = grad + weight_decay * param                      (L2 style)
//   if t < warmup_steps:  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   param -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// While t < warmup_steps this is exactly Adam (torch.optim.Adam's float32 operation order, the
// scalar factors computed in double). Afterwards m is updated by the algorithm's bucket
// operation (m = b1*m + (1-b1)*grad, then averaged with MinMaxUInt8 compression) and v stays
// frozen, as in Bagua.
//
// Thread safety: step()/zeroGrad() on the trainer's thread. During backward the reducer's
// bucket thread writes m of the bucket's parameters (compression stage only); the reducer
// finishes that before finishBackward() returns.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/parameter.h"

namespace bagua::algo {

struct QAdamOptions {
  float lr = 1e-3f;
  int warmupSteps = 100;  // must be > 0 (Bagua raises ValueError otherwise)
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0.0f;
};

class QAdamOptimizer final : public core::Optimizer {
 public:
  // InvalidArgument for warmup_steps <= 0, lr < 0, betas outside [0, 1), eps < 0, a parameter
  // that is not f32 on the CPU. `params` is borrowed (must outlive the optimizer).
  static Result<std::unique_ptr<QAdamOptimizer>> create(std::vector<core::Parameter>& params,
                                                        const QAdamOptions& options = {});

  Status step() override;
  void zeroGrad() override;
  // m and v of every parameter ("<name>.exp_avg", "<name>.exp_avg_sq").
  std::vector<core::Parameter> stateTensors() override;

  int64_t stepCount() const { return step_; }
  const QAdamOptions& options() const { return options_; }
  // The momentum of parameter `param` (index into the parameter list).
  float* expAvg(int param) { return m_[param].data(); }
  float* expAvgSq(int param) { return v_[param].data(); }

 private:
  QAdamOptimizer(std::vector<core::Parameter>& params, const QAdamOptions& options);

  std::vector<core::Parameter>& params_;
  QAdamOptions options_;
  int64_t step_ = 0;
  std::vector<std::vector<float>> m_;
  std::vector<std::vector<float>> v_;
};

}  // namespace bagua::algo
