// The generic fused optimizer (Bagua's fuse_optimizer / fuse_step for C++ trainers).
//
// A FusedOptimizer owns per-parameter state and updates the trainer's parameters through the
// trainer's own core::Parameter list (borrowed; it must outlive the optimizer). The update rule
// comes from the derived ElementwiseOptimizer<Rule> (elementwise.h); everything else is here:
//
//   fuse({doFlatten, checkFlatten})  Bagua's fuse_optimizer(): per (group, dtype, device) moves the
//                                    parameters, gradients, master weights and every state into
//                                    one contiguous allocation each, in the same order, so each
//                                    tensor becomes a view. Parameter::data is re-pointed in the
//                                    trainer's list, gradients through Parameter::setGrad (when
//                                    set) and the list. Fails if already fused.
//   fuseStep()                       Bagua's fuse_step(): finds the runs of >= 2 tensors that are
//                                    byte-adjacent, in the same order, in every list (weights,
//                                    gradients, master weights, states) with equal step counts,
//                                    and updates each run with one kernel call over its whole
//                                    range; the rest falls back to the per-tensor step. The runs
//                                    (the plan) are cached: a step only re-reads each parameter's
//                                    data and grad pointers (one compare each, no allocation) and
//                                    re-plans when one of them, a group's state mask, the layout
//                                    or the step counts (plainStep, loadState) changed.
//   plainStep()                      the per-tensor step (always available).
//   step()                           fuseStep() once fused, else plainStep() (core::Optimizer).
//   attachReducer(ddp)               with gradient_as_bucket_view the reducer owns the gradients
//                                    in flat buckets: the optimizer then lays parameters and
//                                    state out in bucket order and leaves the gradients where
//                                    they are, so runs cover whole buckets; after the reducer
//                                    rebuilds its buckets the next step re-lays them out.
//   setGradScaler(scaler)            mixed precision: every step first checks all gradients
//                                    (times 1 / scale) for inf/NaN; if any, the step is skipped
//                                    and the scale backs off; else the step runs with the
//                                    unscaling folded into the kernel and the scaler may grow.
//   (core::BucketStepper)            beside a reducer whose algorithm leaves final gradients per
//                                    bucket (gradient all-reduce), each bucket's parameters are
//                                    stepped as soon as the bucket is reduced, inside the
//                                    backward pass, and step() then steps only the parameters no
//                                    bucket held: the same bits as stepping after backward (see
//                                    beginBackwardStep).
//
// Parameters with a null gradient are skipped by plainStep (as PyTorch skips grad=None); fuse()
// gives them a zero gradient in the flat storage (as Bagua does).
//
// Errors: creation and fuse() validate input (dtype/device mismatches, missing setGrad when a
// gradient must move, bad hyper-parameters) and return InvalidArgument naming the parameter.
// Thread safety: one trainer thread calls every method; the CPU kernels use the optimizer's own
// ThreadPool internally (see thread_pool.h). Not copyable or movable (the trainer's list and
// pool threads point into it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/ddp.h"
#include "bagua/core/parameter.h"
#include "bagua/optimizer/kernel_args.h"
#include "bagua/optimizer/thread_pool.h"

namespace bagua::optim {

class GradScaler;

struct FuseOptions {
  bool doFlatten = true;
  // On: every fuseStep first compares every tensor's data and grad pointers with the cached plan
  // (one compare each, ~1.4 ns per tensor on the CI VM), so a tensor the trainer re-pointed is
  // found at once and stepped on its own (correct results); warns once per layout when tensors
  // flattened by fuse() have moved.
  // Off (Bagua's check_flatten=False): the trainer re-points tensors only through a re-layout or
  // after calling invalidatePlan(). A step then compares a rotating window of kWatchWindow tensors
  // (O(1) per step), so a broken promise is still found within ceil(n / kWatchWindow) steps, but
  // the steps before that update the old place. plainStep always checks every tensor.
  bool checkFlatten = true;
};

struct OptimizerOptions {
  // f16/bf16 parameters: keep f32 master weights (the rule updates those and the parameter is
  // their rounding). Without, the parameter itself is updated in f32 and rounded each step.
  bool masterWeights = true;
  // CPU threads (0: the BAGUA_OPTIM_THREADS parameter).
  int threads = 0;
  // Elements per CPU chunk (0: BAGUA_OPTIM_CHUNK_ELEMENTS).
  size_t chunkElements = 0;
};

// Resolved StorageType of a parameter dtype (f32, f64, f16, bf16), or InvalidArgument.
Result<StorageType> storageTypeOf(core::DataType dtype);

class FusedOptimizer : public core::Optimizer, public core::BucketStepper {
 public:
  ~FusedOptimizer() override;
  FusedOptimizer(const FusedOptimizer&) = delete;
  FusedOptimizer& operator=(const FusedOptimizer&) = delete;

  Status fuse(const FuseOptions& options = {});
  // Tensors the window of checkFlatten=false compares per step.
  static constexpr size_t kWatchWindow = 256;
  // The trainer re-pointed tensors: the next step re-plans (O(n log n) once).
  void invalidatePlan() { dropPlan(); }
  bool isFused() const { return fused_; }
  Status fuseStep();
  Status plainStep();
  Status step() override;
  void zeroGrad() override;
  std::vector<core::Parameter> stateTensors() override;

  Status attachReducer(core::DistributedDataParallel& ddp);

  // core::BucketStepper: called by the reducer (DdpOptions::stepInBackward) at the first
  // gradient of a backward pass. Steps each bucket's parameters as soon as the reducer has reduced
  // the bucket (host: on the trainer's thread, in finishBackward as each bucket completes; CUDA:
  // from markGradReady, on a stream of this optimizer's ordered after the reduction, with no host
  // wait; the trainer's stream waits for it when backward ends). The runs of the plan are cut at
  // bucket boundaries; each parameter gets the same kernel on the same values as after backward.
  // Declined, with the reason (the reducer logs it once), when BAGUA_OPTIM_STEP_IN_BACKWARD is
  // off, with an enabled GradScaler (its inf/NaN check needs every gradient before any step), when
  // a group needs state it did not allocate (step() reports it), or when the reducer's buckets
  // moved since the last step (the parameters are laid out again by step()).
  bool beginBackwardStep(core::DistributedDataParallel& ddp, std::string* why) override;
  Status stepBucket(core::DistributedDataParallel& ddp, int bucket) override;
  Status endBackwardStep(core::DistributedDataParallel& ddp) override;
  // Buckets stepped inside the last backward pass that stepped in it.
  int bucketsSteppedInBackward() const { return bwBuckets_; }
  void setGradScaler(GradScaler* scaler) { scaler_ = scaler; }
  // True when the last step was skipped for inf/NaN gradients.
  bool lastStepSkipped() const { return lastSkipped_; }

  // Bagua's _bagua_fused_count: per fuseStep, +1 for each group with at least one fused run.
  int64_t fusedCount() const { return fusedCount_; }
  // Tensors updated inside fused runs, and runs, in the last fuseStep.
  size_t lastFusedTensors() const { return lastFusedTensors_; }
  size_t lastFusedRuns() const { return lastFusedRuns_; }
  // True while every tensor fuse() flattened is still where fuse() put it.
  bool flattenIntact() const;
  // Step count of a parameter (index into the trainer's list; -1 if not managed).
  int64_t stepCount(int param) const;
  // A state tensor of a parameter (k-th state of the rule; null if unused).
  void* stateData(int param, int k) const;
  // f32 master weights of an f16/bf16 parameter, or null.
  float* masterData(int param) const;
  int numGroups() const { return static_cast<int>(groupParams_.size()); }

  // State save/load: step counts, states and master weights of every managed parameter, checked
  // against names, sizes and the rule on load.
  Result<std::vector<uint8_t>> saveState() const;
  Status loadState(const std::vector<uint8_t>& bytes);

  virtual const char* ruleName() const = 0;

  // Bagua's calculate_mutual_groups, refined: given lists of (address, bytes) of the same
  // tensors (weights, gradients, states...), the maximal runs of >= 2 tensors, in address order,
  // where each tensor starts right where the previous one ends in every list. Bagua keeps only
  // runs that are identical in every list; this also keeps the parts of runs that still line up
  // (e.g. weights flat in one buffer, gradients in several reducer buckets). Exposed for tests.
  struct Span {
    uintptr_t address = 0;
    size_t bytes = 0;
  };
  static std::vector<std::vector<int>> mutualRuns(const std::vector<std::vector<Span>>& lists);

 protected:
  FusedOptimizer(std::vector<core::Parameter>& params, std::vector<std::vector<int>> groups,
                 const OptimizerOptions& options);

  // One kernel call over a range of one group: `segments` are the numel of the tensors the range
  // covers, in order (one entry for a per-tensor call); `step` is their (equal) 1-based count.
  struct Range {
    int group = 0;
    core::Device device;
    KernelArgs args;
    const size_t* segments = nullptr;
    size_t numSegments = 0;
    int64_t step = 0;
  };
  virtual Status applyRange(const Range& range) = 0;
  virtual int numStates() const = 0;
  virtual unsigned stateMask(int group) const = 0;
  virtual const char* stateName(int k) const = 0;
  virtual double initialState(int group, int k) const = 0;
  virtual bool hasCudaKernel() const = 0;

  // Validates and allocates initial state; called by the derived create().
  Status init();

  ThreadPool& pool() { return *pool_; }
  size_t chunkElements() const { return chunkElements_; }
  std::vector<core::Parameter>& params_;

 private:
  struct Buffer;
  struct Slot;
  struct Partition;
  struct Plan;
  struct PlanRun;

  Status runStep(bool fused);
  // step() after an in-backward step: the parameters no stepped bucket held.
  Status finishBackwardStep(bool fused);
  // The reducer's buckets moved since the optimizer laid its parameters out along them.
  bool reducerLayoutStale() const;
  // The groups' states all allocated (else the error runStep returns).
  Status checkStateMasks() const;
  void* streamFor(const core::Device& device) const;
  Status checkNonFinite(double invScale, bool* found);
  Status layOut(bool moveGrads);
  // layOut()'s parts: each parameter's place in the flat order (the reducer's bucket order when
  // it owns the gradients, else registration order), and one partition's new storage.
  std::vector<size_t> layoutOrder() const;
  Status layOutPartition(Partition& part, const std::vector<size_t>& rank, bool moveGrads);
  Status refreshReducerLayout();
  Status stepSlot(Slot& slot, double invScale);
  Status stepRun(PlanRun& run, double invScale);
  // The plan: fused runs, per-tensor slots, AMP scan ranges; rebuilt only when stale.
  // full: compare every tensor; else a rotating window of kWatchWindow.
  bool planCurrent(bool full);
  // split: the reducer whose buckets cut the runs (stepping inside backward), or null.
  Status ensurePlan(bool full, const core::DistributedDataParallel* split = nullptr);
  void buildPlan(const core::DistributedDataParallel* split);
  // Folds the step counts kept per run into the slots and marks the plan stale.
  void dropPlan();
  // slotBucket (may be empty): per slot, the reducer bucket holding its parameter (-1: none);
  // runs do not cross from one bucket to another.
  std::vector<std::vector<int>> runsOf(const Partition& part,
                                       const std::vector<int>& slotBucket) const;
  int64_t effectiveStep(const Slot& slot) const;
  KernelArgs argsOf(const Slot& slot) const;

  std::vector<std::vector<int>> groupParams_;
  OptimizerOptions options_;
  size_t chunkElements_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<int> slotOfParam_;
  std::vector<std::unique_ptr<Partition>> partitions_;
  bool fused_ = false;
  FuseOptions fuseOptions_;
  bool warnedMoved_ = false;
  core::DistributedDataParallel* ddp_ = nullptr;
  std::vector<const void*> ddpFlats_;
  GradScaler* scaler_ = nullptr;
  bool lastSkipped_ = false;
  int64_t fusedCount_ = 0;
  size_t lastFusedTensors_ = 0;
  size_t lastFusedRuns_ = 0;
  std::vector<unsigned> allocMask_;  // per group: states allocated for every slot at creation
  std::unique_ptr<Plan> plan_;
  std::vector<size_t> segments_;  // scratch of stepSlot
  // CUDA inf/NaN flags, one per device index (allocated on first use).
  std::vector<std::unique_ptr<Buffer>> cudaFlags_;
  // Stepping inside the backward pass (trainer thread): on while a backward steps its buckets;
  // `bwPending_` until step() completes it; the buckets it stepped; the groups that fused.
  bool bwActive_ = false;
  bool bwPending_ = false;
  int bwBuckets_ = 0;
  std::vector<uint8_t> bwBucketDone_;
  std::vector<uint8_t> bwGroupFused_;
  // Per CUDA device index: the stream buckets are stepped on inside backward (created on first
  // use, destroyed with the optimizer).
  std::vector<void*> bwStreams_;
};

}  // namespace bagua::optim
