// libtorch integration: a torch::nn::Module's parameters and buffers as core Parameters (the
// reducer works on the tensors' own storage, no copies), and autograd hooks that mark each
// gradient ready for the reducer as soon as autograd has accumulated it, so bucket all-reduces
// overlap the rest of the backward pass (what PyTorch DDP does with its AccumulateGrad hooks).
//
// Usage:
//   auto tm = TorchModule::wrap(*net);                         // gradients allocated once
//   core::Sgd opt(tm->parameters(), lr);                       // or any core::Optimizer
//   auto ddp = core::withBagua(tm->parameters(), tm->buffers(), {&opt}, algorithm, pg);
//   tm->attach(**ddp);
//   loop: tm->zeroGrad(); ddp->prepareForward(); loss = ...; loss.backward();
//         tm->takeHookStatus(); ddp->finishBackward(); ddp->step();
//
// Gradients: wrap() gives every parameter that requires grad a zero gradient tensor, so torch
// accumulates into that storage in place and the pointer the reducer holds stays valid; zero
// them with zeroGrad() (never set them to undefined, e.g. torch's zero_grad(set_to_none=true)).
// With gradient_as_bucket_view the reducer re-points a gradient into its bucket; the wrapper
// then makes the parameter's .grad() a tensor over that bucket memory.
//
// Threads: hooks run on the thread autograd runs CPU work on, which for CPU graphs is the thread
// that called backward(): the trainer's thread, as DistributedDataParallel requires. Not
// thread-safe otherwise. Errors inside a hook cannot propagate through autograd: the first one is
// kept and returned by takeHookStatus() (later hooks of the same backward are skipped).
// Parameters must be CPU tensors of a dtype core knows (f32, f16, bf16, f64, i32, i64, u8).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/ddp.h"
#include "bagua/core/parameter.h"

namespace bagua::libtorch {

// Maps a torch dtype to core's; kInvalidArgument for the others.
Result<core::DataType> toDataType(c10::ScalarType type);

class TorchModule {
 public:
  // Wraps `module` (borrowed: it must outlive the wrapper). Parameter names are torch's
  // "{module}.{param}" names (what DdpOptions::paramsToIgnore matches).
  static Result<std::unique_ptr<TorchModule>> wrap(torch::nn::Module& module);
  ~TorchModule();  // removes the hooks
  TorchModule(const TorchModule&) = delete;
  TorchModule& operator=(const TorchModule&) = delete;

  std::vector<core::Parameter>& parameters() { return params_; }
  std::vector<core::Parameter>& buffers() { return buffers_; }
  const std::vector<torch::Tensor>& parameterTensors() const { return tensors_; }

  // Registers a post-accumulation hook per parameter that requires grad: it calls
  // ddp.markGradReady(i). `ddp` is borrowed until detach() or destruction.
  Status attach(core::DistributedDataParallel& ddp);
  void detach();
  // The first error a hook met since the last call (Ok if none), and resets it.
  Status takeHookStatus();
  // Zeroes every gradient in place.
  void zeroGrad();

  struct HookState;

 private:
  TorchModule() = default;

  std::vector<torch::Tensor> tensors_;  // parameters, same order as params_
  std::vector<torch::Tensor> bufferTensors_;
  std::vector<core::Parameter> params_;
  std::vector<core::Parameter> buffers_;
  std::shared_ptr<HookState> hooks_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hookKeys_;
};

}  // namespace bagua::libtorch
