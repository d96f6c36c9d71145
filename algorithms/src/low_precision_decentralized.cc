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
                           detail::makeWeightView(ddp, "low_precision_decentralized", true));
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
      BAGUA_ASSIGN_OR_RETURN(
          s.view, detail::makeWeightView(ddp, params, "low_precision_decentralized", true));
      const detail::Exec& x = s.view.exec;
      const size_t n = s.view.numel;
      s.numel = n;
      const size_t fb = n * sizeof(float);
      for (detail::Buffer* b : {&s.x, &s.w, &s.l, &s.r, &s.d}) {
        BAGUA_RETURN_IF_ERROR(b->ensure(x, fb));
      }
      BAGUA_RETURN_IF_ERROR(detail::gatherWeights(ddp.parameters(), s.view, s.x.f32()));
      BAGUA_RETURN_IF_ERROR(detail::copyBytes(x, s.w.f32(), s.x.f32(), fb));
      BAGUA_RETURN_IF_ERROR(detail::copyBytes(x, s.l.f32(), s.x.f32(), fb));
      BAGUA_RETURN_IF_ERROR(detail::copyBytes(x, s.r.f32(), s.x.f32(), fb));
      s.bytes = minMaxCompressedBytes(n, 1);
      for (detail::Buffer* b : {&s.send, &s.fromLeft, &s.fromRight}) {
        BAGUA_RETURN_IF_ERROR(b->ensure(x, s.bytes));
      }
      BAGUA_RETURN_IF_ERROR(detail::sync(x, ddp.group().options().collectiveTimeout));
      buckets_.push_back(std::move(s));
    }
    if (!restored_.empty()) {
      BAGUA_RETURN_IF_ERROR(applyRestored(ddp.group().options().collectiveTimeout));
    }
    built_ = true;
    return Status::ok();
  }

  // Exact resume: every bucket's replicas (mine, my left and right neighbours'), which the ring
  // keeps bitwise equal across ranks; fresh copies of the weights would break that invariant.
  // Layout: u64 bucket count, then per bucket u64 numel and the w, l, r floats. Before the
  // first forward: nothing, or the restored bytes not yet applied.
  Result<std::vector<uint8_t>> saveState(core::DistributedDataParallel& /*ddp*/) override {
    std::vector<uint8_t> out;
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (!built_) {
      return restored_;  // restored but not built yet (a reducer rebuilt before its forward)
    }
    auto put64 = [&out](uint64_t v) {
      const auto* p = reinterpret_cast<const uint8_t*>(&v);
      out.insert(out.end(), p, p + sizeof(v));
    };
    put64(buckets_.size());
    for (State& s : buckets_) {
      put64(s.numel);
      for (detail::Buffer* b : {&s.w, &s.l, &s.r}) {
        const size_t at = out.size();
        out.resize(at + s.numel * sizeof(float));
        BAGUA_RETURN_IF_ERROR(
            readBack(s.view.exec, reinterpret_cast<float*>(out.data() + at), b->f32(), s.numel));
      }
    }
    return out;
  }

  Status restoreState(core::DistributedDataParallel& /*ddp*/,
                      std::span<const uint8_t> state) override {
    if (built_) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "low_precision_decentralized: restore the replicas before the first "
                         "forward");
    }
    restored_.assign(state.begin(), state.end());  // checked against the buckets when built
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
      const detail::Exec& x = s.view.exec;
      BAGUA_RETURN_IF_ERROR(detail::gatherWeights(ddp.parameters(), s.view, s.x.f32()));
      BAGUA_RETURN_IF_ERROR(detail::sync(x, timeout));
      const size_t n = s.numel;
      if (!hierarchical_) {
        BAGUA_RETURN_IF_ERROR(update(s, g.global(), timeout));
      } else {
        core::Communicator* intra = g.intraNode();
        BAGUA_RETURN_IF_ERROR(
            intra->reduce(s.x.f32(), s.x.f32(), n, core::DataType::kF32, core::ReduceOp::kAvg, 0)
                ->wait(timeout));
        if (intra->rank() == 0) {
          BAGUA_RETURN_IF_ERROR(update(s, *g.interNode(), timeout));
        }
        BAGUA_RETURN_IF_ERROR(
            intra->broadcast(s.x.f32(), n, core::DataType::kF32, 0)->wait(timeout));
      }
      BAGUA_RETURN_IF_ERROR(detail::scatterWeights(ddp.parameters(), s.view, s.x.f32()));
      BAGUA_RETURN_IF_ERROR(detail::sync(x, timeout));
    }
    return Status::ok();
  }

  // Caller holds owner_->mu_.
  Result<LowPrecisionDecentralized::Replicas> replicas() {
    if (!built_) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "low_precision_decentralized: no replicas before the first forward");
    }
    LowPrecisionDecentralized::Replicas out;
    for (State& s : buckets_) {
      for (auto [buf, dst] :
           {std::pair{&s.w, &out.self}, std::pair{&s.l, &out.left}, std::pair{&s.r, &out.right}}) {
        const size_t at = dst->size();
        dst->resize(at + s.numel);
        BAGUA_RETURN_IF_ERROR(readBack(s.view.exec, dst->data() + at, buf->f32(), s.numel));
      }
    }
    return out;
  }

 private:
  // Buffers on the weights' side (host or device).
  struct State {
    detail::WeightView view;
    size_t numel = 0;
    size_t bytes = 0;  // of one compressed message
    detail::Buffer x;  // the weights after the local step, then the new weights
    detail::Buffer w;  // my replica as the neighbours hold it
    detail::Buffer l;  // my left neighbour's replica
    detail::Buffer r;  // my right neighbour's replica
    detail::Buffer d;
    detail::Buffer send;
    detail::Buffer fromLeft;
    detail::Buffer fromRight;
    detail::Buffer workspace;
  };

  // Device replicas to the host for replicas() (tests, debugging).
  static Status readBack(const detail::Exec& x, float* out, const float* src, size_t n);

  // Fills the replicas from restored_ (saveState's layout), refusing a layout that does not
  // match this model's buckets. Caller holds owner_->mu_.
  Status applyRestored(std::chrono::milliseconds timeout) {
    const uint8_t* p = restored_.data();
    size_t left = restored_.size();
    auto get64 = [&](uint64_t* v) {
      if (left < sizeof(*v)) {
        return false;
      }
      std::memcpy(v, p, sizeof(*v));
      p += sizeof(*v);
      left -= sizeof(*v);
      return true;
    };
    uint64_t count = 0;
    if (!get64(&count) || count != buckets_.size()) {
      return BAGUA_ERROR(kInvalidArgument,
                         "low_precision_decentralized: the checkpoint's replicas are for %llu "
                         "buckets, this model has %zu (another model or bucket size?)",
                         static_cast<unsigned long long>(count), buckets_.size());
    }
    for (State& s : buckets_) {
      uint64_t numel = 0;
      const size_t fb = s.numel * sizeof(float);
      if (!get64(&numel) || numel != s.numel || left < 3 * fb) {
        return BAGUA_ERROR(kInvalidArgument,
                           "low_precision_decentralized: the checkpoint's replicas do not match "
                           "this model's bucket of %zu elements (saved: %llu, or truncated)",
                           s.numel, static_cast<unsigned long long>(numel));
      }
      for (detail::Buffer* b : {&s.w, &s.l, &s.r}) {
        BAGUA_RETURN_IF_ERROR(detail::copyFromHost(s.view.exec, b->f32(), p, fb));
        p += fb;
        left -= fb;
      }
      BAGUA_RETURN_IF_ERROR(detail::sync(s.view.exec, timeout));
    }
    if (left != 0) {
      return BAGUA_ERROR(kInvalidArgument,
                         "low_precision_decentralized: %zu bytes after the checkpoint's replicas",
                         left);
    }
    restored_.clear();
    return Status::ok();
  }

  static Status update(State& s, core::Communicator& comm, std::chrono::milliseconds timeout) {
    const detail::Exec& x = s.view.exec;
    const size_t n = s.numel;
    const size_t bytes = s.bytes;
    // d = [(w + l + r) / 3 + (x - w)] - w: the ring average of the replicas, plus my local
    // update, minus my replica.
    BAGUA_RETURN_IF_ERROR(
        detail::lowPrecisionDiff(x, s.d.f32(), s.x.f32(), s.l.f32(), s.r.f32(), s.w.f32(), n));
    BAGUA_RETURN_IF_ERROR(detail::compress(x, s.d.f32(), n, 1, s.send.u8(), bytes, s.workspace));
    BAGUA_RETURN_IF_ERROR(detail::sync(x, timeout));
    const int size = comm.size();
    const uint8_t* fromLeft = s.send.u8();
    const uint8_t* fromRight = s.send.u8();
    if (size > 1) {
      const int left = (comm.rank() + size - 1) % size;
      const int right = (comm.rank() + 1) % size;
      // My left neighbour's message to its right is mine from the left, and vice versa.
      BAGUA_RETURN_IF_ERROR(comm.sendRecv(s.send.u8(), bytes, left, s.fromRight.u8(), bytes, right,
                                          core::DataType::kU8)
                                ->wait(timeout));
      BAGUA_RETURN_IF_ERROR(comm.sendRecv(s.send.u8(), bytes, right, s.fromLeft.u8(), bytes, left,
                                          core::DataType::kU8)
                                ->wait(timeout));
      fromLeft = s.fromLeft.u8();
      fromRight = s.fromRight.u8();
    }
    // l += D(c_left), r += D(c_right), x = w + D(c), w = x: my neighbours apply the same D(c)
    // to their copy of w, so the replicas stay bitwise equal.
    BAGUA_RETURN_IF_ERROR(detail::decompress(x, fromLeft, bytes, n, 1, s.d.f32()));
    BAGUA_RETURN_IF_ERROR(detail::addInPlace(x, s.l.f32(), s.d.f32(), n));
    BAGUA_RETURN_IF_ERROR(detail::decompress(x, fromRight, bytes, n, 1, s.d.f32()));
    BAGUA_RETURN_IF_ERROR(detail::addInPlace(x, s.r.f32(), s.d.f32(), n));
    BAGUA_RETURN_IF_ERROR(detail::decompress(x, s.send.u8(), bytes, n, 1, s.d.f32()));
    BAGUA_RETURN_IF_ERROR(detail::addAndCopy(x, s.w.f32(), s.d.f32(), s.x.f32(), n));
    return detail::sync(x, timeout);
  }

  LowPrecisionDecentralized* owner_;
  bool hierarchical_;
  int64_t interval_;
  bool built_ = false;
  std::vector<State> buckets_;     // guarded by owner_->mu_
  std::vector<uint8_t> restored_;  // restoreState()'s bytes until the build applies them
};

Status LowPrecisionDecentralizedImpl::readBack(const detail::Exec& x, float* out, const float* src,
                                               size_t n) {
  if (!x.device) {
    std::memcpy(out, src, n * sizeof(float));
    return Status::ok();
  }
  return detail::copyToHost(x, out, src, n * sizeof(float));
}

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
