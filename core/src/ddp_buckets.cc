// The reducer's tensors and buckets: the layout from an assignment, the buckets' storage with the
// gradients moved in (or left in place at their homes), the rebuild from the gradient-ready order
// and from new gradient homes. Trainer's thread, between iterations (the bucket thread is idle).
#include <algorithm>

#include "bagua/base/logging.h"
#include "bagua/core/ddp.h"
#include "bagua/core/params.h"
#include "ddp_internal.h"
#include "device_stager.h"

namespace bagua::core {

using ddp_detail::homeWithBucketViews;
using ddp_detail::slotOf;

namespace {

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

}  // namespace

Status DistributedDataParallel::buildBuckets(const std::vector<std::vector<int>>& assignment) {
  BAGUA_ASSIGN_OR_RETURN(std::vector<Bucket> buckets, layOutBuckets(assignment));
  // The old storage stays until commit(): gradients that are views into the old buckets are
  // copied out of them below (no bucket is in flight between iterations).
  BAGUA_RETURN_IF_ERROR(stager_->allocate(buckets));
  BAGUA_RETURN_IF_ERROR(moveGradsInto(buckets));
  if (options_.gradientAsBucketView) {
    BAGUA_RETURN_IF_ERROR(keepGradsLeavingBuckets());
  }
  buckets_ = std::move(buckets);
  stager_->commit();
  resetBucketState();
  return Status::ok();
}

Result<std::vector<Bucket>> DistributedDataParallel::layOutBuckets(
    const std::vector<std::vector<int>>& assignment) {
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
  return buckets;
}

Status DistributedDataParallel::moveGradsInto(std::vector<Bucket>& buckets) {
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
  return Status::ok();
}

// A parameter whose gradient is a view into an old bucket (buckets_, not replaced yet) but that
// is in no new bucket would be left pointing at freed memory: give it its own memory holding the
// current gradient.
Status DistributedDataParallel::keepGradsLeavingBuckets() {
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
  return Status::ok();
}

void DistributedDataParallel::resetBucketState() {
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
  const BucketOptions limits = bucketLimits();
  auto assignment = computeBucketAssignmentInOrder(
      tensors_, positions, {limits.firstBucketBytes, limits.bucketCapBytes});
  BAGUA_RETURN_IF_ERROR(buildBuckets(assignment));
  rebuilt_ = true;
  BAGUA_LOG_INFO(kLogBucket, "rebuilt %zu buckets from the gradient-ready order", buckets_.size());
  return Status::ok();
}

BucketOptions DistributedDataParallel::bucketLimits() const {
  size_t total = 0;
  for (const TensorRef& t : tensors_) {
    total += t.bytes();
  }
  return limitsForModel(
      {options_.firstBucketBytes, static_cast<size_t>(options_.bucketCapMb * 1024.0 * 1024.0)},
      total);
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

}  // namespace bagua::core
