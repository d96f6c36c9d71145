// bagua-cpp-trainer: a trainer outside the bagua tree, built against the installed SDK only
// (pkg-config with meson.build, find_package(bagua) with CMakeLists.txt). Data-parallel training
// of the SDK's example MLP on generated data, over the host backend, under baguarun:
//
//   baguarun --nproc_per_node 2 -- ./bagua-cpp-trainer [--steps N] [--algorithm NAME]
//
// Every rank starts from different weights (the first step broadcasts rank 0's) and draws its own
// samples. Whatever the algorithm, the loss must go down and the ranks' averaged model must do
// well on held-out samples. The algorithms that keep replicas identical (gradient_allreduce,
// bytegrad, qadam, powersgd, auto) must also end with the same weights on every rank; the
// decentralized ones and async do not promise that (each rank keeps its own weights). qadam runs
// with the QAdam optimizer it needs, every other algorithm with SGD. Exit status: 0 when those
// checks pass, 1 otherwise (the reason on stderr), 2 for a bad argument.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <bagua/algorithms/algorithms.h>
#include <bagua/algorithms/qadam.h>
#include <bagua/base/status.h>
#include <bagua/core/ddp.h>
#include <bagua/core/parameter.h>
#include <bagua/core/process_group.h>

#include "example_mlp.h"

namespace {

using namespace bagua;

struct Options {
  int steps = 120;
  int batch = 32;
  std::string algorithm = "gradient_allreduce";
};

// Algorithms that average the weights rather than the gradients: replicas may differ.
bool replicasMayDiffer(const std::string& algorithm) {
  return algorithm == "decentralized" || algorithm == "low_precision_decentralized" ||
         algorithm == "async";
}

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
  example::MlpConfig mc;
  mc.sizes = {16, 32, 4};
  mc.seed = 7 + static_cast<uint64_t>(rank);  // different on every rank: the broadcast fixes it
  example::Mlp model(mc);
  // qadam steps the model with its own optimizer (Adam during warm-up); the others with SGD.
  std::unique_ptr<core::Optimizer> optimizer;
  algo::QAdamOptimizer* qadam = nullptr;
  if (o.algorithm == "qadam") {
    algo::QAdamOptions qo;
    qo.lr = 0.01f;
    qo.warmupSteps = o.steps / 5;
    BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<algo::QAdamOptimizer> q,
                           algo::QAdamOptimizer::create(model.parameters(), qo));
    qadam = q.get();
    optimizer = std::move(q);
  } else {
    optimizer = std::make_unique<core::Sgd>(model.parameters(), 0.05f, 0.9f);
  }
  BAGUA_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm,
                         algo::createAlgorithm(o.algorithm, {}, qadam));
  BAGUA_ASSIGN_OR_RETURN(auto ddp, core::withBagua(model.parameters(), model.buffers(),
                                                   {optimizer.get()}, algorithm, *pg));
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(rank));
  std::vector<float> x;
  std::vector<int32_t> y;
  double first = 0, last = 0;
  const int window = o.steps / 5;
  for (int step = 0; step < o.steps; ++step) {
    optimizer->zeroGrad();
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
  // async averages on a thread of its own: stop it (on every rank) before reading the weights.
  if (auto async = std::dynamic_pointer_cast<algo::AsyncModelAverage>(algorithm)) {
    BAGUA_RETURN_IF_ERROR(async->abort());
  }
  // How many weights differ between ranks (the element-wise max and min over ranks), and the
  // ranks' average.
  std::vector<float> mine;
  for (const core::Parameter& p : model.parameters()) {
    const float* d = static_cast<const float*>(p.data);
    mine.insert(mine.end(), d, d + p.numel);
  }
  std::vector<float> hi(mine.size()), lo(mine.size()), avg(mine.size());
  core::Communicator& comm = pg->global();
  for (auto [out, op] : {std::pair{&hi, core::ReduceOp::kMax}, std::pair{&lo, core::ReduceOp::kMin},
                         std::pair{&avg, core::ReduceOp::kAvg}}) {
    BAGUA_RETURN_IF_ERROR(
        comm.allReduce(mine.data(), out->data(), mine.size(), core::DataType::kF32, op)
            ->wait(std::chrono::seconds(60)));
  }
  size_t differ = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    differ += hi[i] != lo[i] ? 1 : 0;
  }
  // The averaged model's loss on samples no rank trained on (the same on every rank).
  size_t at = 0;
  for (core::Parameter& p : model.parameters()) {
    std::copy_n(avg.data() + at, p.numel, static_cast<float*>(p.data));
    at += p.numel;
  }
  std::mt19937_64 heldOut(99);
  makeBatch(heldOut, 256, mc.sizes[0], &x, &y);
  const float averaged = model.forward(x.data(), y.data(), 256);
  const bool mayDiffer = replicasMayDiffer(o.algorithm);
  std::printf(
      "bagua-cpp-trainer: rank %d/%d, %s, loss %.4f -> %.4f over %d steps, averaged model %.4f, "
      "%zu weights, %zu differ between ranks (%s)\n",
      rank, pg->size(), o.algorithm.c_str(), first, last, o.steps, averaged, mine.size(), differ,
      mayDiffer ? "allowed" : "must be 0");
  if (differ != 0 && !mayDiffer) {
    return BAGUA_ERROR(kInternal, "%zu of %zu weights differ between ranks", differ, mine.size());
  }
  if (!(last < 0.7 * first) || !(averaged < 0.7 * first)) {
    return BAGUA_ERROR(kInternal, "the loss did not go down enough: %.4f -> %.4f (averaged %.4f)",
                       first, last, averaged);
  }
  return Status::ok();
}

}  // namespace

// The bagua SDK version this was built against (pkg-config's or CMake's package version).
#ifndef BAGUA_SDK_VERSION
#define BAGUA_SDK_VERSION "unknown"
#endif

namespace {

// A usage error: one line on stderr, exit status 2 (the convention of bagua's tools).
int usageError(const std::string& what) {
  std::fprintf(stderr, "bagua-cpp-trainer: %s (see bagua-cpp-trainer --help)\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const char* usage =
      "Usage: bagua-cpp-trainer [--steps N] [--algorithm NAME]\n"
      "Trains a small MLP data-parallel under baguarun, e.g.\n"
      "  baguarun --nproc_per_node 2 -- bagua-cpp-trainer --algorithm bytegrad\n"
      "  --steps N         training steps, at least 10 (default 120)\n"
      "  --algorithm NAME  one of: %s (default gradient_allreduce)\n"
      "  --help            this text\n"
      "  --version         the bagua SDK version it was built against\n";
  const std::vector<std::string> known = algo::algorithmNames();
  std::string names;
  for (const std::string& n : known) {
    names += (names.empty() ? "" : ", ") + n;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(usage, names.c_str());
      return 0;
    }
    if (arg == "--version") {
      std::printf("bagua-cpp-trainer %s\n", BAGUA_SDK_VERSION);
      return 0;
    }
    if (arg != "--steps" && arg != "--algorithm") {
      return usageError("unknown option " + arg);
    }
    if (i + 1 >= argc) {
      return usageError(arg + " needs a value");
    }
    const std::string value = argv[++i];
    if (arg == "--algorithm") {
      o.algorithm = value;
      continue;
    }
    char* end = nullptr;
    errno = 0;
    const long steps = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0 || steps > 1000000000L) {
      return usageError("--steps: '" + value + "' is not an integer up to 1000000000");
    }
    o.steps = static_cast<int>(steps);
  }
  if (std::find(known.begin(), known.end(), o.algorithm) == known.end()) {
    return usageError("unknown --algorithm " + o.algorithm + " (one of: " + names + ")");
  }
  if (o.steps < 10) {
    return usageError("--steps must be at least 10, got " + std::to_string(o.steps));
  }
  Status s = train(o);
  if (!s.isOk()) {
    std::fprintf(stderr, "bagua-cpp-trainer: %s\n", s.toString().c_str());
    return 1;
  }
  return 0;
}
