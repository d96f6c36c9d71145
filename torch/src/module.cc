#include "bagua/torch/module.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <string>
#include <utility>

namespace bagua::libtorch {

// Shared by the hooks (owned by autograd's nodes) and the wrapper: detach() clears `ddp`, so a
// hook that outlives the wrapper (autograd keeps nodes alive while graphs exist) does nothing.
struct TorchModule::HookState {
  core::DistributedDataParallel* ddp = nullptr;
  Status first;
};

namespace {

class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::shared_ptr<TorchModule::HookState> state, int index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (state_->ddp != nullptr && state_->first.isOk()) {
      Status s = state_->ddp->markGradReady(index_);
      if (!s.isOk()) {
        state_->first = std::move(s);
      }
    }
    return outputs;
  }

 private:
  std::shared_ptr<TorchModule::HookState> state_;
  int index_;
};

Result<core::Parameter> describe(const std::string& name, torch::Tensor& t, bool withGrad) {
  if (!t.device().is_cpu()) {
    return BAGUA_ERROR(kInvalidArgument,
                       "torch tensor '%s' is on %s: the libtorch integration handles CPU tensors "
                       "(move the module to CPU, or use the core API with device Parameters)",
                       name.c_str(), t.device().str().c_str());
  }
  if (!t.is_contiguous()) {
    return BAGUA_ERROR(kInvalidArgument, "torch tensor '%s' is not contiguous", name.c_str());
  }
  BAGUA_ASSIGN_OR_RETURN(core::DataType dt, toDataType(t.scalar_type()));
  core::Parameter p;
  p.name = name;
  p.data = t.data_ptr();
  p.numel = static_cast<size_t>(t.numel());
  p.dtype = dt;
  p.requiresGrad = withGrad && t.requires_grad();
  if (p.requiresGrad) {
    if (!t.grad().defined()) {
      t.mutable_grad() = torch::zeros_like(t, torch::MemoryFormat::Contiguous);
    }
    p.grad = t.grad().data_ptr();
    // gradient_as_bucket_view: the parameter's .grad() becomes a view of the bucket memory.
    torch::Tensor handle = t;  // shares the TensorImpl
    p.setGrad = [handle](void* newGrad) mutable {
      handle.mutable_grad() = torch::from_blob(newGrad, handle.sizes(), handle.options());
    };
  }
  return p;
}

}  // namespace

Result<core::DataType> toDataType(c10::ScalarType type) {
  switch (type) {
  case c10::ScalarType::Float:
    return core::DataType::kF32;
  case c10::ScalarType::Half:
    return core::DataType::kF16;
  case c10::ScalarType::BFloat16:
    return core::DataType::kBF16;
  case c10::ScalarType::Double:
    return core::DataType::kF64;
  case c10::ScalarType::Int:
    return core::DataType::kI32;
  case c10::ScalarType::Long:
    return core::DataType::kI64;
  case c10::ScalarType::Byte:
    return core::DataType::kU8;
  default:
    return BAGUA_ERROR(kInvalidArgument, "torch dtype %s has no core equivalent",
                       c10::toString(type));
  }
}

Result<std::unique_ptr<TorchModule>> TorchModule::wrap(torch::nn::Module& module) {
  std::unique_ptr<TorchModule> m(new TorchModule());
  torch::NoGradGuard noGrad;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    torch::Tensor t = item.value();
    BAGUA_ASSIGN_OR_RETURN(core::Parameter p, describe(item.key(), t, /*withGrad=*/true));
    m->tensors_.push_back(t);
    m->params_.push_back(std::move(p));
  }
  for (auto& item : module.named_buffers(/*recurse=*/true)) {
    torch::Tensor t = item.value();
    BAGUA_ASSIGN_OR_RETURN(core::Parameter p, describe(item.key(), t, /*withGrad=*/false));
    m->bufferTensors_.push_back(t);
    m->buffers_.push_back(std::move(p));
  }
  return m;
}

TorchModule::~TorchModule() {
  detach();
}

Status TorchModule::attach(core::DistributedDataParallel& ddp) {
  detach();
  hooks_ = std::make_shared<HookState>();
  hooks_->ddp = &ddp;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!params_[i].requiresGrad) {
      continue;
    }
    // The leaf's AccumulateGrad node: its post hooks run after the gradient was accumulated
    // into .grad(). Keep the node alive (torch holds it weakly from the tensor).
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(tensors_[i]);
    if (!acc) {
      return BAGUA_ERROR(kFailedPrecondition, "parameter '%s' has no gradient accumulator",
                         params_[i].name.c_str());
    }
    hookKeys_.push_back(
        acc->add_post_hook(std::make_unique<ReadyHook>(hooks_, static_cast<int>(i))));
    accumulators_.push_back(std::move(acc));
  }
  return Status::ok();
}

void TorchModule::detach() {
  if (hooks_) {
    hooks_->ddp = nullptr;
  }
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hookKeys_[i]);
  }
  accumulators_.clear();
  hookKeys_.clear();
}

Status TorchModule::takeHookStatus() {
  if (!hooks_) {
    return Status::ok();
  }
  Status s = std::move(hooks_->first);
  hooks_->first = Status::ok();
  return s;
}

void TorchModule::zeroGrad() {
  torch::NoGradGuard noGrad;
  for (torch::Tensor& t : tensors_) {
    if (t.grad().defined()) {
      t.mutable_grad().zero_();
    }
  }
}

}  // namespace bagua::libtorch
