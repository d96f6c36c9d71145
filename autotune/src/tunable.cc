// The tunables: Tunable (an algorithm wrapper whose bucket layout the tuner can replace at a chosen
// iteration, and which records gradient-ready times) and TunableAllReduce (gradient all-reduce
// whose hierarchical mode is a knob). Contracts: bagua/autotune/autotuner.h.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "bagua/autotune/autotuner.h"
#include "bagua/autotune/params.h"
#include "bagua/base/logging.h"

namespace bagua::autotune {

using Clock = std::chrono::steady_clock;

class TunableImpl final : public core::AlgorithmImpl {
 public:
  TunableImpl(Tunable* owner, std::unique_ptr<core::AlgorithmImpl> inner)
      : owner_(owner), inner_(std::move(inner)) {}

  bool needReset(core::DistributedDataParallel& ddp) override {
    // Evaluate the inner algorithm's hook every time (it may keep count of steps).
    const bool inner = inner_->needReset(ddp);
    Tunable& o = *owner_;
    if (o.switchAt_ < 0 || ddp.trainStep() < o.switchAt_) {
      return inner;
    }
    if (ddp.trainStep() == o.switchAt_) {
      return true;
    }
    // The reducer's own one-time rebuild from the ready order (DDP's, in the prepareForward()
    // of the iteration after the first complete one) runs before this hook and replaces the
    // buckets; put the tuned layout back in the same prepareForward(). Every rank sees the same
    // layouts, so they all decide alike. Once the reducer cannot rebuild any more, stop looking.
    if (o.stable_ || !o.layoutValid_) {
      return inner;
    }
    const core::DdpOptions& opt = ddp.options();
    o.stable_ = ddp.bucketsRebuilt() || !opt.rebuildBuckets || opt.findUnusedParameters;
    return inner || ddp.bucketLayout() != o.layout_;
  }
  std::vector<core::TensorRef> initTensors(core::DistributedDataParallel& ddp) override {
    return inner_->initTensors(ddp);
  }
  std::vector<std::vector<int>> tensorsToBuckets(const std::vector<core::TensorRef>& tensors,
                                                 const core::BucketOptions& options) override {
    if (!owner_->layout_.empty()) {
      std::map<std::string, int> pos;
      for (size_t i = 0; i < tensors.size(); ++i) {
        pos[tensors[i].name] = static_cast<int>(i);
      }
      std::vector<std::vector<int>> out;
      size_t placed = 0;
      bool ok = true;
      for (const auto& b : owner_->layout_) {
        out.emplace_back();
        for (const std::string& n : b) {
          auto it = pos.find(n);
          if (it == pos.end()) {
            ok = false;
            break;
          }
          out.back().push_back(it->second);
          pos.erase(it);
          ++placed;
        }
      }
      if (ok && placed == tensors.size()) {
        owner_->layoutValid_ = true;
        return out;
      }
      owner_->layoutValid_ = false;
      BAGUA_LOG_WARN(kLogTune,
                     "autotune: the tuned layout does not match the algorithm's %zu tensors "
                     "any more; using the algorithm's own buckets",
                     tensors.size());
    }
    return inner_->tensorsToBuckets(tensors, options);
  }
  Status initOperations(core::Bucket& bucket) override { return inner_->initOperations(bucket); }
  Status runBucket(core::Bucket& bucket, core::ProcessGroup& group) override {
    return inner_->runBucket(bucket, group);
  }
  Result<core::WorkPtr> launchBucket(core::Bucket& bucket, core::ProcessGroup& group) override {
    return inner_->launchBucket(bucket, group);
  }
  bool reducedBucketIsFinal() const override { return inner_->reducedBucketIsFinal(); }
  Status onForwardPre(core::DistributedDataParallel& ddp) override {
    owner_->iterStart_ = Clock::now();
    owner_->readyCur_.assign(ddp.tensors().size(), -1);
    return inner_->onForwardPre(ddp);
  }
  Status onBackwardReady(core::DistributedDataParallel& ddp, int tensor) override {
    if (tensor >= 0 && static_cast<size_t>(tensor) < owner_->readyCur_.size()) {
      owner_->readyCur_[tensor] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - owner_->iterStart_)
              .count();
    }
    return inner_->onBackwardReady(ddp, tensor);
  }
  Status onPostBackward(core::DistributedDataParallel& ddp) override {
    owner_->readyNs_ = owner_->readyCur_;
    return inner_->onPostBackward(ddp);
  }
  Status onPostOptimizerStep(core::DistributedDataParallel& ddp) override {
    return inner_->onPostOptimizerStep(ddp);
  }

 private:
  Tunable* owner_;
  std::unique_ptr<core::AlgorithmImpl> inner_;
};

Result<std::unique_ptr<core::AlgorithmImpl>> Tunable::reify(core::ProcessGroup& group) {
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<core::AlgorithmImpl> inner, inner_->reify(group));
  return std::unique_ptr<core::AlgorithmImpl>(new TunableImpl(this, std::move(inner)));
}

Status Tunable::schedule(int64_t atStep, std::vector<std::vector<std::string>> layout) {
  if (layout.empty()) {
    return BAGUA_ERROR(kInvalidArgument, "autotune: an empty bucket layout");
  }
  for (const auto& b : layout) {
    if (b.empty()) {
      return BAGUA_ERROR(kInvalidArgument, "autotune: a layout with an empty bucket");
    }
  }
  switchAt_ = atStep;
  layout_ = std::move(layout);
  layoutValid_ = false;
  stable_ = false;
  return Status::ok();
}

// ---- TunableAllReduce -------------------------------------------------------------------------

namespace {

class TunableAllReduceImpl final : public core::AlgorithmImpl {
 public:
  TunableAllReduceImpl(TunableAllReduce* owner, bool average) : owner_(owner), average_(average) {}

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    // The mode is read once per bucket: a switch between iterations applies from the next one.
    return core::allReduceBucket(b, g, owner_->hierarchical(), average_);
  }
  bool reducedBucketIsFinal() const override { return true; }

 private:
  TunableAllReduce* owner_;
  bool average_;
};

}  // namespace

Result<std::unique_ptr<core::AlgorithmImpl>> TunableAllReduce::reify(core::ProcessGroup& group) {
  (void)group;
  return std::unique_ptr<core::AlgorithmImpl>(new TunableAllReduceImpl(this, average_));
}

Knob TunableAllReduce::knob() {
  Knob k;
  k.dimension = Dimension::boolean("hierarchical");
  k.initial = hierarchical() ? 1 : 0;
  k.apply = [this](int64_t v) {
    setHierarchical(v != 0);
    return Status::ok();
  };
  return k;
}

}  // namespace bagua::autotune
