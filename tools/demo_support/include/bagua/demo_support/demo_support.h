// What the training demos (bagua-train-demo, bagua-torch-demo) share: the progress bar, byte
// formatting and the end of a run (traffic of every rank, summary lines, the loss check).
//
// Thread safety: call from the trainer's thread. finishRun and stopAsyncAveraging are
// collective: every rank of the group calls them, in the same order.
#pragma once

#include <string>

#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"
#include "bagua/core/process_group.h"

namespace bagua::demo {

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

// The end of a run, on every rank: gathers every rank's traffic (CommStats) on every rank, rank 0
// prints the throughput, the loss and accuracy, and a bytes table per rank; then a barrier.
// InternalError if the loss did not go down; communication errors as they come.
[[nodiscard]] Status finishRun(core::ProcessGroup& pg, const RunSummary& run);

}  // namespace bagua::demo
