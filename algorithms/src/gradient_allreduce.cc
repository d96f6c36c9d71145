// Gradient AllReduce on host or CUDA buckets, with Bagua's SUM + divide fallback for NCCL builds
// without ncclAvg.
#include <map>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "cuda_kernels.h"
#include "vec_ops.h"

namespace bagua::algo {

namespace {

// ncclAvg arrived in NCCL 2.10.
constexpr int kNcclAvgVersion = 21000;

class GradientAllReduceImpl final : public core::AlgorithmImpl {
 public:
  GradientAllReduceImpl(bool hierarchical, bool average, bool sumThenDivide)
      : hierarchical_(hierarchical), average_(average), sumThenDivide_(sumThenDivide) {}

  Status initOperations(core::Bucket& bucket) override {
    BAGUA_ASSIGN_OR_RETURN(detail::Exec exec, detail::execFor(bucket.device, "gradient_allreduce"));
    if (average_ && sumThenDivide_ && bucket.dtype != core::DataType::kF32) {
      return BAGUA_ERROR(kInvalidArgument,
                         "gradient_allreduce: bucket %d holds %s; averaging by SUM + divide (no "
                         "ncclAvg in this NCCL) is implemented for f32 only",
                         bucket.index, core::dataTypeName(bucket.dtype));
    }
    exec_[bucket.index] = exec;
    return Status::ok();
  }

  // The flat all-reduce without the SUM + divide fallback is one collective: the reducer starts
  // the next bucket without waiting for it (core::AlgorithmImpl::launchBucket).
  Result<core::WorkPtr> launchBucket(core::Bucket& b, core::ProcessGroup& g) override {
    const bool flat = !hierarchical_ || g.intraNode() == nullptr || g.numNodes() == 1;
    if (!flat || (average_ && sumThenDivide_)) {
      return core::WorkPtr();
    }
    return g.global().allReduce(b.flat, b.flat, b.numel, b.dtype,
                                average_ ? core::ReduceOp::kAvg : core::ReduceOp::kSum);
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    const auto timeout = g.options().collectiveTimeout;
    const bool divide = average_ && sumThenDivide_;
    const core::ReduceOp op =
        average_ && !sumThenDivide_ ? core::ReduceOp::kAvg : core::ReduceOp::kSum;
    if (!hierarchical_ || g.intraNode() == nullptr || g.numNodes() == 1) {
      BAGUA_RETURN_IF_ERROR(
          g.global().allReduce(b.flat, b.flat, b.numel, b.dtype, op)->wait(timeout));
      return divide ? finishAverage(b, g.size(), timeout) : Status::ok();
    }
    // Mean of node means equals the global mean: every node runs the same number of ranks. With
    // SUM + divide: the sum of node sums, divided by the world size on the leaders.
    core::Communicator* intra = g.intraNode();
    BAGUA_RETURN_IF_ERROR(intra->reduce(b.flat, b.flat, b.numel, b.dtype, op, 0)->wait(timeout));
    if (intra->rank() == 0) {
      BAGUA_RETURN_IF_ERROR(
          g.interNode()->allReduce(b.flat, b.flat, b.numel, b.dtype, op)->wait(timeout));
      if (divide) {
        BAGUA_RETURN_IF_ERROR(finishAverage(b, g.size(), timeout));
      }
    }
    return intra->broadcast(b.flat, b.numel, b.dtype, 0)->wait(timeout);
  }

  // The averaged gradients are final once a bucket is reduced (the optimizer may step it then).
  bool reducedBucketIsFinal() const override { return true; }

 private:
  Status finishAverage(core::Bucket& b, int n, std::chrono::milliseconds timeout) {
    const detail::Exec& x = exec_.at(b.index);
    BAGUA_RETURN_IF_ERROR(
        detail::divideInPlace(x, static_cast<float*>(b.flat), static_cast<float>(n), b.numel));
    return detail::sync(x, timeout);
  }

  bool hierarchical_;
  bool average_;
  bool sumThenDivide_;
  std::map<int, detail::Exec> exec_;
};

}  // namespace

int GradientAllReduce::ncclVersion() {
  // From the CUDA half (it links NCCL); 0 where it is absent, as for an unknown version.
  Result<detail::CudaKernels*> k = detail::cudaKernels();
  return k.isOk() ? (*k)->ncclVersion() : 0;
}

Result<std::unique_ptr<core::AlgorithmImpl>> GradientAllReduce::reify(core::ProcessGroup& group) {
  if (hierarchical_ && group.intraNode() == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "gradient_allreduce(hierarchical=true) needs a process group created "
                       "with hierarchical sub-groups (ProcessGroupOptions::hierarchical)");
  }
  bool sumThenDivide = mode_ == AverageMode::kSumThenDivide;
  if (mode_ == AverageMode::kAuto && average_ && group.global().backendName() == "nccl") {
    const int v = ncclVersion();
    sumThenDivide = v > 0 && v < kNcclAvgVersion;
    if (sumThenDivide) {
      BAGUA_LOG_WARN(kLogAlgo,
                     "gradient_allreduce: NCCL %d has no ncclAvg; averaging by SUM all-reduce "
                     "and a division by the world size",
                     v);
    }
  }
  return std::unique_ptr<core::AlgorithmImpl>(
      new GradientAllReduceImpl(hierarchical_, average_, sumThenDivide));
}

}  // namespace bagua::algo
