// algorithm="auto": measures the group's all-reduce and the model's gradient volume during the
// first steps of training, then picks an algorithm and its settings by a documented rule
// (chooseAlgorithm, a pure function of the measurements) and switches to it.
//
// What it does, step by step (AutoSelect's reify returns a probing implementation first):
//   steps 1-2               gradient all-reduce, untimed (first-step costs, the bucket rebuild);
//                           the largest bucket's MinMaxUInt8 compress + decompress is timed on
//                           its device
//   the next P steps        gradient all-reduce, each bucket's collective timed on the bucket
//                           thread and each step timed on the trainer thread (P: probe_steps or
//                           BAGUA_AUTO_PROBE_STEPS, default 4)
//   the next max(1, P/2)    no communication at all (the compute-only step time); each bucket
//                           is zeroed, so every rank applies the same zero gradient and the
//                           ranks stay identical
//   then                    every rank publishes its figures through the group's store, rank 0
//                           combines them (the slowest rank's times, the slowest link), decides
//                           and publishes the choice, every rank logs it, and the reducer resets:
//                           rank 0's weights and optimizer state are broadcast and the chosen
//                           algorithm's implementation takes over from the next step.
// A pinned name (the `pin` argument, else BAGUA_ALGORITHM) skips all of it.
//
// The rule (chooseAlgorithm): per candidate, the bucket thread's work per step is its
// collectives' latency plus its bytes at the measured all-reduce bandwidth plus its compression
// work; the part of it that the measured gradient all-reduce step showed to be hidden behind the
// backward pass is free, the rest is exposed and adds to the compute-only step time. The
// predicted step time times the candidate's steps factor (steps to a quality target relative to
// gradient all-reduce; assumed, see kAutoStepsFactor*) is its score. The lowest score wins, but
// gradient all-reduce (exact) is kept unless the winner's score is below (1 - kAutoMinGain) of
// its own. A candidate whose algorithm is not registered in this build is skipped with a log
// line (the decision's reason names it).
//
// Thread model: reify, needReset and the decision run on the trainer's thread; the probe's
// runBucket on the reducer's bucket thread (one bucket at a time; its samples under a mutex).
// decision() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"

namespace bagua::algo {

// The names auto can pin or choose, in the order the rule considers them.
const std::vector<std::string>& autoCandidateNames();

// Steps to a quality target relative to gradient all-reduce, per candidate: assumptions of the
// rule, from bench/ddp's time-to-accuracy runs on 4 GPUs (bench/RESULTS.md, "Time to accuracy";
// README "algorithm=auto"): ByteGrad took gradient all-reduce's steps on the LM and the ResNet;
// our PowerSGD at rank 4 took 3x the steps on the LM (180 against 60) and fewer on the ResNet,
// at rank 1 it levelled off above the LM's target. The rule takes the model it cannot see to be
// the harder case, the transformer.
inline constexpr double kAutoStepsFactorByteGrad = 1.0;
inline constexpr double kAutoStepsFactorPowerSgdRank4 = 3.0;
inline constexpr double kAutoStepsFactorPowerSgdRank1 = 4.0;
// A compressing algorithm replaces exact gradient all-reduce only if its predicted time to a
// quality target is below (1 - kAutoMinGain) of gradient all-reduce's.
inline constexpr double kAutoMinGain = 0.10;
// Where gradient all-reduce hid entirely, the part of the compute-only step that hides
// communication is taken as the larger of its work and this share of the step (the backward
// pass's usual part).
inline constexpr double kAutoHiddenShare = 0.5;
// MinMaxUInt8 throughput (compress + decompress, bytes per second of gradient) taken for device
// gradients when it was not measured (no f32 bucket), and the rule's default.
inline constexpr double kAutoDeviceCodecBytesPerSecond = 200e9;

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
};

// The rule (see the file comment). InvalidArgument for inputs that cannot describe a training
// step (no bucket, a non-positive time or bandwidth).
Result<AutoDecision> chooseAlgorithm(const AutoInputs& in);

class AutoSelect final : public core::Algorithm {
 public:
  // pin: "" (measure and choose) or one of autoCandidateNames(); pinSource names the setting it
  // came from, for messages ("BAGUA_ALGORITHM", "pin"). probeSteps >= 1. InvalidArgument for an
  // unknown pin, naming pinSource; FailedPrecondition for a pin not registered in this build.
  static Result<std::shared_ptr<AutoSelect>> create(const std::string& pin,
                                                    const std::string& pinSource, int probeSteps);

  std::string name() const override { return "auto"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  // The choice once made (algorithm empty before), with the reason and the candidates' table.
  AutoDecision decision() const;

 private:
  friend class AutoProbeImpl;
  AutoSelect(std::string pin, int probeSteps) : pin_(std::move(pin)), probeSteps_(probeSteps) {}
  // Trainer thread, once the probe's figures are in: exchange (store keys numbered `seq`),
  // decide, build the choice. An error is kept and returned by the next reify.
  void decide(core::DistributedDataParallel& ddp, const AutoInputs& mine, int64_t seq);

  mutable std::mutex mu_;
  const std::string pin_;
  const int probeSteps_;
  std::shared_ptr<core::Algorithm> chosen_;
  AutoDecision decision_;
  Status pending_;
};

}  // namespace bagua::algo
