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

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "bagua/demo_support/demo_support.h"
#include "bagua/torch/module.h"

namespace {

using namespace bagua;
using namespace bagua::core;

// The demos' common options with this demo's smaller default model (32 inputs, hidden 256).
struct Args : demo::DemoOptions {
  Args() {
    hidden = 256;
    features = 32;
  }
};

Status run(const Args& a) {
  algo::AlgorithmArgs algoArgs = demo::algorithmArgs(a);
  BAGUA_RETURN_IF_ERROR(demo::checkAlgorithm(a.algorithm, algoArgs));
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
  BAGUA_ASSIGN_OR_RETURN(demo::Training t, demo::makeTraining(tm->parameters(), a, algoArgs));
  BAGUA_ASSIGN_OR_RETURN(auto ddp, withBagua(tm->parameters(), tm->buffers(), {t.optimizer.get()},
                                             t.algorithm, *pg, t.ddp));
  BAGUA_RETURN_IF_ERROR(tm->attach(*ddp));
  if (rank == 0) {
    std::printf(
        "bagua-torch-demo: %d ranks, host backend, algorithm %s; libtorch %s MLP %d-%d-%d-%d "
        "(%zu params, %s of gradients per step) in %zu bucket(s); batch %d per rank\n",
        world, a.algorithm.c_str(), TORCH_VERSION, a.features, a.hidden, a.hidden, a.classes,
        numParams, demo::humanBytes(static_cast<double>(numParams) * 4).c_str(),
        ddp->buckets().size(), a.batch);
  }
  demo::RunReport report(*pg, a.steps, a.batch);
  for (int step = 1; step <= a.steps; ++step) {
    torch::manual_seed(static_cast<uint64_t>(step) * 1000003u + static_cast<uint64_t>(rank));
    torch::Tensor x = torch::randn({a.batch, a.features});
    torch::Tensor y;
    {
      torch::NoGradGuard g;
      y = torch::tanh(x.matmul(t1) / 4).matmul(t2).argmax(1);
    }
    t.optimizer->zeroGrad();
    BAGUA_RETURN_IF_ERROR(ddp->prepareForward());
    torch::Tensor logits = net->forward(x);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    loss.backward();  // the hooks hand each gradient to the reducer as autograd finishes it
    BAGUA_RETURN_IF_ERROR(tm->takeHookStatus());
    BAGUA_RETURN_IF_ERROR(ddp->finishBackward());
    BAGUA_RETURN_IF_ERROR(ddp->step());
    BAGUA_RETURN_IF_ERROR(
        report.step(step, loss.item<double>(),
                    logits.argmax(1).eq(y).to(torch::kDouble).mean().item<double>(), 1.0));
  }
  Status finished = report.finish(*t.algorithm);
  tm->detach();
  return finished;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Data-parallel training of a libtorch MLP on generated data, under baguarun (env://); the "
      "exit status is 1 if the loss did not go down.",
      "bagua-torch-demo"};
  bagua::cli::configure(app);
  demo::addDemoOptions(app, &a);
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  return demo::exitStatus("bagua-torch-demo", run(a));
}
