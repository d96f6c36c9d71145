// Bagua's communication-reducing algorithms on the core's algorithm interface
// (core/algorithm.h), and a factory that builds them by name as Bagua's Algorithm.init(name,
// **kwargs) and Lightning's BaguaStrategy(algorithm=...) do.
//
// Names and parameters (defaults are the seeds'):
//   gradient_allreduce           hierarchical=false, average=true
//   bytegrad                     hierarchical=true, average=true
//   decentralized                hierarchical=true, peer_selection_mode=all|shift_one,
//                                communication_interval=1
//   low_precision_decentralized  hierarchical=true, communication_interval=1
//   qadam                        hierarchical=true (needs a QAdamOptimizer, see qadam.h),
//                                hold_zero_variance=true|false (sets the optimizer's
//                                QAdamOptions::holdZeroVariance; absent: left as it is)
//   async                        peer_selection_mode=all, sync_interval_ms=500, warmup_steps=0
//   powersgd                     rank=1, start_iter=10, min_compression_rate=2,
//                                error_feedback=true, warm_start=true,
//                                orthogonalization_epsilon=0, seed=0, quantize_factors=false
//                                (powersgd.h)
//
// Thread model: see each class and algorithms/README.md. Algorithms are declarations: reify()
// is called by the reducer (collectively, on every rank) when it is created and on each reset.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bagua/algorithms/powersgd.h"
#include "bagua/base/logging.h"
#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"

namespace bagua::algo {

// The algorithms' log category (BAGUA_LOG_SUBSYS name "algo").
inline const LogCategory kLogAlgo{"algo"};

class QAdamOptimizer;

// How gradient_allreduce averages. kNative: the backend's AVG reduction (ncclAvg). kSumThenDivide:
// a SUM all-reduce, then a division by the world size (Bagua's "degraded" mode for NCCL older than
// 2.10, which has no ncclAvg and failed with "invalid reduction operation 4", Bagua #363).
// kAuto: kSumThenDivide when the communicator is NCCL < 2.10, else kNative.
enum class AverageMode { kAuto, kNative, kSumThenDivide };

// Gradient AllReduce: the gradients all-reduced bucket by bucket, on host or CUDA tensors.
// average: mean (else sum). hierarchical: intra-node reduce to the local leader, all-reduce among
// the leaders, intra-node broadcast (needs a process group with hierarchical sub-groups).
class GradientAllReduce final : public core::Algorithm {
 public:
  explicit GradientAllReduce(bool hierarchical = false, bool average = true,
                             AverageMode mode = AverageMode::kAuto)
      : hierarchical_(hierarchical), average_(average), mode_(mode) {}
  std::string name() const override { return "gradient_allreduce"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;
  // The version of the NCCL the algorithms' CUDA half links (e.g. 22809); 0 where the half is
  // not built, does not load or has no NCCL. Loads the half.
  static int ncclVersion();

 private:
  bool hierarchical_;
  bool average_;
  AverageMode mode_;
};

// ByteGrad: MinMaxUInt8-compressed scatter-reduce / all-gather of the gradients (see README).
// Every rank ends with bitwise identical gradients.
class ByteGrad final : public core::Algorithm {
 public:
  explicit ByteGrad(bool hierarchical = true, bool average = true)
      : hierarchical_(hierarchical), average_(average) {}
  std::string name() const override { return "bytegrad"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

 private:
  bool hierarchical_;
  bool average_;
};

enum class PeerSelection { kAll, kShiftOne };

// Decentralized SGD: the weights as they were before forward are averaged with peers while
// forward and backward run; before the optimizer step the averaged weights replace the local
// ones, so x_{t+1} = avg(x_t) - lr * g(x_t). Gradients are not communicated.
//
// On a single node, hierarchical=true would leave one "node" to exchange with (Bagua #380:
// shift_one then fails with "odd number of ranks (1)"); we exchange among the node's ranks
// instead, which for "all" is the same average and for shift_one is what users meant.
class Decentralized final : public core::Algorithm {
 public:
  explicit Decentralized(bool hierarchical = true, PeerSelection mode = PeerSelection::kAll,
                         int communicationInterval = 1)
      : hierarchical_(hierarchical), mode_(mode), interval_(communicationInterval) {}
  std::string name() const override { return "decentralized"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  // shift_one's peer of `rank` among `n` (even) ranks at communication step `step` (0-based,
  // counting communications only): Bagua's formula.
  static int shiftOnePeer(int rank, int n, int64_t step);

 private:
  bool hierarchical_;
  PeerSelection mode_;
  int interval_;
};

// Low-precision decentralized SGD (ring neighbours, compressed differences): after the local
// optimizer step, x <- w + D(C(x + l/3 + r/3 - 5w/3)), exchanging the compressed difference with
// both ring neighbours, who add it to their copy of my replica. Blocking (no overlap).
class LowPrecisionDecentralized final : public core::Algorithm {
 public:
  explicit LowPrecisionDecentralized(bool hierarchical = true, int communicationInterval = 1)
      : hierarchical_(hierarchical), interval_(communicationInterval) {}
  std::string name() const override { return "low_precision_decentralized"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  // The replicas of the live implementation, flattened bucket after bucket: my own (w), my left
  // neighbour's (l) and my right neighbour's (r). For tests and debugging; FailedPrecondition
  // before the first forward. Call between iterations.
  struct Replicas {
    std::vector<float> self;
    std::vector<float> left;
    std::vector<float> right;
  };
  Result<Replicas> replicas();

 private:
  friend class LowPrecisionDecentralizedImpl;
  bool hierarchical_;
  int interval_;
  std::mutex mu_;
  class LowPrecisionDecentralizedImpl* live_ = nullptr;
};

// QAdam: Adam during warm-up (gradients all-reduced in full precision), then the momentum is
// updated with the local gradient and averaged with ByteGrad's compression, with v frozen.
// The optimizer must be the one stepping the model (qadam.h).
class QAdam final : public core::Algorithm {
 public:
  explicit QAdam(QAdamOptimizer* optimizer, bool hierarchical = true)
      : optimizer_(optimizer), hierarchical_(hierarchical) {}
  std::string name() const override { return "qadam"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

 private:
  QAdamOptimizer* optimizer_;
  bool hierarchical_;
};

// Asynchronous model average: after warm-up (full-precision gradient all-reduce), a background
// thread on its own process group averages the weights every sync_interval_ms while training
// goes on; forward, backward and the optimizer step run under the weight lock (see README).
//
// abort() stops the averaging on every rank in the same round (call it on every rank after
// training); resume() starts it again. Both are collective (a barrier on the training group)
// and called from the trainer's thread between iterations. Destroying the reducer without
// abort() never hangs: the loop is stopped, and if a peer keeps it blocked, its group is
// aborted after a bounded wait.
class AsyncModelAverage final : public core::Algorithm {
 public:
  explicit AsyncModelAverage(int syncIntervalMs = 500, int warmupSteps = 0)
      : syncIntervalMs_(syncIntervalMs), warmupSteps_(warmupSteps) {}
  ~AsyncModelAverage() override;
  std::string name() const override { return "async"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup& group) override;

  [[nodiscard]] Status abort();
  [[nodiscard]] Status resume();
  // Averaging rounds completed by the live implementation (tests, logs).
  int64_t rounds();

 private:
  friend class AsyncImpl;
  int syncIntervalMs_;
  int warmupSteps_;
  bool mainStage_ = false;
  std::mutex mu_;
  class AsyncImpl* live_ = nullptr;
};

// Key/value parameters as in Algorithm.init(name, **kwargs): values parsed strictly
// ("true"/"false"/"1"/"0", integers, enum names); unknown keys are an error listing the keys the
// algorithm accepts.
using AlgorithmArgs = std::map<std::string, std::string>;

// Builds an algorithm by name. `qadam` needs `qadamOptimizer` (it steps the model).
Result<std::shared_ptr<core::Algorithm>> createAlgorithm(const std::string& name,
                                                         const AlgorithmArgs& args = {},
                                                         QAdamOptimizer* qadamOptimizer = nullptr);
// The names createAlgorithm accepts, in the order above.
std::vector<std::string> algorithmNames();

}  // namespace bagua::algo
