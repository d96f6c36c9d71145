#include "bagua/core/ddp.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/bucket_assignment.h"
#include "bagua/core/params.h"
#include "device_stager.h"

namespace bagua::core {

namespace {

using Clock = std::chrono::steady_clock;

// Where tensor `k` of the bucket lives in its flat storage.
uint8_t* slotOf(const Bucket& b, size_t k) {
  return static_cast<uint8_t*>(b.flat) + b.offsets[k] * dataTypeSize(b.dtype);
}

// The start of the bucket's tensors' gradient homes when they lie back to back in the bucket's
// order (Parameter::gradHome), else null. Device buckets also need a 16-byte aligned start: the
// collectives and the compression kernels take their vector paths only from aligned storage.
void* homeOf(const Bucket& b, const std::vector<TensorRef>& tensors,
             const std::vector<Parameter>& params) {
  const size_t elem = dataTypeSize(b.dtype);
  const auto* base = static_cast<uint8_t*>(params[tensors[b.tensors[0]].paramIndex].gradHome);
  if (base == nullptr ||
      (b.device.type != DeviceType::kCpu && reinterpret_cast<uintptr_t>(base) % 16 != 0)) {
    return nullptr;
  }
  for (size_t k = 0; k < b.tensors.size(); ++k) {
    if (params[tensors[b.tensors[k]].paramIndex].gradHome != base + b.offsets[k] * elem) {
      return nullptr;
    }
  }
  return const_cast<uint8_t*>(base);
}

Status homeWithBucketViews(const std::string& param) {
  return BAGUA_ERROR(kInvalidArgument,
                     "DistributedDataParallel: '%s' has a gradient home, and "
                     "gradient_as_bucket_view moves gradients into the reducer's buckets: use one "
                     "or the other",
                     param.c_str());
}

}  // namespace

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
  BucketOptions bo;
  bo.firstBucketBytes = options_.firstBucketBytes;
  bo.bucketCapBytes = static_cast<size_t>(options_.bucketCapMb * 1024.0 * 1024.0);
  auto assignment = impl_->tensorsToBuckets(tensors_, bo);
  BAGUA_RETURN_IF_ERROR(buildBuckets(assignment));
  readyOrder_.clear();
  recordOrder_ = true;
  return Status::ok();
}

Status DistributedDataParallel::buildBuckets(const std::vector<std::vector<int>>& assignment) {
  tensorOfParam_.assign(params_.size(), -1);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const int p = tensors_[t].paramIndex;
    if (p < 0 || p >= static_cast<int>(params_.size())) {
      return BAGUA_ERROR(kInternal, "tensor %s refers to parameter %d", tensors_[t].name.c_str(),
                         p);
    }
    tensorOfParam_[p] = static_cast<int>(t);
  }
  std::vector<Bucket> buckets;
  bucketOfTensor_.assign(tensors_.size(), -1);
  slotOfTensor_.assign(tensors_.size(), -1);
  for (size_t bi = 0; bi < assignment.size(); ++bi) {
    Bucket b;
    b.index = static_cast<int>(bi);
    b.tensors = assignment[bi];
    if (b.tensors.empty()) {
      return BAGUA_ERROR(kInternal, "bucket %zu is empty", bi);
    }
    b.dtype = tensors_[b.tensors[0]].dtype;
    b.device = tensors_[b.tensors[0]].device;
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      const int t = b.tensors[k];
      if (t < 0 || t >= static_cast<int>(tensors_.size()) || bucketOfTensor_[t] != -1) {
        return BAGUA_ERROR(kInternal, "bucket %zu: tensor %d missing or in two buckets", bi, t);
      }
      const TensorRef& tr = tensors_[t];
      if (tr.dtype != b.dtype || !(tr.device == b.device)) {
        return BAGUA_ERROR(kInvalidArgument,
                           "bucket %zu mixes %s (%s) with %s: a bucket holds one dtype and device",
                           bi, tr.name.c_str(), dataTypeName(tr.dtype), dataTypeName(b.dtype));
      }
      if (tr.device.type != DeviceType::kCpu) {
        BAGUA_RETURN_IF_ERROR(
            stager_->checkDevice(tr.name, tr.device, group_.global().backendName()));
      }
      b.offsets.push_back(b.numel);
      b.numel += tr.numel;
      bucketOfTensor_[t] = static_cast<int>(bi);
      slotOfTensor_[t] = static_cast<int>(k);
    }
    if (void* home = homeOf(b, tensors_, params_)) {
      b.flat = home;
      b.inPlace = true;
    }
    buckets.push_back(std::move(b));
  }
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (bucketOfTensor_[t] < 0) {
      return BAGUA_ERROR(kInternal, "tensor %s is in no bucket", tensors_[t].name.c_str());
    }
  }
  // The old storage stays until commit(): gradients that are views into the old buckets are
  // copied out of them below (no bucket is in flight between iterations).
  BAGUA_RETURN_IF_ERROR(stager_->allocate(buckets));
  for (Bucket& b : buckets) {
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      Parameter& p = params_[tensors_[b.tensors[k]].paramIndex];
      uint8_t* slot = slotOf(b, k);
      if (p.grad != nullptr && p.grad != slot) {
        BAGUA_RETURN_IF_ERROR(stager_->copyIn(b, slot, p.grad, p.bytes()));
      }
      if (options_.gradientAsBucketView) {
        if (!p.setGrad) {
          return BAGUA_ERROR(kInvalidArgument,
                             "gradient_as_bucket_view needs Parameter::setGrad for '%s'",
                             p.name.c_str());
        }
        p.setGrad(slot);
        p.grad = slot;
      }
    }
    BAGUA_RETURN_IF_ERROR(impl_->initOperations(b));
  }
  // A parameter whose gradient is a view into an old bucket but that is in no new bucket would
  // be left pointing at freed memory: give it its own memory holding the current gradient.
  if (options_.gradientAsBucketView) {
    for (size_t pi = 0; pi < params_.size(); ++pi) {
      Parameter& p = params_[pi];
      if (tensorOfParam_[pi] >= 0 || p.grad == nullptr) {
        continue;
      }
      const auto* g = static_cast<const uint8_t*>(p.grad);
      const Bucket* old = nullptr;
      for (const Bucket& ob : buckets_) {
        const auto* base = static_cast<const uint8_t*>(ob.flat);
        if (base != nullptr && g >= base && g < base + ob.bytes()) {
          old = &ob;
        }
      }
      if (old == nullptr) {
        continue;
      }
      if (old->device.type != DeviceType::kCpu) {
        return BAGUA_ERROR(kFailedPrecondition,
                           "'%s' leaves the buckets while its gradient is a bucket view on a "
                           "device; set gradient_as_bucket_view=false for this algorithm",
                           p.name.c_str());
      }
      ownGrads_.resize(params_.size());
      std::vector<uint8_t>& own = ownGrads_[pi];
      own.assign(g, g + p.bytes());
      p.setGrad(own.data());
      p.grad = own.data();
    }
  }
  buckets_ = std::move(buckets);
  stager_->commit();
  ++layoutGeneration_;
  marked_.assign(tensors_.size(), false);
  stepped_.assign(buckets_.size(), false);
  copiedOut_.assign(buckets_.size(), false);
  {
    std::lock_guard<std::mutex> lock(mu_);  // the bucket thread is idle between iterations
    reduced_.assign(buckets_.size(), 0);
  }
  pendingInBucket_.resize(buckets_.size());
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    pendingInBucket_[bi] = static_cast<int>(buckets_[bi].tensors.size());
  }
  nextBucket_ = 0;
  if (logEnabled(LogLevel::kInfo, kLogBucket)) {
    for (const Bucket& b : buckets_) {
      BAGUA_LOG_INFO(kLogBucket, "bucket %d: %zu tensors, %zu x %s (%zu bytes)%s", b.index,
                     b.tensors.size(), b.numel, dataTypeName(b.dtype), b.bytes(),
                     b.inPlace ? ", in place (the gradients' homes)" : "");
    }
  }
  return Status::ok();
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucketLayout() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (int t : b.tensors) {
      out.back().push_back(tensors_[t].name);
    }
  }
  return out;
}

Status DistributedDataParallel::rebuildFromReadyOrder() {
  // Every rank adopts rank 0's observed order so the buckets match everywhere.
  std::vector<int64_t> order(tensors_.size(), -1);
  for (size_t i = 0; i < readyOrder_.size() && i < order.size(); ++i) {
    order[i] = readyOrder_[i];
  }
  const int device =
      group_.options().cudaDevice >= 0 ? group_.options().cudaDevice : group_.localRank();
  BAGUA_RETURN_IF_ERROR(
      stager_->broadcastHostI64(group_.global(), device, order.data(), order.size(), timeout_));
  std::vector<int> positions;
  std::vector<bool> seen(tensors_.size(), false);
  for (int64_t t : order) {
    if (t < 0 || t >= static_cast<int64_t>(tensors_.size()) || seen[t]) {
      return BAGUA_ERROR(kInternal, "rank 0's gradient-ready order is not a permutation");
    }
    seen[t] = true;
    positions.push_back(static_cast<int>(t));
  }
  const size_t cap = static_cast<size_t>(options_.bucketCapMb * 1024.0 * 1024.0);
  auto assignment =
      computeBucketAssignmentInOrder(tensors_, positions, {options_.firstBucketBytes, cap});
  BAGUA_RETURN_IF_ERROR(buildBuckets(assignment));
  rebuilt_ = true;
  BAGUA_LOG_INFO(kLogBucket, "rebuilt %zu buckets from the gradient-ready order", buckets_.size());
  return Status::ok();
}

Status DistributedDataParallel::setGradHomes(const std::vector<void*>& homes) {
  if (homes.size() != params_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "setGradHomes: %zu homes for %zu parameters", homes.size(),
                       params_.size());
  }
  if (inBackward_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "setGradHomes() during a backward pass: call finishBackward() first");
  }
  for (size_t i = 0; i < homes.size(); ++i) {
    if (homes[i] != nullptr && options_.gradientAsBucketView) {
      return homeWithBucketViews(params_[i].name);
    }
  }
  BAGUA_RETURN_IF_ERROR(drainBuckets());  // the bucket thread may still hold the old buckets
  for (size_t i = 0; i < homes.size(); ++i) {
    params_[i].gradHome = homes[i];
  }
  std::vector<std::vector<int>> assignment;
  for (const Bucket& b : buckets_) {
    assignment.push_back(b.tensors);
  }
  return buildBuckets(assignment);
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

namespace {

int64_t nsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

}  // namespace

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

Status DistributedDataParallel::launchReadyBuckets() {
  // Device buckets: mark "all gradients copied" on the trainer's stream before handing them over.
  for (size_t bi = nextBucket_; bi < buckets_.size() && pendingInBucket_[bi] == 0; ++bi) {
    BAGUA_RETURN_IF_ERROR(stager_->markReady(buckets_[bi]));
  }
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    while (nextBucket_ < buckets_.size() && pendingInBucket_[nextBucket_] == 0) {
      queue_.emplace_back(static_cast<int>(nextBucket_), now);
      ++launched_;
      ++nextBucket_;
      any = true;
    }
  }
  if (any) {
    cv_.notify_all();  // after unlocking: the bucket thread takes the lock at once
  }
  return Status::ok();
}

void DistributedDataParallel::finishBucket(int bi, Status s, Clock::time_point queuedAt,
                                           Clock::time_point started, Clock::time_point ready,
                                           bool deviceOrdered) {
  if (!s.isOk()) {
    s.withContext(strPrintf("bucket %d (%zu x %s)", bi, buckets_[bi].numel,
                            dataTypeName(buckets_[bi].dtype)));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.isOk() && commError_.isOk()) {
      commError_ = s;
    }
    ++completed_;
    if (!deviceOrdered) {
      ++enqueued_;  // a device-ordered bucket counted when its collective was enqueued
      reduced_[bi] = 1;
    }
    ++stats_.buckets;
    stats_.bucketQueueNs +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(started - queuedAt).count();
    stats_.bucketWaitNs +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(ready - started).count();
    stats_.bucketRunNs += nsSince(ready);
  }
  doneCv_.notify_all();
}

void DistributedDataParallel::commLoop(std::stop_token stop) {
  setThreadName("bagua-bucket");
  // Buckets whose collective was started with launchBucket and has not finished, oldest first
  // (they finish in that order).
  struct InFlight {
    int bucket;
    WorkPtr work;
    Clock::time_point queuedAt, started, ready;
    bool deviceOrdered;
  };
  std::deque<InFlight> inflight;
  while (true) {
    int bi = -1;
    Clock::time_point queuedAt;
    const bool hostInFlight =
        !inflight.empty() && buckets_[inflight.front().bucket].device.type == DeviceType::kCpu;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Device collectives in flight: look at the oldest every 100 us unless a new bucket comes
      // first (new buckets start at once: their collectives queue on the stream behind it).
      // Host ones: no cv wait here, the thread blocks on the oldest below.
      if (!hostInFlight) {
        const auto poll =
            inflight.empty() ? std::chrono::microseconds(200000) : std::chrono::microseconds(100);
        cv_.wait_for(lock, stop, poll, [&] { return !queue_.empty(); });
      }
      if (!queue_.empty()) {
        std::tie(bi, queuedAt) = queue_.front();
        queue_.pop_front();
      } else if (inflight.empty() && stop.stop_requested()) {
        return;
      }
    }
    if (bi < 0 && hostInFlight) {
      // The host backend's worker runs one collective at a time, so a bucket queued meanwhile
      // would only start after the oldest anyway: sleep on the oldest (in slices, to see the
      // deadline and stop) instead of polling, which cost ~4-5 ms of CPU per step on 2 cores
      // (bench/ddp, ResNet at 10 Gbit/s). A slice that ends early is looked at below.
      (void)inflight.front().work->wait(std::chrono::milliseconds(20));
    }
    // Finished collectives, oldest first; one past its deadline fails the iteration (it keeps
    // running: the communicator's own timeout or abort ends it).
    while (!inflight.empty()) {
      InFlight& f = inflight.front();
      Status done;
      if (f.work->test()) {
        done = f.work->status();
      } else if (Clock::now() - f.started > timeout_) {
        done = BAGUA_ERROR(kDeadlineExceeded, "the collective did not finish within %lld ms",
                           static_cast<long long>(timeout_.count()));
      } else if (stop.stop_requested() && bi < 0) {
        // Shutting down with work in flight (an abandoned iteration): wait, bounded.
        done = f.work->wait(timeout_);
      } else {
        break;
      }
      finishBucket(f.bucket, done, f.queuedAt, f.started, f.ready, f.deviceOrdered);
      inflight.pop_front();
    }
    if (bi < 0) {
      continue;
    }
    Status s;
    const Clock::time_point started = Clock::now();
    Clock::time_point ready = started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = commError_;
    }
    // A device bucket that may be launched as one collective: its communicator's stream waits
    // for the copies (device order, no host wait); a host wait only if the algorithm then runs
    // it through runBucket after all (its device work is on another stream).
    Bucket& bucket = buckets_[bi];
    bool deviceOrdered = false;
    if (s.isOk() && options_.launchWithoutWaiting && bucket.device.type != DeviceType::kCpu) {
      s = stager_->orderCommAfterCopies(bucket, group_.global());
      deviceOrdered = s.isOk();
    }
    if (s.isOk() && !deviceOrdered) {
      s = stager_->waitReady(bucket, Clock::now() + timeout_);
      ready = Clock::now();
    }
    if (s.isOk()) {
      Result<WorkPtr> w = options_.launchWithoutWaiting ? impl_->launchBucket(bucket, group_)
                                                        : Result<WorkPtr>(WorkPtr());
      if (!w.isOk()) {
        s = w.status();
      } else if (*w) {
        inflight.push_back({bi, *w, queuedAt, started, ready, deviceOrdered});
        if (deviceOrdered) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++enqueued_;
            ++deviceOrderedThisIteration_;
            reduced_[bi] = 1;
          }
          doneCv_.notify_all();
        }
        continue;  // finished later, in order
      } else {
        if (deviceOrdered) {
          s = stager_->waitReady(bucket, Clock::now() + timeout_);
          ready = Clock::now();
        }
        if (s.isOk()) {
          s = impl_->runBucket(bucket, group_);
        }
      }
    }
    finishBucket(bi, s, queuedAt, started, ready, /*deviceOrdered=*/false);
  }
}

Status DistributedDataParallel::waitForBuckets() {
  bool deviceOrder = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    BAGUA_RETURN_IF_ERROR(waitUntilAll(lock, enqueued_));
    deviceOrder = !buckets_.empty() && deviceOrderedThisIteration_ == buckets_.size();
    deviceOrderedThisIteration_ = 0;
  }
  // Every bucket's collective is enqueued in device order: the trainer's stream waits for the
  // last one, nobody waits on the host. Otherwise wait here for all of them to finish.
  return deviceOrder ? stager_->orderTrainerAfter(group_.global()) : drainBuckets();
}

Status DistributedDataParallel::drainBuckets() {
  std::unique_lock<std::mutex> lock(mu_);
  return waitUntilAll(lock, completed_);
}

Status DistributedDataParallel::waitUntilAll(std::unique_lock<std::mutex>& lock,
                                             const size_t& counted) {
  const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
  if (!doneCv_.wait_until(lock, deadline, [&] { return counted == launched_; })) {
    return BAGUA_ERROR(kDeadlineExceeded,
                       "rank %d: bucket communication did not finish within %lld ms (%zu of %zu "
                       "buckets done)",
                       group_.rank(), static_cast<long long>(timeout_.count()), counted, launched_);
  }
  return commError_;
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
