#include "bagua/core/algorithm.h"

#include <algorithm>

#include "bagua/core/ddp.h"

namespace bagua::core {

Status AlgorithmImpl::restoreState(DistributedDataParallel& /*ddp*/,
                                   std::span<const uint8_t> state) {
  if (!state.empty()) {
    return BAGUA_ERROR(kInvalidArgument,
                       "the checkpoint holds %zu bytes of algorithm state, but this algorithm "
                       "keeps none: was it saved with another algorithm?",
                       state.size());
  }
  return Status::ok();
}

std::vector<TensorRef> AlgorithmImpl::initTensors(DistributedDataParallel& ddp) {
  std::vector<TensorRef> out;
  const auto& params = ddp.parameters();
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const Parameter& p = params[i];
    if (!p.requiresGrad || p.grad == nullptr || ddp.isIgnored(p.name)) {
      continue;
    }
    out.push_back({p.name, i, p.numel, p.dtype, p.device});
  }
  return out;
}

std::vector<std::vector<int>> AlgorithmImpl::tensorsToBuckets(const std::vector<TensorRef>& tensors,
                                                              const BucketOptions& options) {
  // DDP computes the assignment on registration order and then reverses the bucket list, so the
  // 1 MiB first bucket holds the first-registered parameters and is reduced last. `tensors` is
  // in reverse registration order; walk it backwards.
  std::vector<int> forward(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    forward[i] = static_cast<int>(tensors.size() - 1 - i);
  }
  auto buckets = computeBucketAssignmentInOrder(tensors, forward,
                                                {options.firstBucketBytes, options.bucketCapBytes});
  // Sort by smallest registration position (= largest position in `tensors`), then reverse.
  std::stable_sort(buckets.begin(), buckets.end(), [](const auto& a, const auto& b) {
    return *std::max_element(a.begin(), a.end()) > *std::max_element(b.begin(), b.end());
  });
  std::reverse(buckets.begin(), buckets.end());
  for (auto& b : buckets) {
    std::sort(b.begin(), b.end());  // within a bucket: reverse registration order
  }
  return buckets;
}

Status allReduceBucket(Bucket& b, ProcessGroup& g, bool hierarchical, bool average) {
  const auto timeout = g.options().collectiveTimeout;
  const ReduceOp op = average ? ReduceOp::kAvg : ReduceOp::kSum;
  if (!hierarchical || g.intraNode() == nullptr || g.numNodes() == 1) {
    return g.global().allReduce(b.flat, b.flat, b.numel, b.dtype, op)->wait(timeout);
  }
  // Mean of node means equals the global mean: every node runs the same number of ranks.
  Communicator* intra = g.intraNode();
  BAGUA_RETURN_IF_ERROR(intra->reduce(b.flat, b.flat, b.numel, b.dtype, op, 0)->wait(timeout));
  if (intra->rank() == 0) {
    BAGUA_RETURN_IF_ERROR(
        g.interNode()->allReduce(b.flat, b.flat, b.numel, b.dtype, op)->wait(timeout));
  }
  return intra->broadcast(b.flat, b.numel, b.dtype, 0)->wait(timeout);
}

namespace {

class GradientAllReduceImpl final : public AlgorithmImpl {
 public:
  GradientAllReduceImpl(bool hierarchical, bool average)
      : hierarchical_(hierarchical), average_(average) {}

  Status runBucket(Bucket& b, ProcessGroup& g) override {
    return allReduceBucket(b, g, hierarchical_, average_);
  }
  Result<WorkPtr> launchBucket(Bucket& b, ProcessGroup& g) override {
    if (hierarchical_ && g.intraNode() != nullptr && g.numNodes() > 1) {
      return WorkPtr();  // three dependent collectives: runBucket
    }
    return g.global().allReduce(b.flat, b.flat, b.numel, b.dtype,
                                average_ ? ReduceOp::kAvg : ReduceOp::kSum);
  }
  bool reducedBucketIsFinal() const override { return true; }

 private:
  bool hierarchical_;
  bool average_;
};

}  // namespace

Result<std::unique_ptr<AlgorithmImpl>> GradientAllReduce::reify(ProcessGroup& group) {
  if (hierarchical_ && group.intraNode() == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "gradient_allreduce(hierarchical=true) needs a process group created "
                       "with hierarchical sub-groups (ProcessGroupOptions::hierarchical)");
  }
  return std::unique_ptr<AlgorithmImpl>(new GradientAllReduceImpl(hierarchical_, average_));
}

}  // namespace bagua::core
