#include <cstring>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "support.h"

namespace bagua::algo {

int Decentralized::shiftOnePeer(int rank, int n, int64_t step) {
  const int64_t half = n / 2;
  if (rank < half) {
    return static_cast<int>((step + rank) % ((n + 1) / 2) + half);
  }
  const int64_t m = (rank - half - step) % half;
  return static_cast<int>(m < 0 ? m + half : m);
}

namespace {

class DecentralizedImpl final : public core::AlgorithmImpl {
 public:
  // flat: exchange on the global communicator; else intra reduce, exchange among the node
  // leaders, intra broadcast. The worker thread exchanges on `group` (detail::threadGroup), not
  // on the training group, where the trainer's own collectives run meanwhile.
  DecentralizedImpl(bool flat, PeerSelection mode, int interval,
                    std::unique_ptr<core::ProcessGroup> group)
      : flat_(flat),
        mode_(mode),
        interval_(interval),
        group_(std::move(group)),
        worker_("bagua-decentral") {}

  ~DecentralizedImpl() override {
    if (launched_) {
      (void)worker_.wait(std::chrono::minutes(10));  // bounded by the collective timeout
    }
  }

  // The weights are exchanged by the hooks below; gradients are not communicated.
  std::vector<core::TensorRef> initTensors(core::DistributedDataParallel& /*ddp*/) override {
    return {};
  }

  Status runBucket(core::Bucket& /*bucket*/, core::ProcessGroup& /*group*/) override {
    return Status::ok();
  }

  Status onForwardPre(core::DistributedDataParallel& ddp) override {
    if (!built_) {
      BAGUA_ASSIGN_OR_RETURN(view_, detail::makeWeightView(ddp, "decentralized", true));
      BAGUA_RETURN_IF_ERROR(peer_.ensure(view_.exec, view_.numel * sizeof(float)));
      BAGUA_RETURN_IF_ERROR(recv_.ensure(view_.exec, view_.numel * sizeof(float)));
      timeout_ = ddp.group().options().collectiveTimeout;
      built_ = true;
    }
    if (launched_) {
      // A forward inside noSync() (the reducer skips post-backward there): the weights have not
      // been stepped since the exchange started, so it stays valid and is applied at the next
      // post-backward.
      return Status::ok();
    }
    if ((ddp.trainStep() - 1) % interval_ != 0) {
      return Status::ok();
    }
    // The weights as they are before forward, exchanged while forward and backward run.
    BAGUA_RETURN_IF_ERROR(detail::gatherWeights(ddp.parameters(), view_, peer_.f32()));
    BAGUA_RETURN_IF_ERROR(detail::sync(view_.exec, timeout_));
    core::ProcessGroup& g = *group_;
    const int64_t step = commStep_++;
    BAGUA_RETURN_IF_ERROR(worker_.start([this, &g, step] { return exchange(g, step); }));
    launched_ = true;
    return Status::ok();
  }

  // Exact resume: the exchange counter (shift_one's peer follows it). Saved between steps, when
  // no exchange is in flight.
  Result<std::vector<uint8_t>> saveState(core::DistributedDataParallel& /*ddp*/) override {
    std::vector<uint8_t> out(sizeof(commStep_));
    std::memcpy(out.data(), &commStep_, sizeof(commStep_));
    return out;
  }
  Status restoreState(core::DistributedDataParallel& /*ddp*/,
                      std::span<const uint8_t> state) override {
    if (state.size() != sizeof(commStep_)) {
      return BAGUA_ERROR(kInvalidArgument,
                         "decentralized: %zu bytes of algorithm state; expected %zu (was the "
                         "checkpoint saved with another algorithm?)",
                         state.size(), sizeof(commStep_));
    }
    std::memcpy(&commStep_, state.data(), sizeof(commStep_));
    return Status::ok();
  }

  Status onPostBackward(core::DistributedDataParallel& ddp) override {
    if (!launched_) {
      return Status::ok();
    }
    launched_ = false;
    const auto timeout = ddp.group().options().collectiveTimeout + std::chrono::seconds(5);
    BAGUA_RETURN_IF_ERROR(worker_.wait(timeout));
    BAGUA_RETURN_IF_ERROR(detail::scatterWeights(ddp.parameters(), view_, peer_.f32()));
    return detail::sync(view_.exec, timeout);
  }

 private:
  // Runs on the worker thread.
  Status exchange(core::ProcessGroup& g, int64_t step) {
    const auto timeout = g.options().collectiveTimeout;
    if (flat_) {
      return peerAverage(g.global(), step, timeout);
    }
    core::Communicator* intra = g.intraNode();
    const size_t n = view_.numel;
    BAGUA_RETURN_IF_ERROR(
        intra->reduce(peer_.f32(), peer_.f32(), n, core::DataType::kF32, core::ReduceOp::kAvg, 0)
            ->wait(timeout));
    if (intra->rank() == 0) {
      BAGUA_RETURN_IF_ERROR(peerAverage(*g.interNode(), step, timeout));
    }
    return intra->broadcast(peer_.f32(), n, core::DataType::kF32, 0)->wait(timeout);
  }

  Status peerAverage(core::Communicator& comm, int64_t step, std::chrono::milliseconds timeout) {
    const int n = comm.size();
    if (n == 1) {
      return Status::ok();
    }
    const size_t count = view_.numel;
    if (mode_ == PeerSelection::kAll) {
      return comm
          .allReduce(peer_.f32(), peer_.f32(), count, core::DataType::kF32, core::ReduceOp::kAvg)
          ->wait(timeout);
    }
    const int peer = Decentralized::shiftOnePeer(comm.rank(), n, step);
    BAGUA_RETURN_IF_ERROR(
        comm.sendRecv(peer_.f32(), count, peer, recv_.f32(), count, peer, core::DataType::kF32)
            ->wait(timeout));
    // (a + b) / 2 is symmetric, so both peers hold bitwise the same average.
    BAGUA_RETURN_IF_ERROR(detail::averagePair(view_.exec, peer_.f32(), recv_.f32(), count));
    return detail::sync(view_.exec, timeout);
  }

  bool flat_;
  PeerSelection mode_;
  int64_t interval_;
  bool built_ = false;
  bool launched_ = false;
  int64_t commStep_ = 0;
  detail::WeightView view_;
  std::chrono::milliseconds timeout_{0};
  detail::Buffer peer_;  // my weights, then the average (worker thread while launched_)
  detail::Buffer recv_;
  std::unique_ptr<core::ProcessGroup> group_;  // the worker's
  detail::Worker worker_;                      // last: joined before the buffers and the group go
};

}  // namespace

Result<std::unique_ptr<core::AlgorithmImpl>> Decentralized::reify(core::ProcessGroup& group) {
  if (interval_ < 1) {
    return BAGUA_ERROR(kInvalidArgument, "decentralized: communication_interval=%d must be >= 1",
                       interval_);
  }
  bool flat = !hierarchical_;
  if (hierarchical_ && group.numNodes() == 1) {
    // One node: the node average is the global average, and shift_one among one leader has no
    // peer (Bagua #380). Exchange among the node's ranks instead.
    BAGUA_LOG_INFO(kLogAlgo,
                   "decentralized: hierarchical=true on a single node; exchanging among its %d "
                   "ranks instead of among node leaders",
                   group.size());
    flat = true;
  } else if (hierarchical_ && (group.intraNode() == nullptr || group.interNode() == nullptr)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "decentralized(hierarchical=true) needs a process group created with "
                       "hierarchical sub-groups (ProcessGroupOptions::hierarchical), or pass "
                       "hierarchical=false");
  }
  const int n = flat ? group.size() : group.numNodes();
  if (mode_ == PeerSelection::kShiftOne && n > 1 && n % 2 != 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "decentralized(peer_selection_mode=shift_one) pairs ranks and needs an "
                       "even number of %s, got %d%s",
                       flat ? "ranks" : "nodes (hierarchical=true exchanges among node leaders)", n,
                       flat ? "" : "; pass hierarchical=false to pair the ranks themselves");
  }
  BAGUA_ASSIGN_OR_RETURN(auto exchangeGroup, detail::threadGroup(group, "decentral", !flat));
  return std::unique_ptr<core::AlgorithmImpl>(
      new DecentralizedImpl(flat, mode_, interval_, std::move(exchangeGroup)));
}

}  // namespace bagua::algo
