#include "bagua/algorithms/qadam.h"

#include <cmath>
#include <cstring>
#include <map>

#include "bagua/algorithms/algorithms.h"
#include "bytegrad_op.h"

namespace bagua::algo {

Result<std::unique_ptr<QAdamOptimizer>> QAdamOptimizer::create(std::vector<core::Parameter>& params,
                                                               const QAdamOptions& o) {
  if (o.warmupSteps <= 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "qadam: warmup_steps=%d must be > 0 (the first steps are plain Adam and "
                       "set the variance that the compression stage freezes)",
                       o.warmupSteps);
  }
  if (!(o.lr >= 0.0f) || !(o.eps >= 0.0f) || !(o.beta1 >= 0.0f && o.beta1 < 1.0f) ||
      !(o.beta2 >= 0.0f && o.beta2 < 1.0f) || !(o.weightDecay >= 0.0f)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "qadam: lr=%g, betas=(%g, %g), eps=%g, weight_decay=%g: need lr, eps, "
                       "weight_decay >= 0 and betas in [0, 1)",
                       o.lr, o.beta1, o.beta2, o.eps, o.weightDecay);
  }
  for (const core::Parameter& p : params) {
    if (p.dtype != core::DataType::kF32 || p.device.type != core::DeviceType::kCpu) {
      return BAGUA_ERROR(kInvalidArgument,
                         "qadam: parameter '%s' is %s on %s; QAdamOptimizer steps f32 CPU "
                         "parameters only (CUDA tensors are not implemented for qadam)",
                         p.name.c_str(), core::dataTypeName(p.dtype),
                         p.device.type == core::DeviceType::kCpu ? "cpu" : "cuda");
    }
  }
  return std::unique_ptr<QAdamOptimizer>(new QAdamOptimizer(params, o));
}

QAdamOptimizer::QAdamOptimizer(std::vector<core::Parameter>& params, const QAdamOptions& options)
    : params_(params), options_(options) {
  for (const core::Parameter& p : params_) {
    m_.emplace_back(p.numel, 0.0f);
    v_.emplace_back(p.numel, 0.0f);
  }
}

Status QAdamOptimizer::step() {
  const int64_t t = ++step_;
  const QAdamOptions& o = options_;
  const bool warm = t < o.warmupSteps;
  const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(t));
  const float stepSize = static_cast<float>(static_cast<double>(o.lr) / bc1);
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = o.beta1;
  const float b2 = o.beta2;
  const float ob1 = 1.0f - b1;
  const float ob2 = 1.0f - b2;
  for (size_t k = 0; k < params_.size(); ++k) {
    core::Parameter& p = params_[k];
    if (!p.requiresGrad || p.grad == nullptr) {
      continue;
    }
    auto* x = static_cast<float*>(p.data);
    const auto* grad = static_cast<const float*>(p.grad);
    float* m = m_[k].data();
    float* v = v_[k].data();
    if (warm) {
      for (size_t i = 0; i < p.numel; ++i) {
        float g = grad[i];
        if (o.weightDecay != 0.0f) {
          g = g + x[i] * o.weightDecay;
        }
        m[i] = m[i] * b1 + g * ob1;
        v[i] = v[i] * b2 + g * g * ob2;
      }
    }
    for (size_t i = 0; i < p.numel; ++i) {
      const float denom = std::sqrt(v[i]) / bc2Sqrt + o.eps;
      x[i] = x[i] + (-stepSize) * (m[i] / denom);
    }
  }
  return Status::ok();
}

void QAdamOptimizer::zeroGrad() {
  for (core::Parameter& p : params_) {
    if (p.grad != nullptr) {
      std::memset(p.grad, 0, p.bytes());
    }
  }
}

std::vector<core::Parameter> QAdamOptimizer::stateTensors() {
  std::vector<core::Parameter> out;
  for (size_t k = 0; k < params_.size(); ++k) {
    core::Parameter m;
    m.name = params_[k].name + ".exp_avg";
    m.data = m_[k].data();
    m.numel = m_[k].size();
    out.push_back(m);
    core::Parameter v = m;
    v.name = params_[k].name + ".exp_avg_sq";
    v.data = v_[k].data();
    out.push_back(v);
  }
  return out;
}

namespace {

class QAdamImpl final : public core::AlgorithmImpl {
 public:
  QAdamImpl(QAdamOptimizer* opt, bool compressed, bool hierarchical)
      : opt_(opt), compressed_(compressed), hierarchical_(hierarchical) {}

  bool needReset(core::DistributedDataParallel& /*ddp*/) override {
    return !compressed_ && opt_->stepCount() >= opt_->options().warmupSteps;
  }

  std::vector<core::TensorRef> initTensors(core::DistributedDataParallel& ddp) override {
    tensors_ = core::AlgorithmImpl::initTensors(ddp);
    return tensors_;
  }

  Status initOperations(core::Bucket& bucket) override {
    if (bucket.dtype != core::DataType::kF32) {
      return BAGUA_ERROR(kInvalidArgument, "qadam: bucket %d holds %s; f32 only", bucket.index,
                         core::dataTypeName(bucket.dtype));
    }
    if (bucket.device.type != core::DeviceType::kCpu) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "qadam: bucket %d is on cuda:%d; QAdam runs on CPU tensors only (its "
                         "optimizer steps host memory): use bytegrad or gradient_allreduce on "
                         "GPUs",
                         bucket.index, bucket.device.index);
    }
    scratch_.try_emplace(bucket.index);
    return Status::ok();
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    auto* flat = static_cast<float*>(b.flat);
    if (!compressed_) {
      // Warm-up: Adam on full-precision averaged gradients (never hierarchical, as in Bagua).
      return g.global()
          .allReduce(flat, flat, b.numel, core::DataType::kF32, core::ReduceOp::kAvg)
          ->wait(g.options().collectiveTimeout);
    }
    const float b1 = opt_->options().beta1;
    const float ob1 = 1.0f - b1;
    // The bucket holds the local gradients; turn them into the local momentum update.
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      const core::TensorRef& t = tensors_[b.tensors[k]];
      const float* m = opt_->expAvg(t.paramIndex);
      float* slot = flat + b.offsets[k];
      for (size_t i = 0; i < t.numel; ++i) {
        slot[i] = m[i] * b1 + slot[i] * ob1;
      }
    }
    BAGUA_RETURN_IF_ERROR(detail::byteGradAllReduce(detail::Exec{}, flat, b.numel, g, hierarchical_,
                                                    true, scratch_.at(b.index)));
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      const core::TensorRef& t = tensors_[b.tensors[k]];
      std::memcpy(opt_->expAvg(t.paramIndex), flat + b.offsets[k], t.numel * sizeof(float));
    }
    return Status::ok();
  }

 private:
  QAdamOptimizer* opt_;
  bool compressed_;
  bool hierarchical_;
  std::vector<core::TensorRef> tensors_;
  std::map<int, detail::ByteGradScratch> scratch_;
};

}  // namespace

Result<std::unique_ptr<core::AlgorithmImpl>> QAdam::reify(core::ProcessGroup& group) {
  if (optimizer_ == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "qadam: no QAdamOptimizer given (the algorithm updates its momentum)");
  }
  if (hierarchical_ && group.intraNode() == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "qadam(hierarchical=true) needs a process group created with "
                       "hierarchical sub-groups, or pass hierarchical=false");
  }
  const bool compressed = optimizer_->stepCount() >= optimizer_->options().warmupSteps;
  return std::unique_ptr<core::AlgorithmImpl>(new QAdamImpl(optimizer_, compressed, hierarchical_));
}

}  // namespace bagua::algo
