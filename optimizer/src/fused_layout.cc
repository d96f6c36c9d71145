// FusedOptimizer's layout: fuse() lays each partition's parameters, gradients, master weights and
// states out in flat storage (in the reducer's bucket order when it owns the gradients), and the
// plan a step follows: the fused runs (tensors adjacent in every list, equal step counts), the
// per-tensor remainder and the AMP scan ranges, rebuilt only when a tensor moved (fused_parts.h).
#include <algorithm>
#include <cstdint>

#include "bagua/base/logging.h"
#include "bagua/core/ddp.h"
#include "bagua/optimizer/params.h"
#include "fused_parts.h"

namespace bagua::optim {

using core::DeviceType;

// ---- Flat storage -------------------------------------------------------------------------------

Status FusedOptimizer::fuse(const FuseOptions& options) {
  if (fused_) {
    return BAGUA_ERROR(kFailedPrecondition, "%s: the optimizer is already fused", ruleName());
  }
  fuseOptions_ = options;
  if (options.doFlatten) {
    const bool reducerOwnsGrads = ddp_ != nullptr && ddp_->options().gradientAsBucketView;
    BAGUA_RETURN_IF_ERROR(layOut(!reducerOwnsGrads));
  }
  fused_ = true;
  return Status::ok();
}

Status FusedOptimizer::attachReducer(core::DistributedDataParallel& ddp) {
  ddp_ = &ddp;
  if (fused_ && fuseOptions_.doFlatten) {
    return refreshReducerLayout();
  }
  return Status::ok();
}

Status FusedOptimizer::refreshReducerLayout() {
  ddpFlats_.clear();
  for (const core::Bucket& b : ddp_->buckets()) {
    ddpFlats_.push_back(b.flat);
  }
  return layOut(!ddp_->options().gradientAsBucketView);
}

std::vector<size_t> FusedOptimizer::layoutOrder() const {
  // Order: the reducer's bucket order when it owns the gradients (so parameter runs line up with
  // gradient runs), else registration order.
  std::vector<size_t> rank(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    rank[i] = i;
  }
  if (ddp_ != nullptr && ddp_->options().gradientAsBucketView) {
    size_t r = 0;
    std::vector<size_t> byBucket(params_.size(), SIZE_MAX);
    for (const core::Bucket& b : ddp_->buckets()) {
      for (int t : b.tensors) {
        const int pi = ddp_->tensors()[t].paramIndex;
        if (pi >= 0 && static_cast<size_t>(pi) < params_.size()) {
          byBucket[pi] = r++;
        }
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      rank[i] = byBucket[i] == SIZE_MAX ? r + i : byBucket[i];
    }
  }
  return rank;
}

Status FusedOptimizer::layOutPartition(Partition& part, const std::vector<size_t>& rank,
                                       bool moveGrads) {
  std::stable_sort(part.slots.begin(), part.slots.end(),
                   [&](int a, int b) { return rank[slots_[a]->param] < rank[slots_[b]->param]; });
  size_t total = 0;
  for (int si : part.slots) {
    total += slots_[si]->numel;
  }
  const size_t pes = core::dataTypeSize(part.dtype);
  const size_t ses = detail::stateElemSize(part.storage);
  const unsigned mask = stateMask(part.group);
  const bool master = detail::isHalfLike(part.storage) && options_.masterWeights;
  std::unique_ptr<Buffer> nparams, ngrads, nmaster, nstates[kMaxStates];
  BAGUA_ASSIGN_OR_RETURN(nparams, Buffer::make(part.device, total * pes));
  if (moveGrads) {
    BAGUA_ASSIGN_OR_RETURN(ngrads, Buffer::make(part.device, total * pes));
  }
  if (master) {
    BAGUA_ASSIGN_OR_RETURN(nmaster, Buffer::make(part.device, total * 4));
  }
  for (int k = 0; k < numStates(); ++k) {
    if ((mask >> k) & 1u) {
      BAGUA_ASSIGN_OR_RETURN(nstates[k], Buffer::make(part.device, total * ses));
    }
  }
  if (moveGrads) {
    for (int si : part.slots) {
      const core::Parameter& p = params_[slots_[si]->param];
      if (p.grad != nullptr && !p.setGrad && p.numel > 0) {
        BAGUA_LOG_WARN(kLogOptim,
                       "%s: parameter '%s' has no setGrad; its gradient moves only in the "
                       "parameter list (trainers must read gradients through it)",
                       ruleName(), p.name.c_str());
        break;
      }
    }
  }
  size_t off = 0;
  for (int si : part.slots) {
    Slot& s = *slots_[si];
    core::Parameter& p = params_[s.param];
    uint8_t* pdst = static_cast<uint8_t*>(nparams->ptr) + off * pes;
    BAGUA_RETURN_IF_ERROR(detail::copyOn(part.device, pdst, p.data, s.numel * pes));
    if (moveGrads) {
      uint8_t* gdst = static_cast<uint8_t*>(ngrads->ptr) + off * pes;
      if (p.grad != nullptr) {
        BAGUA_RETURN_IF_ERROR(detail::copyOn(part.device, gdst, p.grad, s.numel * pes));
      }
    }
    if (master) {
      float* mdst = static_cast<float*>(nmaster->ptr) + off;
      BAGUA_RETURN_IF_ERROR(detail::copyOn(part.device, mdst, s.master, s.numel * 4));
    }
    for (int k = 0; k < numStates(); ++k) {
      if (nstates[k]) {
        uint8_t* sdst = static_cast<uint8_t*>(nstates[k]->ptr) + off * ses;
        BAGUA_RETURN_IF_ERROR(detail::copyOn(part.device, sdst, s.state[k], s.numel * ses));
      }
    }
    off += s.numel;
  }
  // All copies done: re-point everything at the new storage, then free the old.
  off = 0;
  for (int si : part.slots) {
    Slot& s = *slots_[si];
    core::Parameter& p = params_[s.param];
    p.data = static_cast<uint8_t*>(nparams->ptr) + off * pes;
    if (moveGrads) {
      void* g = static_cast<uint8_t*>(ngrads->ptr) + off * pes;
      p.grad = g;
      if (p.setGrad) {
        p.setGrad(g);
      }
    }
    if (master) {
      s.master = static_cast<float*>(nmaster->ptr) + off;
      s.ownMaster.reset();
    }
    for (int k = 0; k < numStates(); ++k) {
      if (nstates[k]) {
        s.state[k] = static_cast<uint8_t*>(nstates[k]->ptr) + off * ses;
        s.own[k].reset();
      }
    }
    off += s.numel;
  }
  part.params = std::move(nparams);
  if (moveGrads) {
    part.grads = std::move(ngrads);
  }
  if (master) {
    part.master = std::move(nmaster);
  }
  for (int k = 0; k < kMaxStates; ++k) {
    if (nstates[k]) {
      part.states[k] = std::move(nstates[k]);
    }
  }
  part.flattened = true;
  part.gradsFlattened = moveGrads;
  BAGUA_LOG_DEBUG(kLogOptim, "%s: flattened group %d %s on %s: %zu tensors, %zu elements%s",
                  ruleName(), part.group, core::dataTypeName(part.dtype),
                  detail::deviceString(part.device).c_str(), part.slots.size(), total,
                  moveGrads ? "" : " (gradients stay in the reducer's buckets)");
  return Status::ok();
}

Status FusedOptimizer::layOut(bool moveGrads) {
  dropPlan();
  const std::vector<size_t> rank = layoutOrder();
  for (auto& partPtr : partitions_) {
    BAGUA_RETURN_IF_ERROR(layOutPartition(*partPtr, rank, moveGrads));
  }
  warnedMoved_ = false;
  return Status::ok();
}

bool FusedOptimizer::flattenIntact() const {
  for (const auto& partPtr : partitions_) {
    const Partition& part = *partPtr;
    if (!part.flattened) {
      continue;
    }
    const size_t pes = core::dataTypeSize(part.dtype);
    size_t off = 0;
    for (int si : part.slots) {
      const Slot& s = *slots_[si];
      const core::Parameter& p = params_[s.param];
      if (p.data != static_cast<uint8_t*>(part.params->ptr) + off * pes) {
        return false;
      }
      if (part.gradsFlattened && p.grad != static_cast<uint8_t*>(part.grads->ptr) + off * pes) {
        return false;
      }
      off += s.numel;
    }
  }
  return true;
}

// ---- The plan -----------------------------------------------------------------------------------

int64_t FusedOptimizer::effectiveStep(const Slot& s) const {
  if (s.run >= 0 && plan_ && plan_->valid) {
    return s.step + plan_->runs[s.run].pending;
  }
  return s.step;
}

void FusedOptimizer::dropPlan() {
  if (!plan_) {
    return;
  }
  for (PlanRun& r : plan_->runs) {
    for (size_t i = r.slotBegin; i < r.slotBegin + r.slotCount; ++i) {
      Slot& s = *slots_[plan_->runSlots[i]];
      s.step += r.pending;
      s.run = -1;
    }
    r.pending = 0;
  }
  plan_->valid = false;
}

bool FusedOptimizer::planCurrent(bool full) {
  if (!plan_ || !plan_->valid || plan_->numParams != params_.size()) {
    return false;
  }
  for (size_t g = 0; g < groupParams_.size(); ++g) {
    if (stateMask(static_cast<int>(g)) != plan_->masks[g]) {
      return false;
    }
  }
  // The only per-tensor work of a planned step: branch-free, so it streams through the list.
  bool same = true;
  const size_t n = plan_->watch.size();
  if (full || n <= kWatchWindow) {
    for (const Plan::Watch& w : plan_->watch) {
      const core::Parameter& p = params_[w.param];
      same &= (p.data == w.data) & (p.grad == w.grad);
    }
    return same;
  }
  size_t c = plan_->cursor;
  for (size_t k = 0; k < kWatchWindow; ++k) {
    const Plan::Watch& w = plan_->watch[c];
    const core::Parameter& p = params_[w.param];
    same &= (p.data == w.data) & (p.grad == w.grad);
    c = c + 1 == n ? 0 : c + 1;
  }
  plan_->cursor = c;
  return same;
}

Status FusedOptimizer::ensurePlan(bool full, const core::DistributedDataParallel* split) {
  // A plan cut at buckets serves an after-backward step too; one for stepping inside backward
  // must be cut at the current buckets.
  if (planCurrent(full) &&
      (split == nullptr ||
       (plan_->bucketsOf == split && plan_->bucketsGeneration == split->layoutGeneration()))) {
    return Status::ok();
  }
  dropPlan();
  buildPlan(split);
  return Status::ok();
}

std::vector<std::vector<int>> FusedOptimizer::mutualRuns(
    const std::vector<std::vector<Span>>& lists) {
  if (lists.empty()) {
    return {};
  }
  const size_t n = lists[0].size();
  for (const auto& l : lists) {
    if (l.size() != n) {
      return {};
    }
  }
  // Address order of the first list; a run continues while the next tensor follows the previous
  // one byte for byte in every list. (Bagua keeps only runs that are identical in every list, so
  // one tensor moved in one list loses the whole run; this keeps the parts that still line up.)
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) {
    order[i] = static_cast<int>(i);
  }
  const auto& first = lists[0];
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return first[a].address < first[b].address; });
  auto adjacent = [&](int a, int b) {
    for (const auto& l : lists) {
      if (l[a].address + l[a].bytes != l[b].address) {
        return false;
      }
    }
    return true;
  };
  std::vector<std::vector<int>> runs;
  std::vector<int> cur;
  for (int i : order) {
    if (!cur.empty() && adjacent(cur.back(), i)) {
      cur.push_back(i);
      continue;
    }
    if (cur.size() >= 2) {
      runs.push_back(cur);
    }
    cur.assign(1, i);
  }
  if (cur.size() >= 2) {
    runs.push_back(std::move(cur));
  }
  return runs;
}

std::vector<std::vector<int>> FusedOptimizer::runsOf(const Partition& part,
                                                     const std::vector<int>& slotBucket) const {
  // Candidates: slots with a gradient and at least one element.
  std::vector<int> cand;
  for (int si : part.slots) {
    const Slot& s = *slots_[si];
    if (s.numel > 0 && params_[s.param].grad != nullptr) {
      cand.push_back(si);
    }
  }
  const unsigned mask = stateMask(part.group);
  const size_t pes = core::dataTypeSize(part.dtype);
  const size_t ses = detail::stateElemSize(part.storage);
  std::vector<std::vector<Span>> lists(2);
  const bool master = cand.empty() ? false : slots_[cand[0]]->master != nullptr;
  if (master) {
    lists.emplace_back();
  }
  for (int k = 0; k < numStates(); ++k) {
    if ((mask >> k) & 1u) {
      lists.emplace_back();
    }
  }
  for (int si : cand) {
    const Slot& s = *slots_[si];
    const core::Parameter& p = params_[s.param];
    size_t li = 0;
    lists[li++].push_back({reinterpret_cast<uintptr_t>(p.data), s.numel * pes});
    lists[li++].push_back({reinterpret_cast<uintptr_t>(p.grad), s.numel * pes});
    if (master) {
      lists[li++].push_back({reinterpret_cast<uintptr_t>(s.master), s.numel * 4});
    }
    for (int k = 0; k < numStates(); ++k) {
      if ((mask >> k) & 1u) {
        lists[li++].push_back({reinterpret_cast<uintptr_t>(s.state[k]), s.numel * ses});
      }
    }
  }
  // Split where step counts differ (Bagua skips fusing tensors whose scalar states differ), and
  // where a run would cross from one reducer bucket into another (stepping inside backward).
  auto bucketOf = [&](int si) { return slotBucket.empty() ? -1 : slotBucket[si]; };
  std::vector<std::vector<int>> out;
  for (const auto& r : mutualRuns(lists)) {
    std::vector<int> cur;
    for (int i : r) {
      const int si = cand[i];
      if (!cur.empty() &&
          (slots_[cur.back()]->step != slots_[si]->step || bucketOf(cur.back()) != bucketOf(si))) {
        if (cur.size() >= 2) {
          out.push_back(cur);
        }
        cur.clear();
      }
      cur.push_back(si);
    }
    if (cur.size() >= 2) {
      out.push_back(std::move(cur));
    }
  }
  return out;
}

void FusedOptimizer::buildPlan(const core::DistributedDataParallel* split) {
  if (!plan_) {
    plan_ = std::make_unique<Plan>();
  }
  Plan& plan = *plan_;
  plan = Plan();
  plan.numParams = params_.size();
  // Per slot, the bucket of `split` that holds its parameter.
  std::vector<int> slotBucket;
  if (split != nullptr) {
    slotBucket.assign(slots_.size(), -1);
    const auto& buckets = split->buckets();
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (int t : buckets[b].tensors) {
        const int pi = split->tensors()[static_cast<size_t>(t)].paramIndex;
        if (pi >= 0 && static_cast<size_t>(pi) < slotOfParam_.size() && slotOfParam_[pi] >= 0) {
          slotBucket[static_cast<size_t>(slotOfParam_[pi])] = static_cast<int>(b);
        }
      }
    }
    plan.bucketsOf = split;
    plan.bucketsGeneration = split->layoutGeneration();
    plan.bucketRuns.assign(buckets.size(), {});
    plan.bucketSingles.assign(buckets.size(), {});
  }
  for (size_t g = 0; g < groupParams_.size(); ++g) {
    plan.masks.push_back(stateMask(static_cast<int>(g)));
  }
  // Parameters appended to the trainer's list after creation are not managed (and not watched).
  for (size_t pi = 0; pi < std::min(params_.size(), slotOfParam_.size()); ++pi) {
    if (slotOfParam_[pi] >= 0) {
      plan.watch.push_back({pi, params_[pi].data, params_[pi].grad});
    }
  }
  std::vector<uint8_t> inRun(slots_.size(), 0);
  std::vector<uint8_t> groupFused(groupParams_.size(), 0);
  for (size_t pi = 0; pi < partitions_.size(); ++pi) {
    for (auto& run : runsOf(*partitions_[pi], slotBucket)) {
      PlanRun r;
      r.partition = static_cast<int>(pi);
      r.first = run.front();
      r.segBegin = plan.segments.size();
      r.slotBegin = plan.runSlots.size();
      for (int si : run) {
        slots_[si]->run = static_cast<int>(plan.runs.size());
        plan.segments.push_back(slots_[si]->numel);
        plan.runSlots.push_back(si);
        r.numel += slots_[si]->numel;
        inRun[si] = 1;
      }
      r.segCount = run.size();
      r.slotCount = run.size();
      plan.runs.push_back(r);
      groupFused[partitions_[pi]->group] = 1;
    }
  }
  for (size_t si = 0; si < slots_.size(); ++si) {
    if (inRun[si] == 0 && params_[slots_[si]->param].grad != nullptr) {
      plan.singles.push_back(static_cast<int>(si));
    }
  }
  if (split != nullptr) {
    for (size_t r = 0; r < plan.runs.size(); ++r) {
      const int b = slotBucket[static_cast<size_t>(plan.runs[r].first)];
      (b >= 0 ? plan.bucketRuns[static_cast<size_t>(b)] : plan.restRuns)
          .push_back(static_cast<int>(r));
    }
    for (int si : plan.singles) {
      const int b = slotBucket[static_cast<size_t>(si)];
      (b >= 0 ? plan.bucketSingles[static_cast<size_t>(b)] : plan.restSingles).push_back(si);
    }
  }
  for (uint8_t g : groupFused) {
    plan.groupsFused += g;
  }
  plan.intact = flattenIntact();
  // Gradient ranges for the inf/NaN check, merged where byte-adjacent (flat storage scans as one).
  for (const auto& partPtr : partitions_) {
    const Partition& part = *partPtr;
    const size_t pes = core::dataTypeSize(part.dtype);
    std::vector<std::pair<uintptr_t, size_t>> ranges;
    for (int si : part.slots) {
      const Slot& s = *slots_[si];
      const void* g = params_[s.param].grad;
      if (g != nullptr && s.numel > 0) {
        ranges.emplace_back(reinterpret_cast<uintptr_t>(g), s.numel);
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 0; i < ranges.size();) {
      size_t j = i + 1;
      size_t n = ranges[i].second;
      while (j < ranges.size() && ranges[i].first + n * pes == ranges[j].first) {
        n += ranges[j].second;
        ++j;
      }
      Plan::Scan sc;
      sc.args.storage = part.storage;
      sc.args.grad = reinterpret_cast<const void*>(ranges[i].first);
      sc.args.numel = n;
      sc.device = part.device;
      plan.scans.push_back(sc);
      i = j;
    }
  }
  for (size_t i = 0; i < plan.scans.size(); ++i) {
    if (plan.scans[i].device.type == DeviceType::kCuda) {
      continue;
    }
    for (size_t b = 0; b < plan.scans[i].args.numel; b += chunkElements_) {
      plan.chunks.push_back({i, b, std::min(plan.scans[i].args.numel, b + chunkElements_)});
    }
  }
  plan.bad.assign(plan.chunks.size(), 0);
  plan.valid = true;
}

}  // namespace bagua::optim
