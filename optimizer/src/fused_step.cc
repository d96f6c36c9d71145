// FusedOptimizer's steps: one kernel call per fused run of the plan and per remaining tensor (or
// per tensor for plainStep), after the gradient scaler's inf/NaN check (fused_parts.h).
#include <cmath>
#include <cstdint>

#include "bagua/base/logging.h"
#include "bagua/core/ddp.h"
#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/grad_scaler.h"
#include "bagua/optimizer/params.h"
#include "bagua/optimizer/rules.h"
#include "fused_parts.h"

namespace bagua::optim {

using core::DeviceType;

KernelArgs FusedOptimizer::argsOf(const Slot& s) const {
  KernelArgs a;
  const core::Parameter& p = params_[s.param];
  a.storage = s.storage;
  a.param = p.data;
  a.grad = p.grad;
  a.master = s.master;
  for (int k = 0; k < kMaxStates; ++k) {
    a.states[k] = s.state[k];
  }
  a.numel = s.numel;
  a.mask = stateMask(s.group);
  return a;
}

Status FusedOptimizer::stepSlot(Slot& s, double invScale) {
  Range r;
  r.group = s.group;
  r.device = s.device;
  r.args = argsOf(s);
  r.args.invScale = invScale;
  segments_.assign(1, s.numel);
  r.segments = segments_.data();
  r.numSegments = 1;
  r.step = s.step + 1;
  BAGUA_RETURN_IF_ERROR(applyRange(r));
  s.step += 1;
  return Status::ok();
}

Status FusedOptimizer::stepRun(PlanRun& run, double invScale) {
  const Slot& first = *slots_[run.first];
  const Partition& part = *partitions_[run.partition];
  Range r;
  r.group = part.group;
  r.device = part.device;
  r.args = argsOf(first);
  r.args.invScale = invScale;
  r.args.numel = run.numel;
  r.segments = plan_->segments.data() + run.segBegin;
  r.numSegments = run.segCount;
  r.step = first.step + run.pending + 1;
  BAGUA_RETURN_IF_ERROR(applyRange(r));
  run.pending += 1;
  return Status::ok();
}

Status FusedOptimizer::checkNonFinite(double invScale, bool* found) {
  *found = false;
  Plan& plan = *plan_;
  // CUDA: every range of a device with one flag and one read-back.
  for (size_t i = 0; i < plan.scans.size(); ++i) {
    Plan::Scan& sc = plan.scans[i];
    sc.args.invScale = invScale;
    if (sc.device.type != DeviceType::kCuda) {
      continue;
    }
    const int dev = sc.device.index;
    if (dev < 0) {
      return BAGUA_ERROR(kInvalidArgument, "%s: bad CUDA device index %d", ruleName(), dev);
    }
    if (cudaFlags_.size() <= static_cast<size_t>(dev)) {
      cudaFlags_.resize(static_cast<size_t>(dev) + 1);
    }
    if (!cudaFlags_[dev]) {
      BAGUA_ASSIGN_OR_RETURN(cudaFlags_[dev], Buffer::make(sc.device, sizeof(int)));
    }
    bool f = false;
    BAGUA_RETURN_IF_ERROR(cudaNonFinite(sc.args, dev, static_cast<int*>(cudaFlags_[dev]->ptr), &f));
    *found = *found || f;
  }
  // CPU ranges are split into chunks and scanned in parallel.
  BAGUA_RETURN_IF_ERROR(pool_->parallelFor(plan.chunks.size(), [&](size_t c) {
    const Plan::Chunk& ch = plan.chunks[c];
    const KernelArgs& a = plan.scans[ch.scan].args;
    bool any = false;
    switch (a.storage) {
    case StorageType::kF32: {
      const float* g = static_cast<const float*>(a.grad);
      const float inv = static_cast<float>(a.invScale);
      for (size_t i = ch.begin; i < ch.end; ++i) {
        any |= !std::isfinite(g[i] * inv);
      }
      break;
    }
    case StorageType::kF64: {
      const double* g = static_cast<const double*>(a.grad);
      for (size_t i = ch.begin; i < ch.end; ++i) {
        any |= !std::isfinite(g[i] * a.invScale);
      }
      break;
    }
    case StorageType::kF16:
    case StorageType::kBF16: {
      const uint16_t* g = static_cast<const uint16_t*>(a.grad);
      const float inv = static_cast<float>(a.invScale);
      const bool half = a.storage == StorageType::kF16;
      for (size_t i = ch.begin; i < ch.end; ++i) {
        const float v = half ? fromHalfBits(g[i]) : fromBf16Bits(g[i]);
        any |= !std::isfinite(v * inv);
      }
      break;
    }
    }
    plan.bad[c] = any ? 1 : 0;
  }));
  for (uint8_t b : plan.bad) {
    *found = *found || b != 0;
  }
  return Status::ok();
}

Status FusedOptimizer::runStep(bool fused) {
  // O(groups): every slot of a group got the group's states at creation.
  for (size_t gi = 0; gi < groupParams_.size(); ++gi) {
    const unsigned missing = stateMask(static_cast<int>(gi)) & ~allocMask_[gi];
    if (missing != 0 && !groupParams_[gi].empty()) {
      int k = 0;
      while (((missing >> k) & 1u) == 0) {
        ++k;
      }
      return BAGUA_ERROR(kFailedPrecondition,
                         "%s: group %zu now needs state '%s', which was not allocated at "
                         "creation (set such hyper-parameters before creating the optimizer)",
                         ruleName(), gi, stateName(k));
    }
  }
  if (ddp_ != nullptr && fused_ && fuseOptions_.doFlatten && ddp_->options().gradientAsBucketView) {
    bool changed = ddpFlats_.size() != ddp_->buckets().size();
    for (size_t b = 0; !changed && b < ddpFlats_.size(); ++b) {
      changed = ddpFlats_[b] != ddp_->buckets()[b].flat;
    }
    if (changed) {
      BAGUA_LOG_INFO(kLogOptim, "%s: the reducer's buckets changed; laying parameters out again",
                     ruleName());
      BAGUA_RETURN_IF_ERROR(refreshReducerLayout());
    }
  }
  BAGUA_RETURN_IF_ERROR(ensurePlan(!fused || fuseOptions_.checkFlatten));
  if (fused && fuseOptions_.checkFlatten && !warnedMoved_ && !plan_->intact) {
    BAGUA_LOG_WARN(kLogOptim,
                   "%s: tensors flattened by fuse() have moved; only the runs that are still "
                   "contiguous are fused",
                   ruleName());
    warnedMoved_ = true;
  }
  double invScale = 1.0;
  lastSkipped_ = false;
  if (scaler_ != nullptr && scaler_->enabled()) {
    invScale = static_cast<double>(scaler_->invScale());
    bool found = false;
    BAGUA_RETURN_IF_ERROR(checkNonFinite(invScale, &found));
    if (found) {
      lastSkipped_ = true;
      scaler_->update(true);
      BAGUA_LOG_DEBUG(kLogOptim, "%s: inf/NaN gradients, step skipped, scale now %g", ruleName(),
                      static_cast<double>(scaler_->scale()));
      return Status::ok();
    }
  }
  lastFusedRuns_ = 0;
  lastFusedTensors_ = 0;
  if (fused) {
    for (PlanRun& run : plan_->runs) {
      BAGUA_RETURN_IF_ERROR(stepRun(run, invScale));
    }
    for (int si : plan_->singles) {
      BAGUA_RETURN_IF_ERROR(stepSlot(*slots_[si], invScale));
    }
    lastFusedRuns_ = plan_->runs.size();
    lastFusedTensors_ = plan_->runSlots.size();
    fusedCount_ += plan_->groupsFused;
  } else {
    // Per tensor: fold the runs' steps into the slots first. Every slot of a run has a gradient,
    // so they all step again here and stay equal: the plan stands.
    for (PlanRun& r : plan_->runs) {
      for (size_t i = r.slotBegin; i < r.slotBegin + r.slotCount; ++i) {
        slots_[plan_->runSlots[i]]->step += r.pending;
      }
      r.pending = 0;
    }
    for (const auto& s : slots_) {
      if (params_[s->param].grad != nullptr) {
        BAGUA_RETURN_IF_ERROR(stepSlot(*s, invScale));
      }
    }
  }
  if (scaler_ != nullptr) {
    scaler_->update(false);
  }
  return Status::ok();
}

Status FusedOptimizer::fuseStep() {
  return runStep(true);
}

Status FusedOptimizer::plainStep() {
  return runStep(false);
}

Status FusedOptimizer::step() {
  return runStep(fused_);
}

void FusedOptimizer::zeroGrad() {
  for (const auto& s : slots_) {
    const core::Parameter& p = params_[s->param];
    if (p.grad != nullptr) {
      detail::zeroOn(p.device, p.grad, p.bytes()).ignore();
    }
  }
}

}  // namespace bagua::optim
