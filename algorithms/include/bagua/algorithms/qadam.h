// QAdamOptimizer: Bagua's QAdam optimizer (arXiv 2102.02888) for f32 parameters on the CPU or on
// CUDA devices (m and v live next to each parameter; a CUDA kernel steps device parameters with
// the host loop's float operations in the same order, so both sides agree bit for bit). Pair it
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
// Zero variance (Bagua #654 "QAdam NaN"): an element whose gradient was exactly zero through
// the whole warm-up (a dead ReLU unit, an embedding row no batch touched) has frozen v = 0, so
// Bagua's update there is lr/(1-b1^t) * m / eps, i.e. m * 1e8 * lr with the default eps. Its m
// stays exactly 0 while no rank has a gradient for it (a 0 makes its chunk straddle 0, and
// MinMaxUInt8 then returns 0 exactly), but the first gradient it gets after the warm-up (the
// unit revives, the row is used) is divided by eps: training diverges. With
// QAdamOptions::holdZeroVariance (default on) such elements are held in the compression stage
// (t >= warmup_steps and v == 0 exactly: no parameter update; m and v are still kept): QAdam has
// no variance estimate to scale their step by. v and the averaged m are identical on every rank,
// so replicas stay bitwise identical. Nothing else changes: the
// warm-up is still exactly Adam, and elements with v != 0 get Bagua's update bit for bit. Off
// gives Bagua's exact math everywhere. A held element stays held (v is frozen): a unit that
// revives after warm-up keeps its warm-up weights; lengthen the warm-up if that matters.
//
// Device parameters: step() and zeroGrad() enqueue on the calling thread's per-thread default
// stream and wait for it (bounded by QAdamOptions::deviceTimeout) before returning, so the
// parameters are updated when they return, as on the CPU.
//
// Thread safety: step()/zeroGrad() on the trainer's thread. During backward the reducer's
// bucket thread writes m of the bucket's parameters (compression stage only); the reducer
// finishes that (device work included) before finishBackward() returns.
#pragma once

#include <chrono>
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
  // Compression stage: no update for elements whose frozen v is exactly 0 (see above). Off:
  // Bagua's exact update (which diverges on such elements with a small eps).
  bool holdZeroVariance = true;
  // Bound on waiting for a step's device work (CUDA parameters): DeadlineExceeded past it.
  std::chrono::milliseconds deviceTimeout{300000};
};

class QAdamOptimizer final : public core::Optimizer {
 public:
  // InvalidArgument for warmup_steps <= 0, lr < 0, betas outside [0, 1), eps < 0, a parameter
  // that is not f32; FailedPrecondition for a CUDA parameter in a build without the CUDA kernels;
  // CudaError if the device state cannot be allocated. `params` is borrowed (must outlive the
  // optimizer).
  static Result<std::unique_ptr<QAdamOptimizer>> create(std::vector<core::Parameter>& params,
                                                        const QAdamOptions& options = {});
  ~QAdamOptimizer() override;
  QAdamOptimizer(const QAdamOptimizer&) = delete;
  QAdamOptimizer& operator=(const QAdamOptimizer&) = delete;

  Status step() override;
  // Zeroes the gradients (device ones on the device; an error is logged, the interface has no
  // status).
  void zeroGrad() override;
  // m and v of every parameter ("<name>.exp_avg", "<name>.exp_avg_sq"), on the parameter's side.
  std::vector<core::Parameter> stateTensors() override;

  int64_t stepCount() const { return step_; }
  const QAdamOptions& options() const { return options_; }
  // Changes QAdamOptions::holdZeroVariance (the `qadam` algorithm's hold_zero_variance argument
  // sets it); on the trainer's thread, between steps.
  void setHoldZeroVariance(bool on) { options_.holdZeroVariance = on; }
  // The momentum and variance of parameter `param` (index into the parameter list), where the
  // parameter lives: host memory for a CPU parameter, device memory for a CUDA one.
  float* expAvg(int param);
  float* expAvgSq(int param);
  // Copies m (second = false) or v (second = true) of `param` to or from host memory, either
  // side, synchronously (checkpoints, tests). InvalidArgument for an index out of range.
  [[nodiscard]] Status readState(int param, bool second, float* hostOut);
  [[nodiscard]] Status writeState(int param, bool second, const float* hostIn);

 private:
  struct State;  // m and v of one parameter, on its side (qadam.cc)

  QAdamOptimizer(std::vector<core::Parameter>& params, const QAdamOptions& options);

  std::vector<core::Parameter>& params_;
  QAdamOptions options_;
  int64_t step_ = 0;
  std::vector<std::unique_ptr<State>> state_;
};

}  // namespace bagua::algo
