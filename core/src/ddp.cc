#include "bagua/core/ddp.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/bucket_assignment.h"
#include "bagua/core/params.h"
#include "ddp_internal.h"
#include "device_stager.h"

namespace bagua::core {

using ddp_detail::Clock;
using ddp_detail::homeWithBucketViews;
using ddp_detail::nsSince;
using ddp_detail::slotOf;

Result<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::create(
    std::vector<Parameter>& params, std::vector<Parameter>& buffers,
    std::vector<Optimizer*> optimizers, std::shared_ptr<Algorithm> algorithm, ProcessGroup& group,
    const DdpOptions& options) {
  if (!algorithm) {
    return BAGUA_ERROR(kInvalidArgument, "DistributedDataParallel: no algorithm given");
  }
  if (options.bucketCapMb <= 0 || options.firstBucketBytes == 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "DistributedDataParallel: bucket_cap_mb (%g) and the first bucket size "
                       "(%zu) must be positive",
                       options.bucketCapMb, options.firstBucketBytes);
  }
  std::set<std::string> names;
  for (const auto* list : {&params, &buffers}) {
    for (const Parameter& p : *list) {
      if (!names.insert(p.name).second) {
        return BAGUA_ERROR(kInvalidArgument, "DistributedDataParallel: duplicate name '%s'",
                           p.name.c_str());
      }
      if (p.numel > 0 && p.data == nullptr) {
        return BAGUA_ERROR(kInvalidArgument, "DistributedDataParallel: '%s' has no data",
                           p.name.c_str());
      }
    }
  }
  if (options.gradientAsBucketView) {
    for (const Parameter& p : params) {
      if (p.gradHome != nullptr) {
        return homeWithBucketViews(p.name);
      }
    }
  }
  for (const std::string& n : options.paramsToIgnore) {
    if (names.count(n) == 0) {
      BAGUA_LOG_WARN(kLogBucket,
                     "paramsToIgnore names '%s', which is neither a parameter nor a buffer",
                     n.c_str());
    }
  }
  std::unique_ptr<DistributedDataParallel> ddp(new DistributedDataParallel(
      params, buffers, std::move(optimizers), std::move(algorithm), group, options));
  // Device tensors need the NCCL backend (and a build with it): say so before touching them.
  for (const auto* list : {&params, &buffers}) {
    for (const Parameter& p : *list) {
      if (p.device.type != DeviceType::kCpu && !ddp->isIgnored(p.name)) {
        BAGUA_RETURN_IF_ERROR(
            ddp->stager_->checkDevice(p.name, p.device, group.global().backendName()));
      }
    }
  }
  if (ddp->timeout_.count() <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, coreParams().collectiveTimeoutMs.get());
    ddp->timeout_ = std::chrono::milliseconds(t);
  }
  BAGUA_RETURN_IF_ERROR(ddp->broadcastState());
  BAGUA_RETURN_IF_ERROR(ddp->initAlgorithm());
  ddp->commThread_ = std::jthread([raw = ddp.get()](std::stop_token st) { raw->commLoop(st); });
  return ddp;
}

DistributedDataParallel::DistributedDataParallel(std::vector<Parameter>& params,
                                                 std::vector<Parameter>& buffers,
                                                 std::vector<Optimizer*> optimizers,
                                                 std::shared_ptr<Algorithm> algorithm,
                                                 ProcessGroup& group, const DdpOptions& options)
    : params_(params),
      buffers_(buffers),
      optimizers_(std::move(optimizers)),
      algorithm_(std::move(algorithm)),
      group_(group),
      options_(options),
      timeout_(options.timeout),
      stager_(std::make_unique<DeviceStager>(options.cudaStream)) {}

DistributedDataParallel::~DistributedDataParallel() {
  commThread_.request_stop();
  cv_.notify_all();
  if (commThread_.joinable()) {
    commThread_.join();
  }
  // The bucket storage goes before the algorithm, which may hold pointers into it.
  stager_.reset();
}

bool DistributedDataParallel::isIgnored(const std::string& name) const {
  return std::find(options_.paramsToIgnore.begin(), options_.paramsToIgnore.end(), name) !=
         options_.paramsToIgnore.end();
}

Status DistributedDataParallel::broadcastState() {
  Communicator& c = group_.global();
  std::vector<const Parameter*> todo;
  auto add = [&](const Parameter& p) {
    if (!isIgnored(p.name) && p.numel > 0) {
      todo.push_back(&p);
    }
  };
  for (const Parameter& p : params_) {
    add(p);
  }
  for (const Parameter& p : buffers_) {
    add(p);
  }
  std::vector<std::vector<Parameter>> states;
  for (Optimizer* o : optimizers_) {
    states.push_back(o->stateTensors());
  }
  for (const auto& st : states) {
    for (const Parameter& p : st) {
      add(p);
    }
  }
  BAGUA_RETURN_IF_ERROR(stager_->waitForTrainerStream(todo, timeout_));
  std::vector<WorkPtr> works;
  for (const Parameter* p : todo) {
    works.push_back(c.broadcast(p->data, p->numel, p->dtype, 0));
  }
  for (auto& w : works) {
    BAGUA_RETURN_IF_ERROR(w->wait(timeout_));
  }
  return Status::ok();
}

Status DistributedDataParallel::initAlgorithm() {
  BAGUA_ASSIGN_OR_RETURN(impl_, algorithm_->reify(group_));
  tensors_ = impl_->initTensors(*this);
  auto assignment = impl_->tensorsToBuckets(tensors_, bucketLimits());
  BAGUA_RETURN_IF_ERROR(buildBuckets(assignment));
  readyOrder_.clear();
  recordOrder_ = true;
  return Status::ok();
}

Status DistributedDataParallel::prepareForward() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!commError_.isOk()) {
      return commError_;
    }
  }
  if (inBackward_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "prepareForward() during a backward pass: call finishBackward() first");
  }
  ++trainStep_;
  if (rebuildPending_) {
    rebuildPending_ = false;
    BAGUA_RETURN_IF_ERROR(drainBuckets());  // the bucket thread still holds the old buckets
    BAGUA_RETURN_IF_ERROR(rebuildFromReadyOrder());
  }
  if (impl_->needReset(*this)) {
    BAGUA_RETURN_IF_ERROR(drainBuckets());
    BAGUA_RETURN_IF_ERROR(broadcastState());
    BAGUA_RETURN_IF_ERROR(initAlgorithm());
  }
  if (options_.broadcastBuffers && !buffers_.empty()) {
    std::vector<const Parameter*> todo;
    for (const Parameter& b : buffers_) {
      if (!isIgnored(b.name) && b.numel > 0) {
        todo.push_back(&b);
      }
    }
    BAGUA_RETURN_IF_ERROR(stager_->waitForTrainerStream(todo, timeout_));
    std::vector<WorkPtr> works;
    for (const Parameter* b : todo) {
      works.push_back(group_.global().broadcast(b->data, b->numel, b->dtype, 0));
    }
    for (auto& w : works) {
      BAGUA_RETURN_IF_ERROR(w->wait(timeout_));
    }
  }
  return impl_->onForwardPre(*this);
}

DdpStats DistributedDataParallel::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DistributedDataParallel::resetStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = DdpStats{};
}

Status DistributedDataParallel::markGradReady(int paramIndex) {
  const Clock::time_point t0 = Clock::now();
  Status s = markGradReadyImpl(paramIndex);
  stats_.markNs += nsSince(t0);  // trainer-only field: no lock
  return s;
}

Status DistributedDataParallel::markGradReadyImpl(int paramIndex) {
  if (paramIndex < 0 || paramIndex >= static_cast<int>(params_.size())) {
    return BAGUA_ERROR(kInvalidArgument, "markGradReady(%d): %zu parameters", paramIndex,
                       params_.size());
  }
  if (noSync_) {
    return Status::ok();
  }
  const int t = tensorOfParam_[paramIndex];
  if (t < 0) {
    return Status::ok();  // ignored or not communicated
  }
  if (marked_[t]) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "gradient of '%s' marked ready twice in one iteration (a parameter used "
                       "twice must be marked once, when its gradient is final)",
                       tensors_[t].name.c_str());
  }
  if (!inBackward_) {
    inBackward_ = true;
    beginBackward();
  }
  marked_[t] = true;
  if (recordOrder_) {
    readyOrder_.push_back(t);
  }
  const int bi = bucketOfTensor_[t];
  Bucket& b = buckets_[bi];
  const Parameter& p = params_[paramIndex];
  uint8_t* slot = slotOf(b, slotOfTensor_[t]);
  if (!options_.gradientAsBucketView && p.grad != slot) {
    BAGUA_RETURN_IF_ERROR(stager_->copyIn(b, slot, p.grad, p.bytes()));
  } else {
    BAGUA_RETURN_IF_ERROR(stager_->orderAfterTrainer(b));
  }
  BAGUA_RETURN_IF_ERROR(impl_->onBackwardReady(*this, t));
  --pendingInBucket_[bi];
  BAGUA_RETURN_IF_ERROR(launchReadyBuckets());
  return steppers_.empty() ? Status::ok() : stepEnqueuedDeviceBuckets();
}

void DistributedDataParallel::beginBackward() {
  std::fill(stepped_.begin(), stepped_.end(), false);
  std::fill(copiedOut_.begin(), copiedOut_.end(), false);
  steppedCount_ = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(reduced_.begin(), reduced_.end(), 0);
  }
  steppers_.clear();
  if (!options_.stepInBackward || !impl_->reducedBucketIsFinal()) {
    return;
  }
  for (Optimizer* o : optimizers_) {
    auto* s = dynamic_cast<BucketStepper*>(o);
    if (s == nullptr) {
      continue;
    }
    std::string why;
    if (s->beginBackwardStep(*this, &why)) {
      steppers_.push_back(s);
    } else if (declinedLogged_.insert(why).second) {
      BAGUA_LOG_INFO(kLogBucket, "an optimizer steps after the backward pass: %s", why.c_str());
    }
  }
}

int DistributedDataParallel::bucketsReduced() {
  if (!inBackward_ || noSync_) {
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  while (n < static_cast<int>(reduced_.size()) && reduced_[n] != 0) {
    ++n;
  }
  return n;
}

Status DistributedDataParallel::waitBucketReduced(int bucket) {
  if (!inBackward_ || noSync_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "waitBucketReduced(%d) outside a backward pass that communicates", bucket);
  }
  if (bucket < 0 || bucket >= static_cast<int>(buckets_.size())) {
    return BAGUA_ERROR(kInvalidArgument, "waitBucketReduced(%d): %zu buckets", bucket,
                       buckets_.size());
  }
  const Bucket& b = buckets_[bucket];
  if (static_cast<size_t>(bucket) >= nextBucket_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "waitBucketReduced(%d): the bucket is not launched yet (%d of its "
                       "gradients are not marked ready; markUnusedReady() launches buckets of "
                       "unused parameters)",
                       bucket, pendingInBucket_[bucket]);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
    if (!doneCv_.wait_until(lock, deadline,
                            [&] { return reduced_[bucket] != 0 || !commError_.isOk(); })) {
      return BAGUA_ERROR(kDeadlineExceeded, "rank %d: bucket %d was not reduced within %lld ms",
                         group_.rank(), bucket, static_cast<long long>(timeout_.count()));
    }
    if (!commError_.isOk()) {
      return commError_;
    }
  }
  if (b.device.type != DeviceType::kCpu || copiedOut_[bucket]) {
    return Status::ok();  // device buckets: copyBucketOutOn()
  }
  if (!options_.gradientAsBucketView) {
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      Parameter& p = params_[tensors_[b.tensors[k]].paramIndex];
      const uint8_t* slot = slotOf(b, k);
      if (p.grad != slot) {
        BAGUA_RETURN_IF_ERROR(stager_->copyOut(b, p.grad, slot, p.bytes()));
      }
    }
  }
  copiedOut_[bucket] = true;
  return Status::ok();
}

Status DistributedDataParallel::copyBucketOutOn(int bucket, CUstream_st* stream) {
  if (!inBackward_ || noSync_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "copyBucketOutOn(%d) outside a backward pass that communicates", bucket);
  }
  if (bucket < 0 || bucket >= static_cast<int>(buckets_.size())) {
    return BAGUA_ERROR(kInvalidArgument, "copyBucketOutOn(%d): %zu buckets", bucket,
                       buckets_.size());
  }
  const Bucket& b = buckets_[bucket];
  if (b.device.type == DeviceType::kCpu) {
    return BAGUA_ERROR(kInvalidArgument,
                       "copyBucketOutOn(%d): a host bucket (waitBucketReduced copies it back)",
                       bucket);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reduced_[bucket] == 0) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "copyBucketOutOn(%d): the bucket is not reduced yet (bucketsReduced(), "
                         "waitBucketReduced())",
                         bucket);
    }
  }
  BAGUA_RETURN_IF_ERROR(orderAfterReduction(stream));
  if (!copiedOut_[bucket] && !options_.gradientAsBucketView) {
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      Parameter& p = params_[tensors_[b.tensors[k]].paramIndex];
      const uint8_t* slot = slotOf(b, k);
      if (p.grad != slot) {
        BAGUA_RETURN_IF_ERROR(stager_->copyOutOn(b, p.grad, slot, p.bytes(), stream));
      }
    }
  }
  copiedOut_[bucket] = true;
  return Status::ok();
}

Status DistributedDataParallel::orderAfterReduction(CUstream_st* stream) {
  return group_.global().orderStream(stream);
}

Status DistributedDataParallel::stepBucket(int b) {
  if (stepped_[b]) {
    return Status::ok();
  }
  const Clock::time_point t0 = Clock::now();
  for (BucketStepper* s : steppers_) {
    Status st = s->stepBucket(*this, b);
    if (!st.isOk()) {
      return st.withContext(strPrintf("stepping bucket %d inside the backward pass", b));
    }
  }
  stepped_[b] = true;
  ++steppedCount_;
  stats_.stepNs += nsSince(t0);  // trainer-only fields: no lock
  ++stats_.bucketsStepped;
  return Status::ok();
}

Status DistributedDataParallel::stepEnqueuedDeviceBuckets() {
  // Host buckets step in finishBackward, as each completes: stepping here would delay the rest of
  // the backward pass on the trainer's thread, and with it the launch of the later buckets.
  const int n = bucketsReduced();
  for (int b = 0; b < n; ++b) {
    if (!stepped_[b] && buckets_[b].device.type != DeviceType::kCpu) {
      BAGUA_RETURN_IF_ERROR(stepBucket(b));
    }
  }
  return Status::ok();
}

Status DistributedDataParallel::markUnusedReady() {
  if (noSync_) {
    return Status::ok();
  }
  if (!inBackward_) {  // nothing was marked (every parameter unused)
    inBackward_ = true;
    beginBackward();
  }
  // Parameters that got no gradient this iteration.
  std::vector<int> unused;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (!marked_[t]) {
      unused.push_back(static_cast<int>(t));
    }
  }
  if (!unused.empty()) {
    if (!options_.findUnusedParameters) {
      std::string names;
      for (size_t i = 0; i < unused.size() && i < 8; ++i) {
        names += (i ? ", " : "") + tensors_[unused[i]].name;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (commError_.isOk()) {
          commError_ = BAGUA_ERROR(
              kFailedPrecondition,
              "rank %d: %zu parameter(s) did not receive a gradient in this iteration (%s): "
              "set find_unused_parameters (DdpOptions::findUnusedParameters) or add them to "
              "paramsToIgnore",
              group_.rank(), unused.size(), names.c_str());
        }
      }
      group_.abort("a rank found unused parameters without find_unused_parameters");
      return commError_;
    }
    for (int t : unused) {
      const int bi = bucketOfTensor_[t];
      const Bucket& b = buckets_[bi];
      BAGUA_RETURN_IF_ERROR(stager_->zero(b, slotOf(b, slotOfTensor_[t]), tensors_[t].bytes()));
      marked_[t] = true;
      --pendingInBucket_[bi];
    }
    recordOrder_ = false;  // the order is incomplete; DDP does not rebuild in this mode either
    BAGUA_RETURN_IF_ERROR(launchReadyBuckets());
  }
  if (nextBucket_ != buckets_.size()) {
    return BAGUA_ERROR(kInternal, "finishBackward: only %zu of %zu buckets launched", nextBucket_,
                       buckets_.size());
  }
  return Status::ok();
}

Status DistributedDataParallel::finishBackward() {
  if (noSync_) {
    inBackward_ = false;
    return Status::ok();
  }
  BAGUA_RETURN_IF_ERROR(markUnusedReady());
  // Stepping inside the backward pass: the buckets not stepped yet, each as soon as it is
  // reduced (device: enqueued), while the later ones still communicate.
  for (size_t b = 0; b < buckets_.size() && !steppers_.empty(); ++b) {
    if (stepped_[b]) {
      continue;
    }
    BAGUA_RETURN_IF_ERROR(waitBucketReduced(static_cast<int>(b)));
    BAGUA_RETURN_IF_ERROR(stepBucket(static_cast<int>(b)));
  }
  const Clock::time_point t0 = Clock::now();
  Status s = waitForBuckets();
  if (!s.isOk()) {
    return s;
  }
  const Clock::time_point t1 = Clock::now();
  if (!options_.gradientAsBucketView) {
    for (const Bucket& b : buckets_) {
      if (copiedOut_[static_cast<size_t>(b.index)]) {
        continue;  // copied back already (waitBucketReduced, copyBucketOutOn)
      }
      for (size_t k = 0; k < b.tensors.size(); ++k) {
        Parameter& p = params_[tensors_[b.tensors[k]].paramIndex];
        const uint8_t* slot = slotOf(b, k);
        if (p.grad != slot) {  // a gradient written at its home is already there
          BAGUA_RETURN_IF_ERROR(stager_->copyOut(b, p.grad, slot, p.bytes()));
        }
      }
    }
  }
  BAGUA_RETURN_IF_ERROR(stager_->releaseToTrainer());
  for (BucketStepper* st : steppers_) {
    BAGUA_RETURN_IF_ERROR(st->endBackwardStep(*this));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.iterations;
    stats_.finishWaitNs += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    stats_.copyOutNs += nsSince(t1);
  }
  // Next iteration.
  std::fill(marked_.begin(), marked_.end(), false);
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    pendingInBucket_[bi] = static_cast<int>(buckets_[bi].tensors.size());
  }
  nextBucket_ = 0;
  inBackward_ = false;
  if (recordOrder_) {
    recordOrder_ = false;
    rebuildPending_ = options_.rebuildBuckets && !options_.findUnusedParameters && !rebuilt_ &&
                      readyOrder_.size() == tensors_.size();
  }
  return impl_->onPostBackward(*this);
}

Status DistributedDataParallel::step() {
  for (Optimizer* o : optimizers_) {
    BAGUA_RETURN_IF_ERROR(o->step());
  }
  return impl_->onPostOptimizerStep(*this);
}

Result<std::unique_ptr<DistributedDataParallel>> withBagua(std::vector<Parameter>& params,
                                                           std::vector<Parameter>& buffers,
                                                           std::vector<Optimizer*> optimizers,
                                                           std::shared_ptr<Algorithm> algorithm,
                                                           ProcessGroup& group,
                                                           const DdpOptions& options) {
  return DistributedDataParallel::create(params, buffers, std::move(optimizers),
                                         std::move(algorithm), group, options);
}

}  // namespace bagua::core
