#include "bagua/algorithms/qadam.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "bytegrad_op.h"
#include "vec_ops.h"

namespace bagua::algo {

struct QAdamOptimizer::State {
  detail::Exec exec;
  size_t numel = 0;
  std::vector<float> hostM;
  std::vector<float> hostV;
  detail::Buffer devM;
  detail::Buffer devV;

  float* m() { return exec.device ? devM.f32() : hostM.data(); }
  float* v() { return exec.device ? devV.f32() : hostV.data(); }
};

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
  if (o.deviceTimeout.count() <= 0) {
    return BAGUA_ERROR(kInvalidArgument, "qadam: device timeout %lld ms must be > 0",
                       static_cast<long long>(o.deviceTimeout.count()));
  }
  std::unique_ptr<QAdamOptimizer> opt(new QAdamOptimizer(params, o));
  for (const core::Parameter& p : params) {
    if (p.dtype != core::DataType::kF32) {
      return BAGUA_ERROR(kInvalidArgument,
                         "qadam: parameter '%s' is %s; QAdamOptimizer steps f32 parameters only",
                         p.name.c_str(), core::dataTypeName(p.dtype));
    }
    auto exec = detail::execFor(p.device, "qadam");
    if (!exec.isOk()) {
      Status s = exec.takeStatus();
      return std::move(s.withContext("qadam: parameter '" + p.name + "'"));
    }
    auto st = std::make_unique<State>();
    st->exec = *exec;
    st->numel = p.numel;
    if (st->exec.device) {
      // Zero-initialised, like the host vectors.
      const size_t bytes = p.numel * sizeof(float);
      Status s = st->devM.ensure(st->exec, bytes);
      if (s.isOk()) {
        s = st->devV.ensure(st->exec, bytes);
      }
      if (!s.isOk()) {
        return std::move(s.withContext("qadam: state of parameter '" + p.name + "'"));
      }
    } else {
      st->hostM.assign(p.numel, 0.0f);
      st->hostV.assign(p.numel, 0.0f);
    }
    opt->state_.push_back(std::move(st));
  }
  return opt;
}

QAdamOptimizer::QAdamOptimizer(std::vector<core::Parameter>& params, const QAdamOptions& options)
    : params_(params), options_(options) {}

QAdamOptimizer::~QAdamOptimizer() = default;

Status QAdamOptimizer::step() {
  const int64_t t = ++step_;
  const QAdamOptions& o = options_;
  const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(t));
  detail::QAdamStepArgs a;
  a.warm = t < o.warmupSteps;
  a.weightDecay = o.weightDecay;
  a.b1 = o.beta1;
  a.b2 = o.beta2;
  a.ob1 = 1.0f - o.beta1;
  a.ob2 = 1.0f - o.beta2;
  a.stepSize = static_cast<float>(static_cast<double>(o.lr) / bc1);
  a.bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  a.eps = o.eps;
  a.holdZeroVariance = o.holdZeroVariance;  // vec_ops applies it outside warm-up only
  std::vector<int> devices;                 // to wait for
  for (size_t k = 0; k < params_.size(); ++k) {
    core::Parameter& p = params_[k];
    if (!p.requiresGrad || p.grad == nullptr) {
      continue;
    }
    State& st = *state_[k];
    if (st.numel != p.numel) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "qadam: parameter '%s' has %zu elements, its state %zu (the parameter "
                         "list changed after create())",
                         p.name.c_str(), p.numel, st.numel);
    }
    BAGUA_RETURN_IF_ERROR(detail::qadamStep(st.exec, static_cast<float*>(p.data),
                                            static_cast<const float*>(p.grad), st.m(), st.v(),
                                            p.numel, a));
    if (st.exec.device &&
        std::find(devices.begin(), devices.end(), st.exec.deviceIndex) == devices.end()) {
      devices.push_back(st.exec.deviceIndex);
    }
  }
  for (int d : devices) {
    BAGUA_RETURN_IF_ERROR(detail::sync(detail::Exec{true, d}, o.deviceTimeout));
  }
  return Status::ok();
}

void QAdamOptimizer::zeroGrad() {
  std::vector<int> devices;
  for (size_t k = 0; k < params_.size(); ++k) {
    core::Parameter& p = params_[k];
    if (p.grad == nullptr) {
      continue;
    }
    const detail::Exec& x = state_[k]->exec;
    Status s = detail::zeroBytes(x, p.grad, p.bytes());
    if (!s.isOk()) {
      BAGUA_LOG_WARN(kLogAlgo, "qadam: zeroGrad of '%s': %s", p.name.c_str(), s.toString().c_str());
    }
    if (x.device && std::find(devices.begin(), devices.end(), x.deviceIndex) == devices.end()) {
      devices.push_back(x.deviceIndex);
    }
  }
  for (int d : devices) {
    Status s = detail::sync(detail::Exec{true, d}, options_.deviceTimeout);
    if (!s.isOk()) {
      BAGUA_LOG_WARN(kLogAlgo, "qadam: zeroGrad on cuda:%d: %s", d, s.toString().c_str());
    }
  }
}

std::vector<core::Parameter> QAdamOptimizer::stateTensors() {
  std::vector<core::Parameter> out;
  for (size_t k = 0; k < params_.size(); ++k) {
    core::Parameter m;
    m.name = params_[k].name + ".exp_avg";
    m.data = state_[k]->m();
    m.numel = state_[k]->numel;
    m.device = params_[k].device;
    out.push_back(m);
    core::Parameter v = m;
    v.name = params_[k].name + ".exp_avg_sq";
    v.data = state_[k]->v();
    out.push_back(v);
  }
  return out;
}

float* QAdamOptimizer::expAvg(int param) {
  return state_[static_cast<size_t>(param)]->m();
}

float* QAdamOptimizer::expAvgSq(int param) {
  return state_[static_cast<size_t>(param)]->v();
}

Status QAdamOptimizer::readState(int param, bool second, float* hostOut) {
  if (param < 0 || static_cast<size_t>(param) >= state_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "qadam: parameter index %d of %zu", param, state_.size());
  }
  State& st = *state_[static_cast<size_t>(param)];
  return detail::copyToHost(st.exec, hostOut, second ? st.v() : st.m(), st.numel * sizeof(float));
}

Status QAdamOptimizer::writeState(int param, bool second, const float* hostIn) {
  if (param < 0 || static_cast<size_t>(param) >= state_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "qadam: parameter index %d of %zu", param, state_.size());
  }
  State& st = *state_[static_cast<size_t>(param)];
  return detail::copyFromHost(st.exec, second ? st.v() : st.m(), hostIn, st.numel * sizeof(float));
}

namespace {

class QAdamImpl final : public core::AlgorithmImpl {
 public:
  // warmup: the full-precision stage (gradient_allreduce's, non-hierarchical as in Bagua; it
  // averages on host or device and falls back to SUM + divide on NCCL without ncclAvg); null in
  // the compression stage.
  QAdamImpl(QAdamOptimizer* opt, std::unique_ptr<core::AlgorithmImpl> warmup, bool hierarchical)
      : opt_(opt), warmup_(std::move(warmup)), hierarchical_(hierarchical) {}

  bool needReset(core::DistributedDataParallel& /*ddp*/) override {
    return warmup_ != nullptr && opt_->stepCount() >= opt_->options().warmupSteps;
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
    BAGUA_ASSIGN_OR_RETURN(detail::Exec exec, detail::execFor(bucket.device, "qadam"));
    if (warmup_ != nullptr) {
      BAGUA_RETURN_IF_ERROR(warmup_->initOperations(bucket));
    }
    scratch_.try_emplace(bucket.index);  // created here, on the trainer's thread
    exec_[bucket.index] = exec;
    return Status::ok();
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    if (warmup_ != nullptr) {
      // Warm-up: Adam on full-precision averaged gradients.
      return warmup_->runBucket(b, g);
    }
    auto it = scratch_.find(b.index);
    if (it == scratch_.end()) {
      return BAGUA_ERROR(kInternal, "qadam: bucket %d was not initialised", b.index);
    }
    const detail::Exec& x = exec_.at(b.index);
    auto* flat = static_cast<float*>(b.flat);
    const float b1 = opt_->options().beta1;
    const float ob1 = 1.0f - b1;
    // The bucket holds the local gradients; turn them into the local momentum update.
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      const core::TensorRef& t = tensors_[b.tensors[k]];
      BAGUA_RETURN_IF_ERROR(detail::momentumMix(x, flat + b.offsets[k], opt_->expAvg(t.paramIndex),
                                                b1, ob1, t.numel));
    }
    // Device: the exchange is ordered after momentumMix on this thread's stream and synced.
    BAGUA_RETURN_IF_ERROR(
        detail::byteGradAllReduce(x, flat, b.numel, g, hierarchical_, true, it->second));
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      const core::TensorRef& t = tensors_[b.tensors[k]];
      BAGUA_RETURN_IF_ERROR(detail::copyBytes(x, opt_->expAvg(t.paramIndex), flat + b.offsets[k],
                                              t.numel * sizeof(float)));
    }
    // m is complete before finishBackward() returns and the optimizer steps.
    return detail::sync(x, g.options().collectiveTimeout);
  }

 private:
  QAdamOptimizer* opt_;
  std::unique_ptr<core::AlgorithmImpl> warmup_;
  bool hierarchical_;
  std::vector<core::TensorRef> tensors_;
  std::map<int, detail::ByteGradScratch> scratch_;
  std::map<int, detail::Exec> exec_;
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
  std::unique_ptr<core::AlgorithmImpl> warmup;
  if (optimizer_->stepCount() < optimizer_->options().warmupSteps) {
    GradientAllReduce fullPrecision(/*hierarchical=*/false, /*average=*/true);
    BAGUA_ASSIGN_OR_RETURN(warmup, fullPrecision.reify(group));
  }
  return std::unique_ptr<core::AlgorithmImpl>(
      new QAdamImpl(optimizer_, std::move(warmup), hierarchical_));
}

}  // namespace bagua::algo
