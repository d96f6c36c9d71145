#include "bagua/demo_support/demo_support.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bagua/algorithms/qadam.h"
#include "bagua/cli_support/cli.h"

namespace bagua::demo {

void addDemoOptions(CLI::App& app, DemoOptions* o) {
  using bagua::cli::flagNames;
  app.add_option("--steps", o->steps, "training steps")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  app.add_option("--batch", o->batch, "samples per rank and step")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--hidden", o->hidden, "width of the hidden layers")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--lr", o->lr, "learning rate (SGD's; with qadam, QAdam's, default 1e-3)")
      ->check(CLI::Range(0.0, 100.0))
      ->each([o](const std::string&) { o->lrGiven = true; })
      ->capture_default_str();
  app.add_option("--momentum", o->momentum, "SGD's momentum")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option(flagNames("bucket_cap_mb"), o->bucketCapMb, "DDP's bucket cap in MiB")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  app.add_flag(flagNames("hierarchical"), o->hierarchical,
               "hierarchical=true for the algorithms that take it (default false)");
  app.add_flag_callback(
      flagNames("no_grad_view"), [o] { o->viewGrads = false; },
      "gradients are not views into the buckets (DDP's "
      "gradient_as_bucket_view=False)");
  std::string names;
  for (const std::string& n : algo::algorithmNames()) {
    names += (names.empty() ? "" : ", ") + n;
  }
  app.add_option("--algorithm", o->algorithm, "the algorithm, one of: " + names)
      ->check(CLI::IsMember(algo::algorithmNames()))
      ->capture_default_str();
  app.add_option_function<std::vector<std::string>>(
         flagNames("algo_arg"),
         [o](const std::vector<std::string>& kvs) {
           for (const std::string& kv : kvs) {
             const size_t eq = kv.find('=');
             o->algoArgs[kv.substr(0, eq)] = kv.substr(eq + 1);
           }
         },
         "an algorithm parameter, e.g. peer_selection_mode=shift_one (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Validator(
          [](std::string& kv) {
            const size_t eq = kv.find('=');
            return eq == std::string::npos || eq == 0 ? "wants KEY=VALUE, got '" + kv + "'"
                                                      : std::string();
          },
          "KEY=VALUE"));
}

algo::AlgorithmArgs algorithmArgs(const DemoOptions& o) {
  algo::AlgorithmArgs args = o.algoArgs;
  // async has no hierarchical mode; auto sets it on what it chooses.
  if (o.algorithm != "async" && o.algorithm != "auto" && args.count("hierarchical") == 0) {
    args["hierarchical"] = o.hierarchical ? "true" : "false";
  }
  return args;
}

Status checkAlgorithm(const std::string& name, const algo::AlgorithmArgs& args) {
  std::vector<core::Parameter> none;
  std::unique_ptr<algo::QAdamOptimizer> probe;
  if (name == "qadam") {
    BAGUA_ASSIGN_OR_RETURN(probe, algo::QAdamOptimizer::create(none));
  }
  return algo::createAlgorithm(name, args, probe.get()).status();
}

Result<Training> makeTraining(std::vector<core::Parameter>& params, const DemoOptions& o,
                              const algo::AlgorithmArgs& args) {
  Training t;
  algo::QAdamOptimizer* qadam = nullptr;
  if (o.algorithm == "qadam") {
    algo::QAdamOptions qo;
    qo.lr = o.lrGiven ? o.lr : algo::QAdamOptions{}.lr;
    qo.warmupSteps = std::max(1, o.steps / 5);
    BAGUA_ASSIGN_OR_RETURN(auto q, algo::QAdamOptimizer::create(params, qo));
    qadam = q.get();
    t.optimizer = std::move(q);
  } else {
    t.optimizer = std::make_unique<core::Sgd>(params, o.lr, o.momentum);
  }
  BAGUA_ASSIGN_OR_RETURN(t.algorithm, algo::createAlgorithm(o.algorithm, args, qadam));
  t.ddp.bucketCapMb = o.bucketCapMb;
  t.ddp.gradientAsBucketView = o.viewGrads;
  return t;
}

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

RunReport::RunReport(core::ProcessGroup& pg, int steps, int batch)
    : pg_(pg),
      steps_(steps),
      batch_(batch),
      tty_(::isatty(1) != 0),
      reportEvery_(std::max(1, steps / (tty_ ? 100 : 10))),
      start_(std::chrono::steady_clock::now()) {}

Status RunReport::step(int step, double loss, double correct, double samples) {
  lossSum_ += loss;
  correctSum_ += correct;
  samplesSum_ += samples;
  ++windowSteps_;
  if (step % reportEvery_ != 0 && step != steps_ && step != 1) {
    return Status::ok();
  }
  // Global mean loss and accuracy over the window (every rank joins this all-reduce).
  double g[2] = {lossSum_ / windowSteps_, correctSum_ / samplesSum_};
  BAGUA_RETURN_IF_ERROR(pg_.global()
                            .allReduce(g, g, 2, core::DataType::kF64, core::ReduceOp::kAvg)
                            ->wait(pg_.options().collectiveTimeout));
  lossSum_ = correctSum_ = samplesSum_ = 0;
  windowSteps_ = 0;
  if (firstLoss_ < 0) {
    firstLoss_ = g[0];
  }
  lastLoss_ = g[0];
  lastAccuracy_ = g[1];
  if (pg_.rank() == 0) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    drawProgressBar(step, steps_, lastLoss_, lastAccuracy_,
                    secs > 0 ? static_cast<double>(step) * batch_ * pg_.size() / secs : 0.0, tty_);
  }
  return Status::ok();
}

Status RunReport::finish(core::Algorithm& algorithm) {
  RunSummary s;
  s.steps = steps_;
  s.batch = batch_;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  s.firstLoss = firstLoss_;
  s.lastLoss = lastLoss_;
  s.lastAccuracy = lastAccuracy_;
  s.tty = tty_;
  BAGUA_RETURN_IF_ERROR(stopAsyncAveraging(algorithm));
  return finishRun(pg_, s);
}

int exitStatus(const char* tool, const Status& status) {
  if (status.isOk()) {
    return 0;
  }
  std::fprintf(stderr, "%s: %s\n", tool, status.toString().c_str());
  return 1;
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
