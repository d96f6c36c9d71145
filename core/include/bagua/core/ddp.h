// DistributedDataParallel for C++ trainers, with the options of the seeds' DDP, and
// with_bagua(), its Bagua-style entry point.
//
// Per iteration the trainer calls:
//   ddp.prepareForward();          // hooks; buffer broadcast; one-time bucket rebuild
//   ...forward...
//   ddp.markGradReady(i)           // as each parameter's gradient becomes final in backward
//   ddp.finishBackward();          // unused params, waits for communication, copies back
//   ddp.step();                    // optimizers' step + post-step hook
// Inside a noSync() scope markGradReady/finishBackward do not communicate, so gradients
// accumulate locally (gradient accumulation); the first iteration after it reduces the sum.
//
// Buckets are launched strictly in bucket order (a ready bucket waits for earlier ones, as in
// DDP's next_bucket_ and Bagua's ordered buckets) on one background thread, so every rank runs
// the same communication sequence, overlapped with the rest of the backward pass. An algorithm
// whose bucket is one collective (AlgorithmImpl::launchBucket: flat gradient all-reduce) has
// it started without waiting for the previous bucket's; the thread polls the started ones
// (device) or sleeps on the oldest (host: its worker runs one collective at a time anyway).
//
// Device tensors: parameters on a CUDA device are reduced in device buckets (cudaMalloc'd, one
// per bucket) when the process group's backend is NCCL and bagua was built with NCCL; gradients
// are copied in and out with cudaMemcpyAsync on the trainer's stream (DdpOptions::cudaStream),
// so in order after the kernels that wrote them, never through host memory. A bucket launched
// as one collective (launchBucket) is ordered on the device: its collective
// is enqueued at once, behind the bucket's "copied" event (recorded after its last copy) on the
// communicator's stream, and when every bucket of the iteration went that way, finishBackward()
// does not wait for them on the host either: the trainer's stream waits for the last collective
// and the copy-backs queue behind it (torch DDP's order; completion and errors are seen by the
// bucket thread, and an error fails the next prepareForward() or finishBackward()). Other device
// buckets are handed to the algorithm once their "copied" event has completed, and
// finishBackward() waits for them. Host and device buckets may mix (a bucket holds one device).
// Without NCCL, device tensors are refused with an error.
//
// The optimizer inside the backward pass: when the algorithm's bucket communication leaves final
// gradients (AlgorithmImpl::reducedBucketIsFinal: gradient all-reduce) and DdpOptions::
// stepInBackward is on, an optimizer that implements BucketStepper steps each bucket's parameters
// as soon as that bucket is reduced, while later buckets still communicate: device buckets from
// markGradReady() once their collective is enqueued (the optimizer's work, and the copies of the
// reduced gradients, are ordered after it on the device: copyBucketOutOn()), host buckets in
// finishBackward() as each one completes. step() then steps what no bucket held. Trainers that
// step themselves (the Python front end) use the same points: bucketsReduced(),
// waitBucketReduced(), copyBucketOutOn().
//
// Errors: every method returns a Status. A peer that died or a stuck collective surfaces from
// finishBackward() as an error within the collective timeout; the reducer is then unusable.
//
// Thread safety: the methods above are called from the trainer's thread, one at a time.
// Internally: mu_ guards the bucket queue and completion state, shared with the "bagua-bucket"
// thread; algorithm hooks other than runBucket never run under mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"
#include "bagua/core/bucket_assignment.h"
#include "bagua/core/parameter.h"
#include "bagua/core/process_group.h"

// The CUDA runtime's stream type (cudaStream_t is CUstream_st*), declared so that this header
// needs no CUDA headers: a trainer passes its cudaStream_t as it is.
struct CUstream_st;

namespace bagua::core {

class DeviceStager;  // core-private (src/device_stager.h): bucket storage, copies, CUDA state
class DistributedDataParallel;

// An optimizer that can step one bucket's parameters at a time, inside the backward pass (see
// the file comment). Implemented next to core::Optimizer by optimizers that update each
// parameter on its own (optimizer/'s FusedOptimizer); the reducer finds it among its optimizers
// with dynamic_cast. Called on the trainer's thread only.
class BucketStepper {
 public:
  virtual ~BucketStepper() = default;
  // At the first markGradReady() of a backward that communicates: whether this backward's
  // buckets are stepped as they are reduced (then step() after backward steps only what no
  // bucket held). false: step() steps everything after backward, and *why says why (the reducer
  // logs each reason once).
  virtual bool beginBackwardStep(DistributedDataParallel& ddp, std::string* why) = 0;
  // Bucket `bucket` of ddp.buckets() is reduced. Host buckets: the gradients of its parameters
  // are final in Parameter::grad now. Device buckets: the reduction is enqueued; call
  // ddp.copyBucketOutOn(bucket, stream) first, which orders `stream` after it and brings the
  // reduced gradients to Parameter::grad there, and step on `stream` (no host wait).
  virtual Status stepBucket(DistributedDataParallel& ddp, int bucket) = 0;
  // At the end of finishBackward() of a backward that stepped with this optimizer: device
  // optimizers order the trainer's stream (DdpOptions::cudaStream) after their steps here.
  virtual Status endBackwardStep(DistributedDataParallel& /*ddp*/) { return Status::ok(); }
};

struct DdpOptions {
  double bucketCapMb = 25.0;
  size_t firstBucketBytes = 1 << 20;
  bool gradientAsBucketView = false;
  bool findUnusedParameters = false;
  bool broadcastBuffers = true;
  // Rebuild buckets once from the gradient-ready order seen in the first iteration (DDP does
  // this unless find_unused_parameters).
  bool rebuildBuckets = true;
  // Parameters and buffers to leave alone, by "{module}.{param}" name.
  std::vector<std::string> paramsToIgnore;
  // Bound on waiting for communication in finishBackward (0: BAGUA_COLLECTIVE_TIMEOUT_MS).
  std::chrono::milliseconds timeout{0};
  // Device tensors: the cudaStream_t the trainer produces gradients on and reads them from
  // (nullptr: the legacy default stream). Gradient copies in and out are enqueued on it.
  CUstream_st* cudaStream = nullptr;
  // Optimizers that implement BucketStepper step each bucket as soon as it is reduced, inside the
  // backward pass, when the algorithm leaves final gradients per bucket (see the file comment);
  // the optimizer may still decline per backward (its own switch, a GradScaler, ...). false: every
  // optimizer steps in step(), after backward.
  bool stepInBackward = true;
};

// Where a reducer's time went since creation (or resetStats()), for "where does the step go"
// traces (bench/ddp prints them per contestant). Nanoseconds, summed.
struct DdpStats {
  int64_t iterations = 0;      // finishBackward() calls that communicated
  int64_t markNs = 0;          // trainer: inside markGradReady (copy-in, queueing)
  int64_t finishWaitNs = 0;    // trainer: finishBackward waiting for the buckets
  int64_t copyOutNs = 0;       // trainer: finishBackward's copy-back
  int64_t buckets = 0;         // buckets run by the bucket thread
  int64_t bucketWaitNs = 0;    // bucket thread: waiting for a bucket's copies (device)
  int64_t bucketRunNs = 0;     // bucket thread: runBucket, or launchBucket to seen finished
  int64_t bucketQueueNs = 0;   // bucket thread: from a bucket's queueing to its run starting
  int64_t stepNs = 0;          // trainer: BucketStepper::stepBucket inside the backward pass
  int64_t bucketsStepped = 0;  // buckets stepped inside the backward pass
};

class DistributedDataParallel {
 public:
  // Broadcasts rank 0's parameters, buffers and optimizer state, reifies the algorithm and
  // builds the buckets. `params` and `buffers` are the trainer's lists (borrowed: they must
  // outlive the reducer; setGrad updates them). Optimizers are borrowed too.
  static Result<std::unique_ptr<DistributedDataParallel>> create(
      std::vector<Parameter>& params, std::vector<Parameter>& buffers,
      std::vector<Optimizer*> optimizers, std::shared_ptr<Algorithm> algorithm, ProcessGroup& group,
      const DdpOptions& options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Status prepareForward();
  Status markGradReady(int paramIndex);
  // With findUnusedParameters: zero-fills the gradients of the parameters that got none in this
  // backward and launches their buckets (without it, such a parameter is the error
  // finishBackward() reports). finishBackward() does it first; call it yourself to wait for
  // every bucket before finishBackward() (waitBucketReduced).
  Status markUnusedReady();
  Status finishBackward();
  Status step();

  // Gradient accumulation scope (DDP's no_sync()).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel* ddp) : ddp_(ddp) { ddp_->noSync_ = true; }
    ~NoSyncGuard() { ddp_->noSync_ = false; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  NoSyncGuard noSync() { return NoSyncGuard(this); }

  std::vector<Parameter>& parameters() { return params_; }
  std::vector<Parameter>& buffers() { return buffers_; }
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Bucket layout as parameter names, bucket by bucket (for logs and tests).
  std::vector<std::vector<std::string>> bucketLayout() const;
  bool isIgnored(const std::string& name) const;
  ProcessGroup& group() { return group_; }
  int64_t trainStep() const { return trainStep_; }
  // Exact resume: the step counter and the algorithm's state
  // (AlgorithmImpl::saveState) as bytes for a checkpoint, taken between steps (not inside a
  // backward). restoreSchedule() takes them back before this reducer's first forward; with
  // counterOnly (a resume on another world size, where per-rank replicas no longer apply) only
  // the step counter. InvalidArgument for damaged bytes or another algorithm's state;
  // FailedPrecondition after the first forward. Defined in checkpoint.cc.
  Result<std::vector<uint8_t>> saveSchedule();
  Status restoreSchedule(std::span<const uint8_t> bytes, bool counterOnly = false);
  bool bucketsRebuilt() const { return rebuilt_; }
  // Counts bucket layouts: creation, the rebuild in ready order, algorithm resets, autotune
  // switches and setGradHomes() each make a new one (a trainer that lays out gradients in bucket
  // order watches it).
  int64_t layoutGeneration() const { return layoutGeneration_; }
  // Between iterations: every parameter's Parameter::gradHome (null: none) replaced by `homes`,
  // and the current buckets laid out again over them (those whose homes now line up run in
  // place). Drains the buckets in flight first. InvalidArgument for a wrong count or with
  // gradient_as_bucket_view; FailedPrecondition inside a backward.
  Status setGradHomes(const std::vector<void*>& homes);
  const DdpOptions& options() const { return options_; }
  std::vector<Optimizer*>& optimizers() { return optimizers_; }

  // Broadcasts rank 0's parameters, buffers and optimizer state (used at creation and resets).
  Status broadcastState();

  // ---- Reduced buckets, for stepping inside the backward pass (trainer's thread) -------------
  // How many buckets of the current backward, counted from bucket 0 in bucket order, are reduced:
  // a host bucket once its communication has completed, a device bucket launched as one
  // collective once that collective is enqueued (work ordered after it with copyBucketOutOn()
  // sees the reduced gradients). 0 outside a backward that communicates.
  int bucketsReduced();
  // Waits (bounded by the collective timeout) until bucket `bucket` of this backward is reduced,
  // then, for a host bucket, copies its reduced gradients into the parameters' gradients
  // (Parameter::grad) where they are not at their bucket slot, so finishBackward() leaves them
  // alone. The first communication error, if any. FailedPrecondition outside a backward that
  // communicates or for a bucket not launched yet (markUnusedReady()); InvalidArgument for a
  // bucket index out of range.
  Status waitBucketReduced(int bucket);
  // A reduced device bucket (bucketsReduced(), waitBucketReduced()): makes `stream` (a
  // cudaStream_t; null: the legacy default stream) wait for the reduction (orderAfterReduction)
  // and enqueues there the copies of the reduced gradients into Parameter::grad where a gradient
  // is not at its bucket slot, so finishBackward() leaves them alone; no host wait. The trainer
  // orders its stream after `stream` before the next iteration writes the buckets again
  // (BucketStepper::endBackwardStep). FailedPrecondition for a bucket not reduced yet;
  // InvalidArgument for a host bucket.
  Status copyBucketOutOn(int bucket, CUstream_st* stream);
  // Device buckets: makes `stream` run its later work after everything the group's communicator
  // has issued so far, the reductions among it, without a host wait. FailedPrecondition on a
  // host group.
  Status orderAfterReduction(CUstream_st* stream);
  // The buckets this backward's optimizers have stepped so far (trainer's view; for tests).
  int bucketsSteppedInBackward() const { return steppedCount_; }

  // Time accounting (trainer's thread; the bucket thread's part is read under mu_).
  DdpStats stats();
  void resetStats();

 private:
  DistributedDataParallel(std::vector<Parameter>& params, std::vector<Parameter>& buffers,
                          std::vector<Optimizer*> optimizers, std::shared_ptr<Algorithm> algorithm,
                          ProcessGroup& group, const DdpOptions& options);
  Status initAlgorithm();
  // The buckets of `assignment` (ddp_buckets.cc): laid out, their storage allocated with the
  // gradients moved in, then made the current ones with fresh per-iteration state.
  Status buildBuckets(const std::vector<std::vector<int>>& assignment);
  // The bucket limits of the options (first bucket, cap) for this model's communicated bytes
  // (limitsForModel): the initial layout and the rebuild both cut buckets by them.
  BucketOptions bucketLimits() const;
  // The new buckets (tensor maps rebuilt; storage not allocated yet), checked.
  Result<std::vector<Bucket>> layOutBuckets(const std::vector<std::vector<int>>& assignment);
  // Copies the current gradients into the new buckets' storage (gradient_as_bucket_view: and
  // points the gradients at it), and runs the algorithm's per-bucket set-up.
  Status moveGradsInto(std::vector<Bucket>& buckets);
  // gradient_as_bucket_view: parameters in no new bucket whose gradients are views into the old
  // ones get memory of their own.
  Status keepGradsLeavingBuckets();
  // After buckets_ changed: the per-iteration and per-bucket state sized for them.
  void resetBucketState();
  // Waits (bounded) until every launched bucket has finished, also those ordered on the device.
  Status drainBuckets();
  // Under mu_ (held by `lock`): waits, bounded, until `counted` (completed_ or enqueued_)
  // reaches launched_; then the first communication error, if any.
  Status waitUntilAll(std::unique_lock<std::mutex>& lock, const size_t& counted);
  Status rebuildFromReadyOrder();
  Status launchReadyBuckets();
  Status markGradReadyImpl(int paramIndex);
  void commLoop(std::stop_token stop);
  // Bucket thread: one bucket's communication is over (its status, and when it was queued, its
  // run started and its copies were ready, for stats_; deviceOrdered: counted in enqueued_
  // already).
  void finishBucket(int bucket, Status s, std::chrono::steady_clock::time_point queuedAt,
                    std::chrono::steady_clock::time_point started,
                    std::chrono::steady_clock::time_point ready, bool deviceOrdered);
  // finishBackward's wait: until every bucket is enqueued in device order (then the trainer's
  // stream is ordered after them) or finished (drainBuckets).
  Status waitForBuckets();
  // At the first markGradReady of a backward that communicates: which optimizers step its
  // buckets as they are reduced (steppers_).
  void beginBackward();
  // Steps bucket `b` with every stepper of this backward (once per bucket).
  Status stepBucket(int b);
  // markGradReady: steps the device buckets whose collective is enqueued (in bucket order).
  Status stepEnqueuedDeviceBuckets();

  std::vector<Parameter>& params_;
  std::vector<Parameter>& buffers_;
  std::vector<Optimizer*> optimizers_;
  std::shared_ptr<Algorithm> algorithm_;
  ProcessGroup& group_;
  DdpOptions options_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<AlgorithmImpl> impl_;

  std::vector<TensorRef> tensors_;
  std::vector<int> tensorOfParam_;  // param index -> tensor index or -1
  std::vector<Bucket> buckets_;
  std::vector<int> bucketOfTensor_;
  std::vector<int> slotOfTensor_;
  // Own gradient memory of host parameters that were bucket views and are in no bucket after a
  // rebuild (an algorithm's later stage reducing fewer tensors, e.g. async after its warm-up).
  std::vector<std::vector<uint8_t>> ownGrads_;
  // The buckets' storage and the copies into and out of it (host memory, or device memory with
  // the buckets' events).
  std::unique_ptr<DeviceStager> stager_;

  // Per-iteration state (trainer thread).
  std::vector<bool> marked_;
  std::vector<int> pendingInBucket_;
  size_t nextBucket_ = 0;
  bool inBackward_ = false;
  bool noSync_ = false;
  int64_t trainStep_ = 0;
  std::vector<int> readyOrder_;  // tensor indices, first iteration
  bool recordOrder_ = true;
  bool rebuilt_ = false;
  bool rebuildPending_ = false;
  int64_t layoutGeneration_ = 0;
  // Stepping inside the backward pass (trainer thread): this backward's steppers, the buckets
  // they stepped, the buckets whose reduced gradients were copied back early
  // (waitBucketReduced), and each reason a stepper declined, logged once.
  std::vector<BucketStepper*> steppers_;
  std::vector<bool> stepped_;
  int steppedCount_ = 0;
  std::vector<bool> copiedOut_;
  std::set<std::string> declinedLogged_;

  // Shared with the bucket thread.
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::condition_variable_any doneCv_;
  std::deque<std::pair<int, std::chrono::steady_clock::time_point>> queue_;  // bucket, queued at
  DdpStats stats_;  // trainer fields: trainer thread; bucket fields: under mu_
  size_t launched_ = 0;
  size_t completed_ = 0;
  // Buckets past the host's part: finished, or their collective enqueued in device order (see
  // above). finishBackward waits for enqueued_ == launched_.
  size_t enqueued_ = 0;
  // Per bucket of the current backward: reduced (see bucketsReduced()); set by the bucket thread.
  std::vector<uint8_t> reduced_;
  size_t deviceOrderedThisIteration_ = 0;  // buckets enqueued in device order since the last finish
  Status commError_;
  std::jthread commThread_;
};

// The seeds' with_bagua(optimizers, algorithm, process_group) in C++ form.
Result<std::unique_ptr<DistributedDataParallel>> withBagua(std::vector<Parameter>& params,
                                                           std::vector<Parameter>& buffers,
                                                           std::vector<Optimizer*> optimizers,
                                                           std::shared_ptr<Algorithm> algorithm,
                                                           ProcessGroup& group,
                                                           const DdpOptions& options = {});

}  // namespace bagua::core
