#include "bagua/demo_support/demo_support.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "bagua/algorithms/algorithms.h"

namespace bagua::demo {

std::string humanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return strPrintf("%.1f %s", bytes, units[u]);
}

void drawProgressBar(int step, int steps, double loss, double accuracy, double samplesPerS,
                     bool tty) {
  const int width = 30;
  int filled = static_cast<int>(static_cast<double>(step) / steps * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  std::fprintf(stdout, "%s[%s] step %4d/%d  loss %.4f  acc %5.1f%%  %8.0f samples/s%s",
               tty ? "\r" : "", bar.c_str(), step, steps, loss, accuracy * 100, samplesPerS,
               tty ? "" : "\n");
  std::fflush(stdout);
}

Status stopAsyncAveraging(core::Algorithm& algorithm) {
  if (auto* am = dynamic_cast<algo::AsyncModelAverage*>(&algorithm)) {
    return am->abort();
  }
  return Status::ok();
}

Status finishRun(core::ProcessGroup& pg, const RunSummary& run) {
  const int rank = pg.rank();
  const int world = pg.size();
  if (rank == 0 && run.tty) {
    std::printf("\n");
  }
  const core::CommStats s = pg.stats();
  int64_t mine[3] = {static_cast<int64_t>(s.bytesSent), static_cast<int64_t>(s.bytesReceived),
                     static_cast<int64_t>(s.operations)};
  std::vector<int64_t> all(static_cast<size_t>(3) * world);
  BAGUA_RETURN_IF_ERROR(pg.global()
                            .allGather(mine, all.data(), 3, core::DataType::kI64)
                            ->wait(pg.options().collectiveTimeout));
  if (rank == 0) {
    const double secs = run.seconds;
    std::printf("trained %d steps in %.2f s: %.0f samples/s over %d ranks (%.1f steps/s)\n",
                run.steps, secs, run.steps * run.batch * world / secs, world, run.steps / secs);
    std::printf("global loss %.4f -> %.4f, accuracy %.1f%%\n", run.firstLoss, run.lastLoss,
                run.lastAccuracy * 100);
    std::printf("  rank   bytes sent   bytes received   operations   sent/step\n");
    for (int r = 0; r < world; ++r) {
      std::printf("  %4d   %10s   %14s   %10lld   %9s\n", r,
                  humanBytes(static_cast<double>(all[3 * r])).c_str(),
                  humanBytes(static_cast<double>(all[3 * r + 1])).c_str(),
                  static_cast<long long>(all[3 * r + 2]),
                  humanBytes(static_cast<double>(all[3 * r]) / run.steps).c_str());
    }
  }
  BAGUA_RETURN_IF_ERROR(pg.global().barrier()->wait(pg.options().collectiveTimeout));
  if (!(run.lastLoss < run.firstLoss)) {
    return BAGUA_ERROR(kInternal, "the loss did not go down (%.4f -> %.4f)", run.firstLoss,
                       run.lastLoss);
  }
  return Status::ok();
}

}  // namespace bagua::demo
