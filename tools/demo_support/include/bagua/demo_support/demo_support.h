// What the training demos (bagua-train-demo, bagua-torch-demo) share: their common options, the
// algorithm and optimizer that --algorithm picks, the progress bar, byte formatting, the run's
// progress report and its end (traffic of every rank, summary lines, the loss check), and the
// exit status.
//
// Thread safety: call from the trainer's thread. finishRun and stopAsyncAveraging are
// collective: every rank of the group calls them, in the same order.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"
#include "bagua/core/ddp.h"
#include "bagua/core/parameter.h"

namespace CLI {
class App;
}
#include "bagua/core/process_group.h"

namespace bagua::demo {

// The options both demos take (each parses its own command line; a demo may change a default,
// e.g. its model size).
struct DemoOptions {
  int steps = 200;
  int batch = 64;  // per rank
  int hidden = 512;
  int features = 64;
  int classes = 10;
  float lr = 0.05f;  // SGD's; QAdam's default (1e-3) unless --lr is given
  bool lrGiven = false;
  float momentum = 0.9f;
  double bucketCapMb = 25.0;
  bool hierarchical = false;
  bool viewGrads = true;  // DDP's gradient_as_bucket_view
  std::string algorithm = "gradient_allreduce";
  algo::AlgorithmArgs algoArgs;  // --algo_arg key=value
};

// Adds the options above to a tool's command line (tools/cli_support conventions), writing into
// `o`: --steps, --batch, --hidden, --lr, --momentum, --bucket_cap_mb, --hierarchical,
// --no_grad_view, --algorithm NAME (one of algo::algorithmNames(), checked when parsed),
// --algo_arg KEY=VALUE (repeatable). `o` must outlive the parse.
void addDemoOptions(CLI::App& app, DemoOptions* o);

// The algorithm's parameters: --algo_arg values, plus hierarchical=<--hierarchical> for the
// algorithms that take it (the demos default to flat, unlike Bagua's ByteGrad and decentralized
// defaults, so they run on any process group).
algo::AlgorithmArgs algorithmArgs(const DemoOptions& o);

// Checks the algorithm's name and parameters before anything connects (qadam's with a QAdam
// optimizer over no parameters, as its real optimizer needs the model). createAlgorithm's error.
[[nodiscard]] Status checkAlgorithm(const std::string& name, const algo::AlgorithmArgs& args);

// What a demo trains with. qadam: a QAdamOptimizer (learning rate QAdam's default unless --lr
// was given, since Adam at SGD's 0.05 diverges within the warm-up; warm-up a fifth of the run),
// which the algorithm steps the model with; every other algorithm: SGD with momentum.
// `params` is borrowed by the optimizer for its lifetime.
struct Training {
  std::unique_ptr<core::Optimizer> optimizer;
  std::shared_ptr<core::Algorithm> algorithm;
  core::DdpOptions ddp;  // bucket cap and gradient-as-bucket-view from the options
};
[[nodiscard]] Result<Training> makeTraining(std::vector<core::Parameter>& params,
                                            const DemoOptions& o, const algo::AlgorithmArgs& args);

// "12.3 MiB": one decimal, binary units up to TiB.
std::string humanBytes(double bytes);

// Rank 0's progress line: bar, step, global loss and accuracy, samples/s. On a terminal the line
// is redrawn in place (\r), otherwise printed one per call.
void drawProgressBar(int step, int steps, double loss, double accuracy, double samplesPerS,
                     bool tty);

// Stops the background averaging of the async algorithm on every rank in the same round; a
// no-op for the other algorithms.
[[nodiscard]] Status stopAsyncAveraging(core::Algorithm& algorithm);

struct RunSummary {
  int steps = 0;
  int batch = 0;  // samples per rank and step
  double seconds = 0;
  double firstLoss = 0;  // global mean loss of the first report
  double lastLoss = 0;   // and of the last
  double lastAccuracy = 0;
  bool tty = false;  // stdout is a terminal (the progress bar needs its line ended)
};

// A demo run's progress and its end, kept the same way by both demos. Construct it right before
// the training loop (it starts the clock); after every optimizer step, on every rank, call step()
// with that step's loss and accuracy; after the loop, finish().
//
// Every `reportEvery` steps (1/100 of the run on a terminal, 1/10 otherwise), the first and the
// last step, step() is collective: every rank averages the loss and accuracy since the last
// report over the group (one all-reduce of two doubles, bounded by the group's collective
// timeout) and rank 0 redraws the progress bar. Not thread-safe: the trainer's thread only.
class RunReport {
 public:
  RunReport(core::ProcessGroup& pg, int steps, int batch);
  RunReport(const RunReport&) = delete;
  RunReport& operator=(const RunReport&) = delete;

  // Step `step` (1-based) had mean loss `loss` and got `correct` of `samples` right (a fraction
  // of one sample works too: correct 0.75 of samples 1). Communication errors as they come.
  [[nodiscard]] Status step(int step, double loss, double correct, double samples);
  // The end of the run, on every rank, after the last step: stops the clock, then the async
  // algorithm's averaging (stopAsyncAveraging), then finishRun. Collective.
  [[nodiscard]] Status finish(core::Algorithm& algorithm);

 private:
  core::ProcessGroup& pg_;
  int steps_;
  int batch_;
  bool tty_;
  int reportEvery_;
  std::chrono::steady_clock::time_point start_;
  double lossSum_ = 0;  // since the last report
  double correctSum_ = 0;
  double samplesSum_ = 0;
  int windowSteps_ = 0;
  double firstLoss_ = -1;  // global mean loss of the first report (-1: none yet)
  double lastLoss_ = 0;
  double lastAccuracy_ = 0;
};

// A demo's exit status for what run() returned: 0, or 1 after "<tool>: <error>" on stderr.
int exitStatus(const char* tool, const Status& status);

// The end of a run, on every rank: gathers every rank's traffic (CommStats) on every rank, rank 0
// prints the throughput, the loss and accuracy, and a bytes table per rank; then a barrier.
// InternalError if the loss did not go down; communication errors as they come.
[[nodiscard]] Status finishRun(core::ProcessGroup& pg, const RunSummary& run);

}  // namespace bagua::demo
