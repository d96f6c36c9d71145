// The small parameter abstraction the reducer works on, so any trainer (hand-written, libtorch,
// ...) can use it: a name, the weights, the gradient, element count, dtype and device.
//
// Ownership: the trainer owns the memory. With gradient_as_bucket_view the reducer moves the
// gradient into its bucket storage and tells the trainer through setGrad(); from then on the
// trainer must write gradients at the new address (which stays valid until the reducer is
// destroyed or calls setGrad again).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "bagua/core/types.h"

namespace bagua::core {

struct Parameter {
  std::string name;  // "{module}.{param}", e.g. "fc1.weight"
  void* data = nullptr;
  void* grad = nullptr;  // may be null for buffers and params without grad
  size_t numel = 0;
  DataType dtype = DataType::kF32;
  Device device;
  bool requiresGrad = true;
  // Re-points the trainer's gradient (gradient_as_bucket_view). Optional otherwise.
  std::function<void(void* newGrad)> setGrad;
  // Optional: memory the trainer reserves for this gradient for the reducer's whole life and
  // that nothing else uses (do_flatten's laid-out gradients: one buffer, tensors back to back).
  // A bucket whose tensors' homes lie back to back in the bucket's order (and, on a device,
  // start 16-byte aligned) uses that memory as its storage (Bucket::inPlace): a gradient written
  // at its home is not copied in, and the reduced gradient is not copied back to it. The
  // reducer writes there during backward and finishBackward. Not with gradient_as_bucket_view.
  void* gradHome = nullptr;
  // Optional: the tensor's dimensions, outermost first (their product is numel). Empty: unknown,
  // seen as one dimension of numel. Algorithms that view gradients as matrices (powersgd: the
  // first dimension by the product of the others) read it; the reducer itself does not.
  std::vector<size_t> shape;

  size_t bytes() const { return numel * dataTypeSize(dtype); }
};

// An optimizer the reducer can step and whose state it can broadcast.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual Status step() = 0;
  virtual void zeroGrad() = 0;
  // Tensors of state (momentum buffers, ...) that must equal rank 0's after wrapping.
  virtual std::vector<Parameter> stateTensors() { return {}; }
};

// Plain SGD with momentum and weight decay on f32 CPU parameters, reading the gradients through
// the trainer's parameter list (so re-pointed gradients are followed).
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Parameter>& params, float lr, float momentum = 0.0f, float weightDecay = 0.0f);
  Status step() override;
  void zeroGrad() override;
  std::vector<Parameter> stateTensors() override;

 private:
  std::vector<Parameter>& params_;
  float lr_;
  float momentum_;
  float weightDecay_;
  std::vector<std::vector<float>> velocity_;
};

}  // namespace bagua::core
