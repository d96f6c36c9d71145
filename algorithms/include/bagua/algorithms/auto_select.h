// algorithm="auto": measures the group's all-reduce and the model's gradient volume during the
// first steps of training, then picks an algorithm and its settings by a documented rule
// (chooseAlgorithm, a pure function of the measurements) and switches to it.
//
// What it does, step by step (AutoSelect's reify returns a probing implementation first):
//   steps 1-2               gradient all-reduce, untimed (first-step costs, the bucket rebuild);
//                           the largest bucket's MinMaxUInt8 compress + decompress is timed on
//                           its device
//   the next 2 steps        gradient all-reduce, each bucket's collective timed on the bucket
//                           thread and each step timed on the trainer thread; then the ranks
//                           exchange these figures through the store (the early check):
//                             - if the rule makes the same choice for every compute time the
//                               figures allow (chooseEarly), that is the decision: nothing more
//                               to measure (a link whose all-reduce is a small part of the step);
//                             - else if every rank's timed steps agree within kAutoStableSpread,
//                               one step without communication follows, then the decision;
//                             - else the timed steps go on to P in all (P: probe_steps or
//                               BAGUA_AUTO_PROBE_STEPS, default 4), then max(1, P/2) steps
//                               without communication, then the decision.
//   steps without communication  the compute-only step time; each bucket is zeroed, so every
//                           rank applies the same zero gradient and the ranks stay identical
//   the decision            every rank publishes its figures through the group's store, rank 0
//                           combines them (the slowest rank's times, the slowest link) and
//                           publishes the result, every rank runs the rule on the same figures
//                           and logs the choice, and the reducer resets: rank 0's weights and
//                           optimizer state are broadcast and the chosen algorithm's
//                           implementation takes over from the next step.
// With P = 1 the early check comes after the one timed step. A pinned name (the `pin` argument,
// else BAGUA_ALGORITHM) skips all of it.
//
// The rule (chooseAlgorithm): per candidate, the bucket thread's work per step is its
// collectives' latency plus its bytes at the measured all-reduce bandwidth plus its compression
// work; the part of it that the measured gradient all-reduce step showed to be hidden behind the
// backward pass is free, the rest is exposed and adds to the compute-only step time. The
// predicted step time times the candidate's steps factor (steps to a quality target relative to
// gradient all-reduce; assumed, see kAutoStepsFactor*) is its score. The lowest score wins, but
// the most exact candidate (gradient all-reduce, ByteGrad, PowerSGD rank 16 with 8-bit factors,
// rank 4, rank 1, in that order) whose score is within kAutoMinGain of the lowest is taken instead:
// a less exact algorithm replaces a more exact one only where its score is below (1 - kAutoMinGain)
// of it. A candidate whose algorithm is not registered in this build is skipped with a log line
// (the decision's reason names it).
//
// Thread model: reify, needReset and the decision run on the trainer's thread; the probe's
// runBucket on the reducer's bucket thread (one bucket at a time; its samples under a mutex).
// decision() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"

namespace bagua::algo {

// The names auto can pin or choose, in the order the rule considers them.
const std::vector<std::string>& autoCandidateNames();

// Steps to a quality target relative to gradient all-reduce, per candidate: assumptions of the
// rule, from bench/ddp's time-to-accuracy runs on 2 and 4 GPUs (bench/RESULTS.md, "Time to
// accuracy"; README "algorithm=auto"): ByteGrad took gradient all-reduce's steps on the LM and the
// ResNet; our PowerSGD at rank 4 took 3-3.2x the steps on the LM (180 and 190 against 60; the
// larger is taken) and fewer on the ResNet, at rank 1 it levelled off above the LM's target; at
// rank 16 with 8-bit factors (about rank 4's bytes) it took 1.15x the steps on GPT-2 small (230
// against 200) and 1.31x on the CPU LM (210 against 160), where rank 4 did not reach the target
// inside the cap (the larger, rounded up, is taken). The rule takes the model it cannot see to be
// the harder case, the transformer.
inline constexpr double kAutoStepsFactorByteGrad = 1.0;
inline constexpr double kAutoStepsFactorPowerSgdRank16Q8 = 1.35;
inline constexpr double kAutoStepsFactorPowerSgdRank4 = 3.2;
inline constexpr double kAutoStepsFactorPowerSgdRank1 = 4.0;
// The rank of the candidate with 8-bit factors.
inline constexpr int kAutoQuantizedRank = 16;
// A less exact candidate replaces a more exact one only if its predicted time to a quality
// target is below (1 - kAutoMinGain) of the more exact one's.
inline constexpr double kAutoMinGain = 0.10;
// Where gradient all-reduce hid entirely, the part of the compute-only step that hides
// communication is taken as the larger of its work and this share of the step (the backward
// pass's usual part).
inline constexpr double kAutoHiddenShare = 0.5;
// MinMaxUInt8 throughput (compress + decompress, bytes per second of gradient) taken for device
// gradients when it was not measured (no f32 bucket), and the rule's default.
inline constexpr double kAutoDeviceCodecBytesPerSecond = 200e9;

// The early check decides only on a choice that holds for every compute time in
// [max(step - busy, kAutoEarlyComputeFloor * step), step] (busy: the bucket thread's collective
// seconds a step, which no compute can hide more than), evaluated at kAutoEarlyPoints evenly
// spaced compute times.
inline constexpr double kAutoEarlyComputeFloor = 0.05;
inline constexpr int kAutoEarlyPoints = 5;
// Timed steps whose slowest is within this factor of the fastest, on every rank, are taken as
// settled: one compute-only step, then the decision.
inline constexpr double kAutoStableSpread = 1.10;

// One all-reduce as timed: its buffer's bytes and its seconds.
struct LinkSample {
  double bytes = 0;
  double seconds = 0;
};

// All-reduce time = latencySeconds + bytes / bytesPerSecond (bytesPerSecond is the algorithm
// bandwidth: the buffer's bytes over the time, as nccl-tests' algbw).
struct LinkModel {
  double latencySeconds = 0;
  double bytesPerSecond = 0;
};

// Least-squares fit of LinkModel to samples; a negative latency or slope (noise, one size only)
// falls back to a line through the origin. InvalidArgument without a positive sample.
Result<LinkModel> fitLink(const std::vector<LinkSample>& samples);

// What chooseAlgorithm decides from (all measured by AutoSelect; tests inject them).
struct AutoInputs {
  int worldSize = 1;
  // The group spans several nodes of several ranks each (the algorithms' hierarchical mode).
  bool hierarchical = false;
  // Elements of each communicated tensor, bucket by bucket (bucket order).
  std::vector<std::vector<size_t>> buckets;
  size_t elementBytes = 4;
  // Every gradient is float32 (ByteGrad's codec takes f32 only).
  bool allF32 = true;
  double computeSeconds = 0;        // a step without communication
  double allReduceStepSeconds = 0;  // a step with gradient all-reduce
  LinkModel link;
  // MinMaxUInt8 compress + decompress throughput on the gradients' device (bytes per second).
  double codecBytesPerSecond = kAutoDeviceCodecBytesPerSecond;
  // Algorithms registered in this build (algorithmNames()).
  std::vector<std::string> registered;
};

struct AutoCandidate {
  std::string label;      // "powersgd rank 4"
  std::string algorithm;  // the factory's name
  AlgorithmArgs args;
  double wireBytes = 0;       // payload per step, in all-reduce-equivalent bytes
  double workSeconds = 0;     // bucket thread per step: collectives + compression
  double exposedSeconds = 0;  // the part of workSeconds not hidden behind compute
  double stepSeconds = 0;     // predicted step time
  double stepsFactor = 1;     // steps to a quality target relative to gradient all-reduce
  double score = 0;           // stepsFactor * stepSeconds
  bool registered = true;
};

struct AutoDecision {
  std::string algorithm;  // empty: not decided yet
  AlgorithmArgs args;
  std::string reason;  // one line, logged
  std::vector<AutoCandidate> candidates;
  int probeSteps = 0;  // training steps the probe took (0: pinned or one rank)
};

// The rule (see the file comment). InvalidArgument for inputs that cannot describe a training
// step (no bucket, a non-positive time or bandwidth).
Result<AutoDecision> chooseAlgorithm(const AutoInputs& in);

// The early check (see the file comment): in.computeSeconds is ignored; busySeconds is the bucket
// thread's collective time a step. The decision if chooseAlgorithm makes the same choice (name and
// settings) at every compute time tried, its reason saying so; std::nullopt if the choice depends
// on the compute time. Errors as chooseAlgorithm's.
Result<std::optional<AutoDecision>> chooseEarly(const AutoInputs& in, double busySeconds);

class AutoSelect final : public core::Algorithm {
 public:
  // pin: "" (measure and choose) or one of autoCandidateNames(); pinSource names the setting it
  // came from, for messages ("BAGUA_ALGORITHM", "pin"). probeSteps >= 1. InvalidArgument for an
  // unknown pin, naming pinSource; FailedPrecondition for a pin not registered in this build.
  // startIter (>= 0, or -1 for the chosen algorithm's own default): the training step, counted
  // from the first one with the probe's steps included, from which a chosen powersgd compresses;
  // the steps before it are its plain all-reduce (a compressor started during a learning-rate
  // warm-up slows convergence). ByteGrad and gradient all-reduce have no start step.
  static Result<std::shared_ptr<AutoSelect>> create(const std::string& pin,
                                                    const std::string& pinSource, int probeSteps,
                                                    int startIter = -1);

  std::string name() const override { return "auto"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  // The choice once made (algorithm empty before), with the reason and the candidates' table.
  AutoDecision decision() const;

 private:
  friend class AutoProbeImpl;
  AutoSelect(std::string pin, int probeSteps, int startIter)
      : pin_(std::move(pin)), probeSteps_(probeSteps), startIter_(startIter) {}
  // d.args with the start step (startIter_ less the steps already run) where d is powersgd.
  AlgorithmArgs withStart(const std::string& algorithm, AlgorithmArgs args, int stepsRun) const;
  // What the early check concluded.
  enum class Early { kDecided, kSettled, kGoOn };
  // Trainer thread, after the first timed steps: exchange the figures (store keys under `seq`),
  // and decide where chooseEarly can. An error is kept (returned by the next reify) and reported
  // as kDecided, so that the reducer resets and meets it.
  Early checkEarly(core::DistributedDataParallel& ddp, const AutoInputs& mine, double busySeconds,
                   double spread, int64_t seq, int stepsSoFar);
  // Trainer thread, once the probe's figures are in: exchange (store keys numbered `seq`),
  // decide, build the choice. An error is kept and returned by the next reify.
  void decide(core::DistributedDataParallel& ddp, const AutoInputs& mine, int64_t seq,
              int stepsSoFar);
  // Builds the decided algorithm (gradient all-reduce where the choice refuses its settings),
  // logs it and keeps it.
  void adopt(AutoDecision d, bool hierarchical, int rank);
  void fail(Status s);

  mutable std::mutex mu_;
  const std::string pin_;
  const int probeSteps_;
  const int startIter_;
  std::shared_ptr<core::Algorithm> chosen_;
  AutoDecision decision_;
  Status pending_;
};

}  // namespace bagua::algo
