// bagua-torch-demo: the main job with a libtorch model. Data-parallel training of a
// torch::nn::Sequential MLP on generated data (a fixed random teacher network labels gaussian
// inputs; every rank draws its own samples), its gradients reduced by bagua's
// DistributedDataParallel through autograd hooks (bagua::libtorch::TorchModule) over the host
// backend. Launch with baguarun (env:// initialisation):
//
//   baguarun --nproc_per_node 4 --master_port 0 bagua-torch-demo [--steps N] [--batch B]
//       [--hidden H] [--lr X] [--momentum X] [--bucket_cap_mb X] [--no_grad_view]
//       [--hierarchical] [--algorithm NAME] [--algo_arg key=value ...]
//
// --algorithm picks any algorithm of the algorithms library by name (createAlgorithm). Rank 0
// draws a progress bar with the global loss, accuracy and samples/s; at the end it prints the
// bytes every rank sent and received. Exit status 1 if the loss did not go down.
#include <unistd.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "bagua/demo_support/demo_support.h"
#include "bagua/torch/module.h"

namespace {

using namespace bagua;
using namespace bagua::core;
using Clock = std::chrono::steady_clock;

struct Args {
  int steps = 200;
  int batch = 64;  // per rank
  int hidden = 256;
  int features = 32;
  int classes = 10;
  float lr = 0.05f;  // SGD's; QAdam's default (1e-3) unless --lr is given
  bool lrGiven = false;
  float momentum = 0.9f;
  double bucketCapMb = 25.0;
  bool hierarchical = false;
  bool viewGrads = true;
  std::string algorithm = "gradient_allreduce";
  algo::AlgorithmArgs algoArgs;
};

void usage() {
  std::fprintf(stderr,
               "usage: bagua-torch-demo [--steps N] [--batch B] [--hidden H] [--lr X] "
               "[--momentum X]\n"
               "                        [--bucket_cap_mb X] [--hierarchical] [--no_grad_view]\n"
               "                        [--algorithm NAME] [--algo_arg key=value ...]\n");
  std::string names;
  for (const std::string& n : algo::algorithmNames()) {
    names += (names.empty() ? "" : ", ") + n;
  }
  std::fprintf(stderr, "algorithms: %s\n", names.c_str());
}

bool parseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bagua-torch-demo: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](double lo, double hi) -> double {
      const char* v = value();
      Result<double> d = parseDouble(v);
      if (!d.isOk() || *d < lo || *d > hi) {
        std::fprintf(stderr, "bagua-torch-demo: %s wants a number in [%g, %g], got '%s'\n",
                     k.c_str(), lo, hi, v);
        std::exit(2);
      }
      return *d;
    };
    if (k == "--steps") {
      a->steps = static_cast<int>(number(1, 1e7));
    } else if (k == "--batch") {
      a->batch = static_cast<int>(number(1, 1e6));
    } else if (k == "--hidden") {
      a->hidden = static_cast<int>(number(1, 1e5));
    } else if (k == "--lr") {
      a->lr = static_cast<float>(number(0, 100));
      a->lrGiven = true;
    } else if (k == "--momentum") {
      a->momentum = static_cast<float>(number(0, 1));
    } else if (k == "--bucket_cap_mb") {
      a->bucketCapMb = number(1e-6, 1e6);
    } else if (k == "--hierarchical") {
      a->hierarchical = true;
    } else if (k == "--no_grad_view") {
      a->viewGrads = false;
    } else if (k == "--algorithm") {
      a->algorithm = value();
    } else if (k == "--algo_arg") {
      std::string kv = value();
      size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "bagua-torch-demo: --algo_arg wants key=value, got '%s'\n",
                     kv.c_str());
        return false;
      }
      a->algoArgs[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (k == "-h" || k == "--help") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "bagua-torch-demo: unknown option %s\n", k.c_str());
      usage();
      return false;
    }
  }
  return true;
}

Status run(const Args& a) {
  algo::AlgorithmArgs algoArgs = a.algoArgs;
  if (a.algorithm != "async" && algoArgs.count("hierarchical") == 0) {
    algoArgs["hierarchical"] = a.hierarchical ? "true" : "false";
  }
  {
    // Check the name and parameters before anything connects.
    std::vector<Parameter> none;
    std::unique_ptr<algo::QAdamOptimizer> probe;
    if (a.algorithm == "qadam") {
      BAGUA_ASSIGN_OR_RETURN(probe, algo::QAdamOptimizer::create(none));
    }
    BAGUA_RETURN_IF_ERROR(algo::createAlgorithm(a.algorithm, algoArgs, probe.get()).status());
  }
  ProcessGroupOptions po;
  // async takes no "hierarchical" argument.
  const auto h = algoArgs.find("hierarchical");
  po.hierarchical = a.hierarchical || (h != algoArgs.end() && h->second == "true");
  po.name = "torch_demo";
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg, ProcessGroup::initFromEnv(po));
  const int rank = pg->rank();
  const int world = pg->size();
  setLogRank(rank);
  torch::set_num_threads(1);  // ranks share the cores

  // The teacher: the same on every rank.
  torch::manual_seed(12345);
  torch::Tensor t1 = torch::randn({a.features, 32});
  torch::Tensor t2 = torch::randn({32, a.classes});
  // The student: seeded per rank on purpose; DDP's initial broadcast makes all equal rank 0's.
  torch::manual_seed(1000 + static_cast<uint64_t>(rank));
  torch::nn::Sequential net(torch::nn::Linear(a.features, a.hidden), torch::nn::ReLU(),
                            torch::nn::Linear(a.hidden, a.hidden), torch::nn::ReLU(),
                            torch::nn::Linear(a.hidden, a.classes));
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<libtorch::TorchModule> tm,
                         libtorch::TorchModule::wrap(*net));
  size_t numParams = 0;
  for (const Parameter& p : tm->parameters()) {
    numParams += p.numel;
  }
  std::unique_ptr<Optimizer> opt;
  algo::QAdamOptimizer* qadam = nullptr;
  if (a.algorithm == "qadam") {
    algo::QAdamOptions qo;
    // Adam at SGD's 0.05 diverges within the warm-up: QAdam's own default unless --lr is given.
    qo.lr = a.lrGiven ? a.lr : algo::QAdamOptions{}.lr;
    qo.warmupSteps = std::max(1, a.steps / 5);
    BAGUA_ASSIGN_OR_RETURN(auto q, algo::QAdamOptimizer::create(tm->parameters(), qo));
    qadam = q.get();
    opt = std::move(q);
  } else {
    opt = std::make_unique<Sgd>(tm->parameters(), a.lr, a.momentum);
  }
  BAGUA_ASSIGN_OR_RETURN(std::shared_ptr<Algorithm> algorithm,
                         algo::createAlgorithm(a.algorithm, algoArgs, qadam));
  DdpOptions dopt;
  dopt.bucketCapMb = a.bucketCapMb;
  dopt.gradientAsBucketView = a.viewGrads;
  BAGUA_ASSIGN_OR_RETURN(
      auto ddp, withBagua(tm->parameters(), tm->buffers(), {opt.get()}, algorithm, *pg, dopt));
  BAGUA_RETURN_IF_ERROR(tm->attach(*ddp));
  const bool tty = ::isatty(1) != 0;
  if (rank == 0) {
    std::printf(
        "bagua-torch-demo: %d ranks, host backend, algorithm %s; libtorch %s MLP %d-%d-%d-%d "
        "(%zu params, %s of gradients per step) in %zu bucket(s); batch %d per rank\n",
        world, a.algorithm.c_str(), TORCH_VERSION, a.features, a.hidden, a.hidden, a.classes,
        numParams, demo::humanBytes(static_cast<double>(numParams) * 4).c_str(),
        ddp->buckets().size(), a.batch);
  }
  double firstLoss = -1;
  double lastLoss = 0;
  double lastAcc = 0;
  double window[2] = {0, 0};  // loss sum, accuracy sum since the last report
  int windowSteps = 0;
  const int reportEvery = std::max(1, a.steps / (tty ? 100 : 10));
  auto t0 = Clock::now();
  for (int step = 1; step <= a.steps; ++step) {
    torch::manual_seed(static_cast<uint64_t>(step) * 1000003u + static_cast<uint64_t>(rank));
    torch::Tensor x = torch::randn({a.batch, a.features});
    torch::Tensor y;
    {
      torch::NoGradGuard g;
      y = torch::tanh(x.matmul(t1) / 4).matmul(t2).argmax(1);
    }
    opt->zeroGrad();
    BAGUA_RETURN_IF_ERROR(ddp->prepareForward());
    torch::Tensor logits = net->forward(x);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    loss.backward();  // the hooks hand each gradient to the reducer as autograd finishes it
    BAGUA_RETURN_IF_ERROR(tm->takeHookStatus());
    BAGUA_RETURN_IF_ERROR(ddp->finishBackward());
    BAGUA_RETURN_IF_ERROR(ddp->step());
    window[0] += loss.item<double>();
    window[1] += logits.argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
    ++windowSteps;
    if (step % reportEvery == 0 || step == a.steps || step == 1) {
      double g[2] = {window[0] / windowSteps, window[1] / windowSteps};
      BAGUA_RETURN_IF_ERROR(pg->global()
                                .allReduce(g, g, 2, DataType::kF64, ReduceOp::kAvg)
                                ->wait(pg->options().collectiveTimeout));
      window[0] = window[1] = 0;
      windowSteps = 0;
      if (firstLoss < 0) {
        firstLoss = g[0];
      }
      lastLoss = g[0];
      lastAcc = g[1];
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rank == 0) {
        demo::drawProgressBar(step, a.steps, lastLoss, lastAcc,
                              secs > 0 ? static_cast<double>(step) * a.batch * world / secs : 0.0,
                              tty);
      }
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  BAGUA_RETURN_IF_ERROR(demo::stopAsyncAveraging(*algorithm));
  tm->detach();
  demo::RunSummary summary;
  summary.steps = a.steps;
  summary.batch = a.batch;
  summary.seconds = secs;
  summary.firstLoss = firstLoss;
  summary.lastLoss = lastLoss;
  summary.lastAccuracy = lastAcc;
  summary.tty = tty;
  return demo::finishRun(*pg, summary);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parseArgs(argc, argv, &a)) {
    return 2;
  }
  Status s = run(a);
  if (!s.isOk()) {
    std::fprintf(stderr, "bagua-torch-demo: %s\n", s.toString().c_str());
    return 1;
  }
  return 0;
}
