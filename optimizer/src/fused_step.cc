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
  a.stream = streamFor(s.device);
  return a;
}

void* FusedOptimizer::streamFor(const core::Device& device) const {
  if (!bwActive_ || device.type != DeviceType::kCuda || device.index < 0 ||
      static_cast<size_t>(device.index) >= bwStreams_.size()) {
    return nullptr;  // the legacy default stream
  }
  return bwStreams_[static_cast<size_t>(device.index)];
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

Status FusedOptimizer::checkStateMasks() const {
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
  return Status::ok();
}

bool FusedOptimizer::reducerLayoutStale() const {
  if (ddp_ == nullptr || !fused_ || !fuseOptions_.doFlatten ||
      !ddp_->options().gradientAsBucketView) {
    return false;
  }
  bool changed = ddpFlats_.size() != ddp_->buckets().size();
  for (size_t b = 0; !changed && b < ddpFlats_.size(); ++b) {
    changed = ddpFlats_[b] != ddp_->buckets()[b].flat;
  }
  return changed;
}

Status FusedOptimizer::runStep(bool fused) {
  if (bwPending_) {
    return finishBackwardStep(fused);
  }
  BAGUA_RETURN_IF_ERROR(checkStateMasks());
  if (reducerLayoutStale()) {
    BAGUA_LOG_INFO(kLogOptim, "%s: the reducer's buckets changed; laying parameters out again",
                   ruleName());
    BAGUA_RETURN_IF_ERROR(refreshReducerLayout());
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

// ---- Stepping inside the backward pass (core::BucketStepper) ----------------------------------

bool FusedOptimizer::beginBackwardStep(core::DistributedDataParallel& ddp, std::string* why) {
  bwActive_ = false;
  Result<bool> on = optimizerParams().stepInBackward.get();
  if (!on.isOk() || !*on) {
    *why = on.isOk() ? "BAGUA_OPTIM_STEP_IN_BACKWARD is off" : on.status().toString();
    return false;
  }
  if (scaler_ != nullptr && scaler_->enabled()) {
    *why = strPrintf("%s has a GradScaler: its inf/NaN check needs every gradient before any step",
                     ruleName());
    return false;
  }
  if (!checkStateMasks().isOk()) {
    *why = strPrintf("%s: a group needs state it did not allocate (step() reports it)", ruleName());
    return false;
  }
  if (reducerLayoutStale()) {
    *why = strPrintf("%s: the reducer's buckets changed; step() lays the parameters out again",
                     ruleName());
    return false;
  }
  Status s = ensurePlan(!fused_ || fuseOptions_.checkFlatten, &ddp);
  if (s.isOk()) {
    for (const auto& part : partitions_) {
      if (part->device.type != DeviceType::kCuda) {
        continue;
      }
      const auto dev = static_cast<size_t>(part->device.index);
      if (bwStreams_.size() <= dev) {
        bwStreams_.resize(dev + 1, nullptr);
      }
      if (bwStreams_[dev] == nullptr) {
        s = cudaCreateStream(part->device.index, &bwStreams_[dev]);
      }
      // After this optimizer's earlier work on the legacy default stream (its last step).
      if (s.isOk()) {
        s = cudaStreamAfter(part->device.index, bwStreams_[dev], nullptr);
      }
      if (!s.isOk()) {
        break;
      }
    }
  }
  if (!s.isOk()) {
    *why = s.toString();
    return false;
  }
  if (fused_ && fuseOptions_.checkFlatten && !warnedMoved_ && !plan_->intact) {
    BAGUA_LOG_WARN(kLogOptim,
                   "%s: tensors flattened by fuse() have moved; only the runs that are still "
                   "contiguous are fused",
                   ruleName());
    warnedMoved_ = true;
  }
  bwActive_ = true;
  bwPending_ = false;
  bwBuckets_ = 0;
  bwBucketDone_.assign(plan_->bucketRuns.size(), 0);
  bwGroupFused_.assign(groupParams_.size(), 0);
  lastSkipped_ = false;
  return true;
}

Status FusedOptimizer::stepBucket(core::DistributedDataParallel& ddp, int bucket) {
  if (!bwActive_) {
    return Status::ok();
  }
  if (bucket < 0 || static_cast<size_t>(bucket) >= plan_->bucketRuns.size()) {
    return BAGUA_ERROR(kInternal, "%s: stepBucket(%d): the plan has %zu buckets", ruleName(),
                       bucket, plan_->bucketRuns.size());
  }
  const auto b = static_cast<size_t>(bucket);
  if (bwBucketDone_[b] != 0) {
    return Status::ok();
  }
  const core::Device& dev = ddp.buckets()[b].device;
  if (dev.type == DeviceType::kCuda) {  // after the reduction, the gradients brought back
    BAGUA_RETURN_IF_ERROR(ddp.copyBucketOutOn(bucket, static_cast<CUstream_st*>(streamFor(dev))));
  }
  for (int r : plan_->bucketRuns[b]) {
    PlanRun& run = plan_->runs[static_cast<size_t>(r)];
    BAGUA_RETURN_IF_ERROR(stepRun(run, 1.0));
    bwGroupFused_[static_cast<size_t>(partitions_[run.partition]->group)] = 1;
  }
  for (int si : plan_->bucketSingles[b]) {
    BAGUA_RETURN_IF_ERROR(stepSlot(*slots_[si], 1.0));
  }
  bwBucketDone_[b] = 1;
  ++bwBuckets_;
  return Status::ok();
}

Status FusedOptimizer::endBackwardStep(core::DistributedDataParallel& ddp) {
  if (!bwActive_) {
    return Status::ok();
  }
  bwActive_ = false;
  bwPending_ = true;
  // The trainer's stream, and the legacy default stream that step() uses for the rest, after
  // the steps on this optimizer's streams.
  for (size_t dev = 0; dev < bwStreams_.size(); ++dev) {
    if (bwStreams_[dev] == nullptr) {
      continue;
    }
    BAGUA_RETURN_IF_ERROR(
        cudaStreamAfter(static_cast<int>(dev), ddp.options().cudaStream, bwStreams_[dev]));
    if (ddp.options().cudaStream != nullptr) {
      BAGUA_RETURN_IF_ERROR(cudaStreamAfter(static_cast<int>(dev), nullptr, bwStreams_[dev]));
    }
  }
  return Status::ok();
}

Status FusedOptimizer::finishBackwardStep(bool fused) {
  bwPending_ = false;
  Plan& plan = *plan_;
  // The parameters in no bucket, and any bucket the reducer did not hand over.
  auto runAll = [&](const std::vector<int>& runs, const std::vector<int>& singles) -> Status {
    for (int r : runs) {
      PlanRun& run = plan.runs[static_cast<size_t>(r)];
      BAGUA_RETURN_IF_ERROR(stepRun(run, 1.0));
      bwGroupFused_[static_cast<size_t>(partitions_[run.partition]->group)] = 1;
    }
    for (int si : singles) {
      BAGUA_RETURN_IF_ERROR(stepSlot(*slots_[si], 1.0));
    }
    return Status::ok();
  };
  BAGUA_RETURN_IF_ERROR(runAll(plan.restRuns, plan.restSingles));
  for (size_t b = 0; b < bwBucketDone_.size(); ++b) {
    if (bwBucketDone_[b] == 0) {
      BAGUA_RETURN_IF_ERROR(runAll(plan.bucketRuns[b], plan.bucketSingles[b]));
    }
  }
  lastFusedRuns_ = plan.runs.size();
  lastFusedTensors_ = plan.runSlots.size();
  if (fused) {
    for (uint8_t g : bwGroupFused_) {
      fusedCount_ += g;
    }
  }
  if (scaler_ != nullptr) {
    scaler_->update(false);  // a disabled scaler (an enabled one declines stepping in backward)
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
