// The in-training autotuning service (Bagua's autotune service without the web server): rank 0
// hosts a BayesianOptimizer and talks to the other ranks through the process group's rendezvous
// store. Every rank reports its throughput window; rank 0 decides; every rank reads the decision
// and switches to the same bucket layout (and knob values) at the same iteration.
//
// Set-up: wrap the reducer's algorithm in Tunable (so the layout can be switched and gradient-
// ready times observed without changing the core reducer), build the reducer, then the tuner:
//   auto algo = std::make_shared<autotune::Tunable>(std::make_shared<core::GradientAllReduce>());
//   auto ddp = core::withBagua(params, buffers, {&opt}, algo, group);
//   auto tuner = autotune::Autotuner::create(**ddp, *algo, options);
// Per iteration, on every rank, after ddp.step():
//   Status s = tuner->onIterationEnd();
// Every BAGUA_AUTOTUNE_CHECK_INTERVAL iterations that call makes one store round trip: each rank
// writes "<iterations> <seconds>" of its current window, rank 0 waits for all reports, and
// writes the decision every rank waits for:
//   - keep measuring (warm-up not over, or the window is shorter than the confidence time);
//   - switch to setting S at iteration N (the next one): the reducer's new bucket assignment,
//     computed by rank 0 from the tuned bucket size and the tensor order observed from
//     gradient-ready times, is part of the decision, so no rank recomputes it;
//   - final: switch to the best setting and stop tuning (after BAGUA_AUTOTUNE_MAX_SAMPLES).
// The score of a setting is the mean over ranks of iterations per second in its window (the
// window starts after the first iteration on the new layout, so re-bucketing is not measured).
//
// Several reducers (models) in one process: one Autotuner each, with distinct model names
// (their store keys and log lines carry the name). A knob that acts on shared state names it in
// Knob::resource (the transport knobs do); create() claims those resources in the process-wide
// KnobOwners registry, and a knob whose resource another live tuner holds is dropped from this
// tuner (one INFO line naming the knob, the owner and this model; the tuner still tunes its
// buckets and other knobs). The claim ends when the owner is destroyed or stops tuning for good
// (final decision, skipped); what it last applied stays in force. knobNames() says what is
// tuned. create() checks that every rank kept the same knobs (FailedPrecondition otherwise, on
// every rank). Algorithms that communicate no gradient
// buckets (decentralized, low-precision decentralized, async after warm-up: Bagua #101/#311)
// are skipped: the tuner logs why and every call is a no-op.
//
// Files: rank 0 appends every trial to the CSV log (BAGUA_AUTOTUNE_LOG_FILE) and writes the best
// setting (BAGUA_AUTOTUNE_SAVE_FILE) when tuning ends; a later run names that file in
// BAGUA_AUTOTUNE_LOAD_FILE and starts from it (rank 0 reads it and sends it to the others).
//
// Errors: a rank that does not report within BAGUA_AUTOTUNE_SERVER_WAIT_TIME makes the others'
// onIterationEnd() fail with DeadlineExceeded naming the missing rank; a store failure is
// returned as is. Tuning never changes what is computed, only how it is bucketed.
//
// Thread safety: create() and onIterationEnd() are called from the trainer's thread, between
// iterations (the reducer is idle then); the accessors from the same thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bagua/autotune/optimizer.h"
#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"
#include "bagua/core/ddp.h"

namespace bagua::autotune {

// A knob besides the bucket size: its dimension, its starting value, and how to apply a value
// (called on every rank, between iterations, at the switch iteration).
struct Knob {
  Dimension dimension;
  // The value in force when the knob is built (build knobs right before Autotuner::create: a
  // tuner that owned the resource before leaves its last value in force).
  int64_t initial = 0;
  std::function<Status(int64_t value)> apply;
  // The shared state `apply` acts on, unique in the process (e.g. transport_knobs.h's
  // hostGroupResource / netPluginResource); at most one live tuner owns it (KnobOwners). Empty:
  // the knob acts on state private to this tuner's reducer.
  std::string resource;
};

// A setting as decided and as saved: the bucket size, the bucket assignment (tensor names,
// bucket by bucket) and the knob values by name.
struct Setting {
  uint64_t bucketBytes = 0;
  std::vector<std::vector<std::string>> buckets;
  std::map<std::string, int64_t> knobs;
  double score = 0;  // iterations per second, when measured
};

// Writes / reads the best-setting file (a small text format, autotune/README.md).
Status saveSetting(const std::string& path, const std::string& model, const Setting& setting);
Result<Setting> loadSetting(const std::string& path);

// Bagua's split_bucket_by_bucket_size in a given tensor order: a bucket closes once it holds at
// least `bucketBytes`, and at every change of dtype or device. Returns positions into `tensors`.
std::vector<std::vector<int>> partitionBySize(const std::vector<core::TensorRef>& tensors,
                                              const std::vector<int>& order, uint64_t bucketBytes);

// Wraps an algorithm so its bucket layout can be replaced at a chosen iteration: at that
// iteration's prepareForward() the wrapper asks the reducer for a reset (core's
// AlgorithmImpl::needReset), which re-broadcasts rank 0's state (a no-op on values: replicas are
// equal) and re-buckets with the layout given here. Every other hook is the wrapped algorithm's,
// which is re-reified at each switch (fine for the stateless all-reduce family; algorithms that
// keep state in their implementation object should not be wrapped). The wrapper also records
// each tensor's gradient-ready time (ns after the forward-pre hook) in the last iteration.
//
// Thread safety: schedule() and the accessors are called from the trainer's thread between
// iterations; the hooks run on the trainer's thread (runBucket on the reducer's bucket thread).
class Tunable final : public core::Algorithm {
 public:
  explicit Tunable(std::shared_ptr<core::Algorithm> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  // From iteration `atStep` (the reducer's trainStep() after that iteration's prepareForward)
  // on, buckets are `layout` (tensor names, bucket by bucket; every communicated tensor once).
  // Must name a future iteration; every rank must schedule the same layout for the same step.
  Status schedule(int64_t atStep, std::vector<std::vector<std::string>> layout);
  // Gradient-ready times of the last iteration, indexed like the reducer's tensors() (-1: not
  // marked).
  const std::vector<int64_t>& readyTimesNs() const { return readyNs_; }
  core::Algorithm& inner() { return *inner_; }

 private:
  friend class TunableImpl;
  std::shared_ptr<core::Algorithm> inner_;
  int64_t switchAt_ = -1;
  std::vector<std::vector<std::string>> layout_;
  bool layoutValid_ = false;  // the layout matched the tensors when last applied
  bool stable_ = false;       // the reducer can no longer replace the layout by itself
  std::chrono::steady_clock::time_point iterStart_;
  std::vector<int64_t> readyNs_;
  std::vector<int64_t> readyCur_;
};

struct AutotuneOptions {
  // Distinguishes reducers in one job: store keys, logs and the saved file carry it.
  std::string model = "model";
  // Unset: from autotuneParams().
  std::optional<bool> enabled;  // BAGUA_AUTOTUNE >= 1
  std::optional<int> maxSamples;
  std::optional<double> warmupTimeS;
  std::optional<double> samplingConfidenceTimeS;
  std::optional<int> checkInterval;
  std::optional<int> initialSamples;
  std::optional<uint64_t> seed;
  std::optional<std::string> logFile;
  std::optional<std::string> saveFile;
  std::optional<std::string> loadFile;
  std::optional<std::chrono::milliseconds> waitTimeout;  // BAGUA_AUTOTUNE_SERVER_WAIT_TIME
  // Bucket size range searched (log scale). maxBucketBytes 0: the total gradient bytes.
  uint64_t minBucketBytes = 1024;
  uint64_t maxBucketBytes = 0;
  // Extra knobs, identical (names, ranges) on every rank.
  std::vector<Knob> knobs;
  // Measure every candidate next to the best setting so far (one window each, back to back) and
  // score it as (candidate rate / reference rate) x the reference's score, so load drift that
  // spans both windows cancels. Costs twice the windows per trial. The first trial (the starting
  // layout) is measured alone.
  bool pairedReference = true;
};

// One measured setting (rank 0's record; other ranks see only decisions).
struct Trial {
  int index = 0;
  int64_t trainStep = 0;  // iteration at which the measurement ended
  Setting setting;
  double score = 0;  // iterations per second, mean over ranks
  double windowS = 0;
  int bucketCount = 0;
};

class Autotuner {
 public:
  // Collective over the reducer's group (rank 0 writes the start data, including its knob names;
  // the others compare and acknowledge; rank 0 writes the verdict: two store round trips, bounded
  // by the wait time). Reads the options' unset fields from the catalogue. With tuning off and no
  // load file, returns a tuner whose calls do nothing (it claims nothing). Knobs whose resource
  // another live tuner of this process owns are dropped (see knobNames()). Errors: bad options
  // (InvalidArgument); ranks whose kept knob names differ (FailedPrecondition on every rank,
  // naming the model, the first differing rank and both lists); store failures and timeouts.
  // `algorithm` is the Tunable the reducer was built with.
  static Result<std::unique_ptr<Autotuner>> create(core::DistributedDataParallel& ddp,
                                                   Tunable& algorithm,
                                                   AutotuneOptions options = {});
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // Call on every rank once per iteration, after the optimizer step.
  Status onIterationEnd();

  // True while settings are still being tried.
  bool tuning() const { return state_ != State::kDone && state_ != State::kSkipped; }
  // True when the algorithm has no buckets to tune (the reason is logged once).
  bool skipped() const { return state_ == State::kSkipped; }
  // Rank 0: every measured trial, in order. Other ranks: empty.
  const std::vector<Trial>& trials() const { return trials_; }
  // The setting in force (every rank).
  const Setting& current() const { return current_; }
  // The iterations at which a new layout took effect (every rank; equal on all ranks).
  const std::vector<int64_t>& switchSteps() const { return switchSteps_; }
  // Seconds this rank spent inside onIterationEnd (store waits, the GP on rank 0).
  double overheadSeconds() const { return overheadS_; }
  // The extra knobs this tuner tunes (or tuned), in the options' order, without those dropped
  // because another tuner owns their resource; empty when tuning is off or skipped.
  std::vector<std::string> knobNames() const;

 private:
  enum class State { kWarmup, kMeasuring, kDone, kSkipped };
  struct Resolved;
  Autotuner(core::DistributedDataParallel& ddp, Tunable& algorithm, AutotuneOptions options);
  Status init();
  // init()'s parts: the options and parameters into r_ (checked); rank 0 publishes where tuning
  // starts (a loaded setting or none) and the knobs it tunes, the others read it and rank 0
  // checks they tune the same knobs; every rank applies a loaded start.
  Status resolveOptions();
  Result<std::string> exchangeStart(const SearchSpace& space);
  Status applyStart(const std::string& start, const SearchSpace& space);
  Status check();
  // One rank's window: iterations, seconds, and the median iteration rate of its sub-windows
  // (one per check; Horovod's median of sub-samples, so a short burst of load on the machine
  // does not decide a trial).
  struct WindowReport {
    int64_t iters = 0;
    double secs = 0;
    double medianRate = 0;
  };
  Status decide(int64_t step, const std::vector<WindowReport>& reports, std::string* decision);
  Status applyDecision(const std::string& decision);
  Result<Setting> makeSetting(const Point& point);
  Status schedule(const Setting& s);
  std::string key(const std::string& what) const;
  void logTrial(const Trial& t);
  // Drops the knobs whose resource another tuner owns; claims the others.
  void claimKnobs();
  // Rank 0 compares every rank's knob names (create()'s second round trip).
  Status checkKnobsAgree(const std::string& rank0Names);
  // Tuning is over for good: give the shared resources back.
  void releaseKnobs();

  core::DistributedDataParallel& ddp_;
  Tunable& algo_;
  AutotuneOptions options_;
  std::unique_ptr<Resolved> r_;
  uint64_t ownerId_ = 0;  // in KnobOwners::process()
  State state_ = State::kWarmup;
  int rank_ = 0;
  int world_ = 1;
  std::vector<std::string> tensorNames_;
  int64_t checks_ = 0;
  int64_t iterations_ = 0;
  // Current window (every rank).
  int64_t windowStartStep_ = 0;
  std::chrono::steady_clock::time_point windowStart_;
  int64_t windowIters_ = 0;
  std::vector<double> subRates_;  // iteration rate between consecutive checks in the window
  int64_t subStartIters_ = 0;
  std::chrono::steady_clock::time_point subStart_;
  int64_t pendingSwitch_ = -1;  // iteration the scheduled layout takes effect
  Setting current_;
  Point currentPoint_;
  std::vector<int64_t> switchSteps_;
  double overheadS_ = 0;
  // Rank 0.
  std::unique_ptr<BayesianOptimizer> bo_;
  std::chrono::steady_clock::time_point startedAt_;
  std::vector<double> readySumNs_;
  int64_t readySamples_ = 0;
  std::vector<Trial> trials_;
  // Paired measurement (rank 0).
  bool inReference_ = false;
  double candidateRate_ = 0;
  double candidateWindowS_ = 0;
  Setting candidate_;
  Setting reference_;
  double referenceScore_ = 0;
};

// Gradient all-reduce whose hierarchical mode (intra-node reduce, inter-node all-reduce,
// intra-node broadcast) can be switched between iterations, so the tuner can try it. Same
// results as core::GradientAllReduce; flat when the group has no sub-groups or one node.
class TunableAllReduce final : public core::Algorithm {
 public:
  explicit TunableAllReduce(bool hierarchical = false, bool average = true)
      : hierarchical_(hierarchical), average_(average) {}
  std::string name() const override { return "gradient_allreduce"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  // Takes effect for the next bucket launched; call between iterations.
  void setHierarchical(bool on) { hierarchical_.store(on, std::memory_order_release); }
  bool hierarchical() const { return hierarchical_.load(std::memory_order_acquire); }
  // A knob for AutotuneOptions::knobs ("hierarchical", boolean).
  Knob knob();

 private:
  std::atomic<bool> hierarchical_;
  bool average_;
};

}  // namespace bagua::autotune
