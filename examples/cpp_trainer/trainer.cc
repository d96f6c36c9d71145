// bagua-cpp-trainer: a trainer outside the bagua tree, built against the installed SDK only
// (pkg-config with meson.build, find_package(bagua) with CMakeLists.txt). Data-parallel training
// of the SDK's example MLP on generated data, over the host backend, under baguarun:
//
//   baguarun --nproc_per_node 2 -- ./bagua-cpp-trainer [--steps N] [--algorithm NAME]
//
// Every rank starts from different weights (the first step broadcasts rank 0's), draws its own
// samples and must end with the same weights as every other rank. Exit status: 0 when the loss
// went down and the ranks agree, 1 otherwise (the reason on stderr), 2 for a bad argument.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <bagua/algorithms/algorithms.h>
#include <bagua/base/status.h>
#include <bagua/core/ddp.h>
#include <bagua/core/example_mlp.h>
#include <bagua/core/parameter.h>
#include <bagua/core/process_group.h>

namespace {

using namespace bagua;

struct Options {
  int steps = 120;
  int batch = 32;
  std::string algorithm = "gradient_allreduce";
};

// Labels from a fixed "teacher": the nearest of four centres, so the task is learnable.
void makeBatch(std::mt19937_64& rng, int batch, int features, std::vector<float>* x,
               std::vector<int32_t>* y) {
  std::normal_distribution<float> noise(0.0f, 1.0f);
  x->resize(static_cast<size_t>(batch) * features);
  y->resize(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    const int label = static_cast<int>(rng() % 4);
    for (int i = 0; i < features; ++i) {
      const float centre = (i % 4 == label) ? 2.0f : 0.0f;
      (*x)[static_cast<size_t>(b) * features + i] = centre + 0.5f * noise(rng);
    }
    (*y)[static_cast<size_t>(b)] = label;
  }
}

Status train(const Options& o) {
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<core::ProcessGroup> pg, core::ProcessGroup::initFromEnv());
  const int rank = pg->rank();
  core::example::MlpConfig mc;
  mc.sizes = {16, 32, 4};
  mc.seed = 7 + static_cast<uint64_t>(rank);  // different on every rank: the broadcast fixes it
  core::example::Mlp model(mc);
  core::Sgd sgd(model.parameters(), 0.05f, 0.9f);
  BAGUA_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm,
                         algo::createAlgorithm(o.algorithm));
  BAGUA_ASSIGN_OR_RETURN(
      auto ddp, core::withBagua(model.parameters(), model.buffers(), {&sgd}, algorithm, *pg));
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(rank));
  std::vector<float> x;
  std::vector<int32_t> y;
  double first = 0, last = 0;
  const int window = o.steps / 5;
  for (int step = 0; step < o.steps; ++step) {
    sgd.zeroGrad();
    BAGUA_RETURN_IF_ERROR(ddp->prepareForward());
    makeBatch(rng, o.batch, mc.sizes[0], &x, &y);
    const float loss = model.forward(x.data(), y.data(), o.batch);
    Status ready;
    model.backward([&](int p) {
      if (ready.isOk()) {
        ready = ddp->markGradReady(p);
      }
    });
    BAGUA_RETURN_IF_ERROR(ready);
    BAGUA_RETURN_IF_ERROR(ddp->finishBackward());
    BAGUA_RETURN_IF_ERROR(ddp->step());
    if (step < window) {
      first += loss / window;
    } else if (step >= o.steps - window) {
      last += loss / window;
    }
  }
  // The ranks must hold the same weights: the element-wise max and min over ranks agree.
  std::vector<float> mine;
  for (const core::Parameter& p : model.parameters()) {
    const float* d = static_cast<const float*>(p.data);
    mine.insert(mine.end(), d, d + p.numel);
  }
  std::vector<float> hi(mine.size()), lo(mine.size());
  core::Communicator& comm = pg->global();
  BAGUA_RETURN_IF_ERROR(comm.allReduce(mine.data(), hi.data(), mine.size(), core::DataType::kF32,
                                       core::ReduceOp::kMax)
                            ->wait(std::chrono::seconds(60)));
  BAGUA_RETURN_IF_ERROR(comm.allReduce(mine.data(), lo.data(), mine.size(), core::DataType::kF32,
                                       core::ReduceOp::kMin)
                            ->wait(std::chrono::seconds(60)));
  size_t differ = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    differ += hi[i] != lo[i] ? 1 : 0;
  }
  std::printf(
      "bagua-cpp-trainer: rank %d/%d, %s, loss %.4f -> %.4f over %d steps, %zu weights, "
      "%zu differ between ranks\n",
      rank, pg->size(), o.algorithm.c_str(), first, last, o.steps, mine.size(), differ);
  if (differ != 0) {
    return BAGUA_ERROR(kInternal, "%zu of %zu weights differ between ranks", differ, mine.size());
  }
  if (!(last < 0.7 * first)) {
    return BAGUA_ERROR(kInternal, "the loss did not go down enough: %.4f -> %.4f", first, last);
  }
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const bool hasValue = i + 1 < argc;
    if (std::strcmp(argv[i], "--steps") == 0 && hasValue) {
      o.steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--algorithm") == 0 && hasValue) {
      o.algorithm = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bagua-cpp-trainer [--steps N (>= 10)] [--algorithm NAME]\n"
                   "  unknown or incomplete argument '%s'\n",
                   argv[i]);
      return 2;
    }
  }
  if (o.steps < 10) {
    std::fprintf(stderr, "bagua-cpp-trainer: --steps must be at least 10, got %d\n", o.steps);
    return 2;
  }
  Status s = train(o);
  if (!s.isOk()) {
    std::fprintf(stderr, "bagua-cpp-trainer: %s\n", s.toString().c_str());
    return 1;
  }
  return 0;
}
