#include <cstring>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/compression.h"
#include "support.h"

namespace bagua::algo {

class LowPrecisionDecentralizedImpl final : public core::AlgorithmImpl {
 public:
  LowPrecisionDecentralizedImpl(LowPrecisionDecentralized* owner, bool hierarchical, int interval)
      : owner_(owner), hierarchical_(hierarchical), interval_(interval) {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    owner_->live_ = this;
  }
  ~LowPrecisionDecentralizedImpl() override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (owner_->live_ == this) {
      owner_->live_ = nullptr;
    }
  }

  std::vector<core::TensorRef> initTensors(core::DistributedDataParallel& /*ddp*/) override {
    return {};
  }
  Status runBucket(core::Bucket& /*bucket*/, core::ProcessGroup& /*group*/) override {
    return Status::ok();
  }

  // The replicas start as copies of the weights, equal everywhere after the reducer's
  // broadcast, before any local step.
  Status onForwardPre(core::DistributedDataParallel& ddp) override {
    if (built_) {
      return Status::ok();
    }
    BAGUA_ASSIGN_OR_RETURN(detail::WeightView all,
                           detail::makeWeightView(ddp, "low_precision_decentralized"));
    std::vector<core::TensorRef> refs;
    for (int p : all.params) {
      const core::Parameter& prm = ddp.parameters()[p];
      refs.push_back({prm.name, p, prm.numel, prm.dtype, prm.device});
    }
    core::BucketOptions bo;
    bo.firstBucketBytes = ddp.options().firstBucketBytes;
    bo.bucketCapBytes = static_cast<size_t>(ddp.options().bucketCapMb * 1024.0 * 1024.0);
    // The default partition (several buckets, each with its own state and min/max).
    std::vector<std::vector<int>> parts = core::AlgorithmImpl::tensorsToBuckets(refs, bo);
    std::lock_guard<std::mutex> lock(owner_->mu_);
    buckets_.clear();
    for (const auto& part : parts) {
      std::vector<int> params;
      for (int pos : part) {
        params.push_back(refs[pos].paramIndex);
      }
      State s;
      BAGUA_ASSIGN_OR_RETURN(s.view,
                             detail::makeWeightView(ddp, params, "low_precision_decentralized"));
      const size_t n = s.view.numel;
      s.x.assign(n, 0.0f);
      detail::gatherWeights(ddp.parameters(), s.view, s.x.data());
      s.w = s.x;
      s.l = s.x;
      s.r = s.x;
      s.d.assign(n, 0.0f);
      const size_t bytes = minMaxCompressedBytes(n, 1);
      s.send.assign(bytes, 0);
      s.fromLeft.assign(bytes, 0);
      s.fromRight.assign(bytes, 0);
      buckets_.push_back(std::move(s));
    }
    built_ = true;
    return Status::ok();
  }

  Status onPostOptimizerStep(core::DistributedDataParallel& ddp) override {
    if (!built_ || (ddp.trainStep() - 1) % interval_ != 0) {
      return Status::ok();
    }
    core::ProcessGroup& g = ddp.group();
    const auto timeout = g.options().collectiveTimeout;
    std::lock_guard<std::mutex> lock(owner_->mu_);
    for (State& s : buckets_) {
      detail::gatherWeights(ddp.parameters(), s.view, s.x.data());
      const size_t n = s.x.size();
      if (!hierarchical_) {
        BAGUA_RETURN_IF_ERROR(update(s, g.global(), timeout));
      } else {
        core::Communicator* intra = g.intraNode();
        BAGUA_RETURN_IF_ERROR(
            intra->reduce(s.x.data(), s.x.data(), n, core::DataType::kF32, core::ReduceOp::kAvg, 0)
                ->wait(timeout));
        if (intra->rank() == 0) {
          BAGUA_RETURN_IF_ERROR(update(s, *g.interNode(), timeout));
        }
        BAGUA_RETURN_IF_ERROR(
            intra->broadcast(s.x.data(), n, core::DataType::kF32, 0)->wait(timeout));
      }
      detail::scatterWeights(ddp.parameters(), s.view, s.x.data());
    }
    return Status::ok();
  }

  // Caller holds owner_->mu_.
  Result<LowPrecisionDecentralized::Replicas> replicas() const {
    if (!built_) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "low_precision_decentralized: no replicas before the first forward");
    }
    LowPrecisionDecentralized::Replicas out;
    for (const State& s : buckets_) {
      out.self.insert(out.self.end(), s.w.begin(), s.w.end());
      out.left.insert(out.left.end(), s.l.begin(), s.l.end());
      out.right.insert(out.right.end(), s.r.begin(), s.r.end());
    }
    return out;
  }

 private:
  struct State {
    detail::WeightView view;
    std::vector<float> x;  // the weights after the local step, then the new weights
    std::vector<float> w;  // my replica as the neighbours hold it
    std::vector<float> l;  // my left neighbour's replica
    std::vector<float> r;  // my right neighbour's replica
    std::vector<float> d;
    std::vector<uint8_t> send;
    std::vector<uint8_t> fromLeft;
    std::vector<uint8_t> fromRight;
  };

  static Status update(State& s, core::Communicator& comm, std::chrono::milliseconds timeout) {
    const size_t n = s.x.size();
    const float third = 1.0f / 3.0f;
    const float fiveThirds = 5.0f / 3.0f;
    // d = [(w + l + r) / 3 + (x - w)] - w: the ring average of the replicas, plus my local
    // update, minus my replica.
    for (size_t i = 0; i < n; ++i) {
      s.d[i] = s.x[i] + s.l[i] * third + s.r[i] * third - s.w[i] * fiveThirds;
    }
    BAGUA_RETURN_IF_ERROR(minMaxCompress(s.d.data(), n, 1, s.send.data(), s.send.size()));
    const int size = comm.size();
    const uint8_t* fromLeft = s.send.data();
    const uint8_t* fromRight = s.send.data();
    if (size > 1) {
      const int left = (comm.rank() + size - 1) % size;
      const int right = (comm.rank() + 1) % size;
      const size_t bytes = s.send.size();
      // My left neighbour's message to its right is mine from the left, and vice versa.
      BAGUA_RETURN_IF_ERROR(comm.sendRecv(s.send.data(), bytes, left, s.fromRight.data(), bytes,
                                          right, core::DataType::kU8)
                                ->wait(timeout));
      BAGUA_RETURN_IF_ERROR(comm.sendRecv(s.send.data(), bytes, right, s.fromLeft.data(), bytes,
                                          left, core::DataType::kU8)
                                ->wait(timeout));
      fromLeft = s.fromLeft.data();
      fromRight = s.fromRight.data();
    }
    const size_t bytes = s.send.size();
    // l += D(c_left), r += D(c_right), x = w + D(c), w = x: my neighbours apply the same D(c)
    // to their copy of w, so the replicas stay bitwise equal.
    BAGUA_RETURN_IF_ERROR(minMaxDecompress(fromLeft, bytes, n, 1, s.d.data()));
    for (size_t i = 0; i < n; ++i) {
      s.l[i] += s.d[i];
    }
    BAGUA_RETURN_IF_ERROR(minMaxDecompress(fromRight, bytes, n, 1, s.d.data()));
    for (size_t i = 0; i < n; ++i) {
      s.r[i] += s.d[i];
    }
    BAGUA_RETURN_IF_ERROR(minMaxDecompress(s.send.data(), bytes, n, 1, s.d.data()));
    for (size_t i = 0; i < n; ++i) {
      s.w[i] += s.d[i];
      s.x[i] = s.w[i];
    }
    return Status::ok();
  }

  LowPrecisionDecentralized* owner_;
  bool hierarchical_;
  int64_t interval_;
  bool built_ = false;
  std::vector<State> buckets_;  // guarded by owner_->mu_
};

Result<LowPrecisionDecentralized::Replicas> LowPrecisionDecentralized::replicas() {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_ == nullptr) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "low_precision_decentralized: not attached to a reducer");
  }
  return live_->replicas();
}

Result<std::unique_ptr<core::AlgorithmImpl>> LowPrecisionDecentralized::reify(
    core::ProcessGroup& group) {
  if (interval_ < 1) {
    return BAGUA_ERROR(kInvalidArgument,
                       "low_precision_decentralized: communication_interval=%d must be >= 1",
                       interval_);
  }
  if (hierarchical_ && (group.intraNode() == nullptr || group.interNode() == nullptr)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "low_precision_decentralized(hierarchical=true) needs a process group "
                       "created with hierarchical sub-groups, or pass hierarchical=false");
  }
  return std::unique_ptr<core::AlgorithmImpl>(
      new LowPrecisionDecentralizedImpl(this, hierarchical_, interval_));
}

}  // namespace bagua::algo
