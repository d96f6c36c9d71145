// The algorithm interface the reducer calls (Bagua's Algorithm / AlgorithmImpl split): an
// Algorithm is a declaration holding the user's parameters; reify() binds it to a process group.
// The Impl decides which tensors are communicated, how they are bucketed, what each bucket's
// communication does, and hooks around forward, backward and the optimizer step.
//
// Thread model: runBucket() and launchBucket() run on the reducer's single background thread
// ("bagua-bucket"),
// one bucket at a time, buckets in the same order on every rank. Every other hook runs on the
// trainer's thread. A hook's error fails the training step that called it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/bucket_assignment.h"
#include "bagua/core/parameter.h"
#include "bagua/core/process_group.h"

namespace bagua::core {

// A bucket: tensors of one dtype and device, flattened into contiguous storage that the
// reducer owns, or the trainer's own memory when the tensors' gradient homes lie back to back
// (`inPlace`, see Parameter::gradHome). Communication always runs on `flat`.
struct Bucket {
  int index = 0;
  std::vector<int> tensors;     // indices into the reducer's tensor list, in bucket order
  std::vector<size_t> offsets;  // element offset of each tensor in flat
  DataType dtype = DataType::kF32;
  Device device;
  size_t numel = 0;
  void* flat = nullptr;
  bool inPlace = false;  // flat is the gradients' homes (trainer memory), not reducer storage
  size_t bytes() const { return numel * dataTypeSize(dtype); }
};

class DistributedDataParallel;

class AlgorithmImpl {
 public:
  virtual ~AlgorithmImpl() = default;

  // True when the reducer must rebuild tensors and buckets (and re-broadcast rank 0's state)
  // before the next forward.
  virtual bool needReset(DistributedDataParallel& /*ddp*/) { return false; }
  // The communicated tensors in bucketing order. Default: gradients of the parameters that
  // require grad and are not ignored, in reverse registration order.
  virtual std::vector<TensorRef> initTensors(DistributedDataParallel& ddp);
  // Partition (positions into `tensors`). Default: DDP's assignment with [first, cap] limits,
  // then reversed so the last-registered parameters (ready first in backward) go first.
  virtual std::vector<std::vector<int>> tensorsToBuckets(const std::vector<TensorRef>& tensors,
                                                         const BucketOptions& options);
  // Per-bucket set-up after (re)bucketing.
  virtual Status initOperations(Bucket& /*bucket*/) { return Status::ok(); }
  // The bucket's communication, run when all its tensors are ready (background thread).
  virtual Status runBucket(Bucket& bucket, ProcessGroup& group) = 0;
  // Optional, instead of runBucket: start the bucket's whole communication as one collective and
  // return its Work without waiting. The reducer then starts the next ready bucket at once and
  // waits for the Works in the order they were started (torch DDP's way: on NCCL the collectives
  // queue on the communicator's stream with no host round trip between buckets). Only for
  // communication that completes on its own, in issue order with the collectives after it, and
  // needs no host work after it. A null Work (the default): the reducer calls runBucket.
  virtual Result<WorkPtr> launchBucket(Bucket& /*bucket*/, ProcessGroup& /*group*/) {
    return WorkPtr();
  }
  // True when a bucket's communication leaves its gradients final for the iteration (gradient
  // all-reduce): an optimizer may then step the bucket's parameters before the backward pass
  // ends (DdpOptions::stepInBackward). Algorithms that communicate weights, or change gradients
  // after the backward pass, keep the default.
  virtual bool reducedBucketIsFinal() const { return false; }

  virtual Status onForwardPre(DistributedDataParallel& /*ddp*/) { return Status::ok(); }
  virtual Status onBackwardReady(DistributedDataParallel& /*ddp*/, int /*tensor*/) {
    return Status::ok();
  }
  virtual Status onPostBackward(DistributedDataParallel& /*ddp*/) { return Status::ok(); }
  virtual Status onPostOptimizerStep(DistributedDataParallel& /*ddp*/) { return Status::ok(); }

  // Exact resume: what decides the algorithm's next steps besides the model, the
  // optimizer and the step counter (a peer-selection counter, weight replicas), as opaque
  // bytes. saveState() runs between steps; restoreState() gets them back before the first
  // forward of a new reducer with the same parameters. Default: nothing to save, and bytes
  // from another algorithm are refused.
  virtual Result<std::vector<uint8_t>> saveState(DistributedDataParallel& /*ddp*/) {
    return std::vector<uint8_t>{};
  }
  virtual Status restoreState(DistributedDataParallel& ddp, std::span<const uint8_t> state);
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string name() const = 0;
  virtual Result<std::unique_ptr<AlgorithmImpl>> reify(ProcessGroup& group) = 0;
};

// One bucket's gradient all-reduce, as GradientAllReduce runs it, for algorithms that reduce a
// bucket the same way (autotune's TunableAllReduce, whose mode changes between iterations):
// all-reduce of `bucket.flat` over the group, averaged or summed. `hierarchical`: intra-node
// reduce to the local leader, all-reduce among leaders, intra-node broadcast; flat when the group
// has no sub-groups or one node. Each wait is bounded by the group's collective timeout; the
// first error is returned. Called from runBucket (the reducer's bucket thread).
[[nodiscard]] Status allReduceBucket(Bucket& bucket, ProcessGroup& group, bool hierarchical,
                                     bool average);

// The default algorithm: all-reduce the gradients bucket by bucket. `average` divides by the
// world size (else sums). `hierarchical`: intra-node reduce to the local leader, all-reduce among
// leaders, intra-node broadcast (needs a process group built with hierarchical sub-groups).
class GradientAllReduce final : public Algorithm {
 public:
  explicit GradientAllReduce(bool hierarchical = false, bool average = true)
      : hierarchical_(hierarchical), average_(average) {}
  std::string name() const override { return "gradient_allreduce"; }
  Result<std::unique_ptr<AlgorithmImpl>> reify(ProcessGroup& group) override;

 private:
  bool hierarchical_;
  bool average_;
};

}  // namespace bagua::core
