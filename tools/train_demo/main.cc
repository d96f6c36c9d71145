// bagua-train-demo: the main job. Data-parallel training of a real MLP (hand-written forward and
// backward, bagua::example::Mlp) on generated data, through the reducer and the host
// backend. Launch it with baguarun (env:// initialisation):
//
//   baguarun --nproc_per_node 4 --master_port 0 bagua-train-demo [options]
//
// --algorithm NAME picks any of the algorithms library's algorithms by name (createAlgorithm),
// with --algo_arg key=value for its parameters, as Lightning's BaguaStrategy(algorithm=...) does.
//
// Rank 0 draws a progress bar with the global loss, accuracy and samples/s; at the end every rank
// reports the bytes it sent and received. The exit status is 1 if the loss did not go down.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "bagua/demo_support/demo_support.h"
#include "example_mlp.h"

namespace {

using namespace bagua;
using namespace bagua::core;

using Args = demo::DemoOptions;

// The task: a fixed random "teacher" network labels gaussian inputs; every rank draws its own
// samples (rank-dependent stream), like a sharded dataset.
class Task {
 public:
  Task(int features, int classes) : features_(features), classes_(classes) {
    std::mt19937 rng(12345);
    std::normal_distribution<float> d(0.0f, 1.0f);
    hidden_ = 32;
    w1_.resize(static_cast<size_t>(features) * hidden_);
    w2_.resize(static_cast<size_t>(hidden_) * classes);
    for (float& v : w1_)
      v = d(rng);
    for (float& v : w2_)
      v = d(rng);
  }
  void batch(uint64_t stream, int n, std::vector<float>* x, std::vector<int32_t>* y) {
    std::mt19937_64 rng(stream);
    std::normal_distribution<float> d(0.0f, 1.0f);
    x->resize(static_cast<size_t>(n) * features_);
    y->resize(n);
    std::vector<float> h(hidden_);
    for (int b = 0; b < n; ++b) {
      float* xb = x->data() + static_cast<size_t>(b) * features_;
      for (int i = 0; i < features_; ++i)
        xb[i] = d(rng);
      for (int j = 0; j < hidden_; ++j) {
        float s = 0;
        for (int i = 0; i < features_; ++i)
          s += xb[i] * w1_[static_cast<size_t>(i) * hidden_ + j];
        h[j] = std::tanh(s / 4.0f);
      }
      int best = 0;
      float bestScore = -1e30f;
      for (int c = 0; c < classes_; ++c) {
        float s = 0;
        for (int j = 0; j < hidden_; ++j)
          s += h[j] * w2_[static_cast<size_t>(j) * classes_ + c];
        if (s > bestScore) {
          bestScore = s;
          best = c;
        }
      }
      (*y)[b] = best;
    }
  }

 private:
  int features_;
  int classes_;
  int hidden_;
  std::vector<float> w1_;
  std::vector<float> w2_;
};

Status run(const Args& a) {
  const algo::AlgorithmArgs algoArgs = demo::algorithmArgs(a);
  BAGUA_RETURN_IF_ERROR(demo::checkAlgorithm(a.algorithm, algoArgs));
  ProcessGroupOptions po;
  po.hierarchical = a.hierarchical ||
                    (algoArgs.count("hierarchical") != 0 &&
                     algoArgs.at("hierarchical") != "false" && algoArgs.at("hierarchical") != "0");
  po.name = "train_demo";
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg, ProcessGroup::initFromEnv(po));
  const int rank = pg->rank();
  const int world = pg->size();
  setLogRank(rank);

  example::MlpConfig mc;
  mc.sizes = {a.features, a.hidden, a.hidden, a.classes};
  mc.seed = 1000 + static_cast<uint64_t>(rank);  // differs per rank: the initial broadcast fixes it
  example::Mlp model(mc);
  // QAdam steps the model itself; every other algorithm trains with SGD + momentum.
  BAGUA_ASSIGN_OR_RETURN(demo::Training t, demo::makeTraining(model.parameters(), a, algoArgs));
  BAGUA_ASSIGN_OR_RETURN(auto ddp, withBagua(model.parameters(), model.buffers(),
                                             {t.optimizer.get()}, t.algorithm, *pg, t.ddp));
  if (rank == 0) {
    std::printf(
        "bagua-train-demo: %d ranks, host backend, algorithm %s; MLP %d-%d-%d-%d (%zu params, "
        "%s of gradients per step) in %zu bucket(s); batch %d per rank\n",
        world, a.algorithm.c_str(), a.features, a.hidden, a.hidden, a.classes, model.numParams(),
        demo::humanBytes(static_cast<double>(model.numParams()) * 4).c_str(), ddp->buckets().size(),
        a.batch);
  }
  Task task(a.features, a.classes);
  std::vector<float> x;
  std::vector<int32_t> y;
  demo::RunReport report(*pg, a.steps, a.batch);
  for (int step = 1; step <= a.steps; ++step) {
    t.optimizer->zeroGrad();
    BAGUA_RETURN_IF_ERROR(ddp->prepareForward());
    task.batch(static_cast<uint64_t>(step) * 1000003u + static_cast<uint64_t>(rank), a.batch, &x,
               &y);
    float loss = model.forward(x.data(), y.data(), a.batch);
    Status ready;
    model.backward([&](int p) {
      if (ready.isOk()) {
        ready = ddp->markGradReady(p);
      }
    });
    BAGUA_RETURN_IF_ERROR(ready);
    BAGUA_RETURN_IF_ERROR(ddp->finishBackward());
    BAGUA_RETURN_IF_ERROR(ddp->step());
    BAGUA_RETURN_IF_ERROR(report.step(step, loss, model.correct(), a.batch));
  }
  return report.finish(*t.algorithm);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Data-parallel training of an MLP on generated data (host backend), under baguarun (env://); "
      "the exit status is 1 if the loss did not go down.",
      "bagua-train-demo"};
  bagua::cli::configure(app);
  demo::addDemoOptions(app, &a);
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  return demo::exitStatus("bagua-train-demo", run(a));
}
