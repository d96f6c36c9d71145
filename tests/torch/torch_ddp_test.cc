// The libtorch integration: a libtorch model trained with DistributedDataParallel over the host
// backend (ranks as threads, in-memory store, loopback) ends with the same parameters as the same
// model trained in one process on the concatenated batch, to rounding; with and without
// gradient_as_bucket_view, with small buckets (several all-reduces overlapping backward), with
// the engine and the shared-memory transports. Also: the wrapper exposes torch's names, dtypes
// and storage, gradients accumulate in place, setGrad re-points .grad(), bad dtypes are refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "bagua/core/algorithm.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "bagua/torch/module.h"
#include "multi_rank.h"

namespace bagua::libtorch {
namespace {

using namespace std::chrono_literals;

#define RETURN_ERROR_TEXT(expr)   \
  do {                            \
    ::bagua::Status st_ = (expr); \
    if (!st_.isOk()) {            \
      return st_.toString();      \
    }                             \
  } while (0)

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 8));
    head = register_module("head", torch::nn::Linear(8, 3));
    register_buffer("scale", torch::full({3}, 1.0));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(fc1->forward(x));
    h = torch::relu(fc2->forward(h));
    return head->forward(h) * named_buffers()["scale"];
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

// Deterministic initial weights (no RNG: ranks are threads). `salt` lets ranks differ so the
// initial broadcast of rank 0's parameters is exercised.
void initNet(Net& net, int salt) {
  torch::NoGradGuard g;
  int k = 0;
  for (auto& p : net->parameters()) {
    auto flat = p.view({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      flat[i] = 0.3 * std::sin(0.7 * static_cast<double>(i) + 1.3 * k) + 0.01 * salt;
    }
    ++k;
  }
}

constexpr int kBatchPerRank = 5;
constexpr int kSteps = 6;
constexpr float kLr = 0.1f;

// Sample s of step t: closed-form inputs and targets.
torch::Tensor inputs(int step, int first, int n) {
  auto x = torch::empty({n, 6});
  for (int b = 0; b < n; ++b) {
    for (int j = 0; j < 6; ++j) {
      x[b][j] = std::cos(0.37 * (first + b) + 0.91 * j + 0.13 * step);
    }
  }
  return x;
}
torch::Tensor targets(int step, int first, int n) {
  auto y = torch::empty({n, 3});
  for (int b = 0; b < n; ++b) {
    for (int j = 0; j < 3; ++j) {
      y[b][j] = std::sin(0.51 * (first + b) - 0.77 * j + 0.29 * step);
    }
  }
  return y;
}

std::vector<float> flatParams(Net& net) {
  std::vector<float> out;
  for (auto& p : net->parameters()) {
    auto c = p.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

// One process, the concatenated batch of `world` ranks, plain SGD: the reference.
std::vector<float> reference(int world) {
  Net net;
  initNet(net, 0);
  for (int step = 0; step < kSteps; ++step) {
    net->zero_grad();
    const int n = kBatchPerRank * world;
    auto loss = torch::mse_loss(net->forward(inputs(step, 0, n)), targets(step, 0, n));
    loss.backward();
    torch::NoGradGuard g;
    for (auto& p : net->parameters()) {
      p.sub_(kLr * p.grad());
    }
  }
  return flatParams(net);
}

struct Spec {
  int world = 3;
  bool gradView = false;
  double bucketCapMb = 25;
  core::HostTransport transport = core::HostTransport::kEngine;
};

std::string trainRank(const Spec& spec, std::shared_ptr<core::Store> store, int rank,
                      std::vector<float>* out) {
  core::ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = spec.world;
  po.hierarchical = false;
  po.rendezvousTimeout = 20000ms;
  po.collectiveTimeout = 30000ms;
  po.hostTransport = spec.transport;
  auto pg = core::ProcessGroup::create(store, po);
  if (!pg.isOk()) {
    return pg.status().toString();
  }
  Net net;
  initNet(net, rank);  // differs per rank: DDP's initial broadcast makes them rank 0's
  auto tm = TorchModule::wrap(*net);
  if (!tm.isOk()) {
    return tm.status().toString();
  }
  core::Sgd opt((*tm)->parameters(), kLr);
  core::DdpOptions dopt;
  dopt.gradientAsBucketView = spec.gradView;
  dopt.bucketCapMb = spec.bucketCapMb;
  dopt.firstBucketBytes = spec.bucketCapMb < 1 ? 256 : dopt.firstBucketBytes;
  auto ddp = core::withBagua((*tm)->parameters(), (*tm)->buffers(), {&opt},
                             std::make_shared<core::GradientAllReduce>(), **pg, dopt);
  if (!ddp.isOk()) {
    return ddp.status().toString();
  }
  Status s = (*tm)->attach(**ddp);
  if (!s.isOk()) {
    return s.toString();
  }
  for (int step = 0; step < kSteps; ++step) {
    (*tm)->zeroGrad();
    RETURN_ERROR_TEXT((*ddp)->prepareForward());
    const int first = rank * kBatchPerRank;
    auto loss = torch::mse_loss(net->forward(inputs(step, first, kBatchPerRank)),
                                targets(step, first, kBatchPerRank));
    loss.backward();
    RETURN_ERROR_TEXT((*tm)->takeHookStatus());
    RETURN_ERROR_TEXT((*ddp)->finishBackward());
    RETURN_ERROR_TEXT((*ddp)->step());
  }
  *out = flatParams(net);
  (*tm)->detach();
  return "";
}

void expectMatchesReference(const Spec& spec) {
  torch::set_num_threads(1);
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<float>> got(spec.world);
  auto res = bagua::testing::runRanks(
      spec.world, [&](int r) { return trainRank(spec, store, r, &got[r]); }, 120s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  const std::vector<float> want = reference(spec.world);
  std::vector<float> init;
  {
    Net n0;
    initNet(n0, 0);
    init = flatParams(n0);
  }
  double moved = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    moved = std::max(moved, static_cast<double>(std::fabs(want[i] - init[i])));
  }
  ASSERT_GT(moved, 1e-3) << "the reference did not train: the comparison would be vacuous";
  for (int r = 0; r < spec.world; ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    double maxErr = 0;
    size_t worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      double e = std::fabs(got[r][i] - want[i]);
      if (e > maxErr) {
        maxErr = e;
        worst = i;
      }
    }
    EXPECT_LT(maxErr, 2e-5) << "rank " << r << " element " << worst << ": " << got[r][worst]
                            << " vs " << want[worst];
  }
}

TEST(TorchDdp, MatchesSingleProcessOnConcatenatedBatch) {
  expectMatchesReference(Spec{});
}

TEST(TorchDdp, GradientAsBucketViewMatches) {
  Spec s;
  s.gradView = true;
  expectMatchesReference(s);
}

TEST(TorchDdp, SmallBucketsOverlappingBackwardMatch) {
  Spec s;
  s.world = 2;
  s.bucketCapMb = 512.0 / (1024 * 1024);     // 512 B: one or two parameters per bucket
  s.transport = core::HostTransport::kAuto;  // one host: shared memory
  expectMatchesReference(s);
  s.gradView = true;
  expectMatchesReference(s);
}

TEST(TorchModule, WrapsNamesDtypesAndStorage) {
  Net net;
  auto tm = TorchModule::wrap(*net);
  ASSERT_TRUE(tm.isOk()) << tm.status().toString();
  auto& ps = (*tm)->parameters();
  ASSERT_EQ(ps.size(), 6u);
  EXPECT_EQ(ps[0].name, "fc1.weight");
  EXPECT_EQ(ps[1].name, "fc1.bias");
  EXPECT_EQ(ps[5].name, "head.bias");
  EXPECT_EQ(ps[0].numel, 96u);
  EXPECT_EQ(ps[0].data, net->fc1->weight.data_ptr());
  EXPECT_EQ(ps[0].grad, net->fc1->weight.grad().data_ptr());
  EXPECT_EQ(ps[0].dtype, core::DataType::kF32);
  ASSERT_EQ((*tm)->buffers().size(), 1u);
  EXPECT_EQ((*tm)->buffers()[0].name, "scale");
  EXPECT_EQ((*tm)->buffers()[0].dtype, core::DataType::kF32);
  EXPECT_EQ((*tm)->buffers()[0].grad, nullptr);
  // Gradients accumulate into the wrapped storage in place.
  auto loss = net->forward(torch::ones({2, 6})).sum();
  loss.backward();
  EXPECT_EQ(ps[0].grad, net->fc1->weight.grad().data_ptr());
  EXPECT_NE(net->fc1->weight.grad().abs().sum().item<float>(), 0.0f);
  (*tm)->zeroGrad();
  EXPECT_EQ(net->fc1->weight.grad().abs().sum().item<float>(), 0.0f);
  // setGrad (gradient_as_bucket_view) re-points .grad() at the given memory.
  std::vector<float> slot(96, 2.0f);
  ps[0].setGrad(slot.data());
  EXPECT_EQ(net->fc1->weight.grad().data_ptr(), static_cast<void*>(slot.data()));
  EXPECT_EQ(net->fc1->weight.grad().sum().item<float>(), 192.0f);
}

TEST(TorchModule, RefusesUnsupportedDtypes) {
  auto lin = torch::nn::Linear(2, 2);
  lin->to(torch::kComplexFloat);
  auto tm = TorchModule::wrap(*lin);
  ASSERT_FALSE(tm.isOk());
  EXPECT_EQ(tm.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tm.status().message().find("no core equivalent"), std::string::npos)
      << tm.status().message();
}

}  // namespace
}  // namespace bagua::libtorch
