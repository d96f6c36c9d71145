// The algorithms tests' training harness on a toy model (two tensors) whose gradients the test
// dictates: a rank's host-backend group, the toy's initial weights, one backward pass and one
// training iteration through the reducer (toyBackward, toyStep), and `world` ranks (threads)
// trained with SGD at lr 1 (train). Header only, for tests/algorithms/algorithms_test.cc and
// decentralized_test.cc.
//
// Thread safety: train() runs the ranks on threads of its own; the other helpers touch only their
// arguments (one Toy per rank thread).
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "multi_rank.h"

namespace bagua::algo::toytest {

// In a rank body (which returns its failure text).
#define RETURN_IF_FAILED(expr) \
  do {                         \
    Status s_ = (expr);        \
    if (!s_.isOk()) {          \
      return s_.toString();    \
    }                          \
  } while (0)
using core::Parameter;
using core::ProcessGroup;

inline Result<std::unique_ptr<ProcessGroup>> makeGroup(std::shared_ptr<core::Store> store, int rank,
                                                       int world, int localWorld,
                                                       bool hierarchical) {
  core::ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = world;
  po.localWorldSize = localWorld;
  po.hierarchical = hierarchical;
  po.rendezvousTimeout = std::chrono::milliseconds(20000);
  po.collectiveTimeout = std::chrono::milliseconds(20000);
  return ProcessGroup::create(std::move(store), po);
}

// ---- Training harness on a toy model whose gradients the test dictates ------------------------

inline const std::vector<size_t> kSizes = {37, 101};

inline float initWeight(int rank, size_t i) {
  return std::cos(static_cast<float>(i) * 0.21f) + 100.0f * static_cast<float>(rank);
}

struct Toy {
  std::vector<std::vector<float>> data, grad;
  std::vector<Parameter> params;
  explicit Toy(int rank) {
    size_t base = 0;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      data.emplace_back(kSizes[k]);
      grad.emplace_back(kSizes[k], 0.0f);
      for (size_t i = 0; i < kSizes[k]; ++i) {
        data[k][i] = initWeight(rank, base + i);
      }
      base += kSizes[k];
    }
    for (size_t k = 0; k < kSizes.size(); ++k) {
      Parameter p;
      p.name = "p" + std::to_string(k);
      p.data = data[k].data();
      p.grad = grad[k].data();
      p.numel = kSizes[k];
      params.push_back(p);
    }
  }
  std::vector<float> flat() const {
    std::vector<float> out;
    for (const auto& d : data) {
      out.insert(out.end(), d.begin(), d.end());
    }
    return out;
  }
};

inline size_t toyNumel() {
  return kSizes[0] + kSizes[1];
}

// One backward pass of `toy` through `d`: prepareForward, every gradient element set to grad(i)
// (i: the element's index over the toy's tensors, back to back), the tensors marked ready last
// first, finishBackward. The first error, as the reducer returned it.
inline Status toyBackward(core::DistributedDataParallel& d, Toy& toy,
                          const std::function<float(size_t i)>& grad) {
  BAGUA_RETURN_IF_ERROR(d.prepareForward());
  size_t base = 0;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    for (size_t i = 0; i < kSizes[k]; ++i) {
      toy.grad[k][i] = grad(base + i);
    }
    base += kSizes[k];
  }
  for (int k = static_cast<int>(kSizes.size()) - 1; k >= 0; --k) {
    BAGUA_RETURN_IF_ERROR(d.markGradReady(k));
  }
  return d.finishBackward();
}

// toyBackward, then the optimizer's step through the reducer: one training iteration.
inline Status toyStep(core::DistributedDataParallel& d, Toy& toy,
                      const std::function<float(size_t i)>& grad) {
  BAGUA_RETURN_IF_ERROR(toyBackward(d, toy, grad));
  return d.step();
}

struct TrainSpec {
  int world = 4;
  int localWorld = -1;
  bool hierarchicalGroup = false;
  int steps = 6;
  std::function<Result<std::shared_ptr<core::Algorithm>>(int rank)> algorithm;
  std::function<float(int rank, int step, size_t i)> grad;
  // Optional: called after each step (rank, step, toy, algorithm); non-empty fails the rank.
  std::function<std::string(int, int, Toy&, core::Algorithm&)> after;
  std::chrono::milliseconds sleepPerStep{0};
  // Optional: per rank, the operations run on the training group (all its communicators) from
  // the end of the second step (the wrap's broadcast and the reducer's one rebuild behind) to
  // the end.
  std::vector<uint64_t>* trainingGroupOps = nullptr;
};

// SGD with lr 1 and no momentum: x <- x - g.
inline std::string train(const TrainSpec& spec, std::vector<std::vector<float>>* weights) {
  auto store = std::make_shared<core::InMemoryStore>();
  weights->assign(spec.world, {});
  if (spec.trainingGroupOps != nullptr) {
    spec.trainingGroupOps->assign(spec.world, 0);
  }
  auto res = testing::runRanks(
      spec.world,
      [&](int r) -> std::string {
        auto pg = makeGroup(store, r, spec.world, spec.localWorld, spec.hierarchicalGroup);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Toy toy(r);
        core::Sgd opt(toy.params, 1.0f);
        std::vector<core::Parameter> buffers;
        auto algo = spec.algorithm(r);
        if (!algo.isOk()) {
          return algo.status().toString();
        }
        auto ddp = core::withBagua(toy.params, buffers, {&opt}, *algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        core::DistributedDataParallel& d = **ddp;
        uint64_t opsAfterSecondStep = 0;
        for (int step = 0; step < spec.steps; ++step) {
          Status s = toyStep(d, toy, [&](size_t i) { return spec.grad(r, step, i); });
          if (!s.isOk()) {
            return strPrintf("step %d: %s", step, s.toString().c_str());
          }
          if (spec.after) {
            std::string e = spec.after(r, step, toy, **algo);
            if (!e.empty()) {
              return e;
            }
          }
          if (spec.sleepPerStep.count() > 0) {
            std::this_thread::sleep_for(spec.sleepPerStep);
          }
          if (step == 1) {
            opsAfterSecondStep = (*pg)->stats().operations;
          }
        }
        if (spec.trainingGroupOps != nullptr) {
          (*spec.trainingGroupOps)[r] = (*pg)->stats().operations - opsAfterSecondStep;
        }
        (*weights)[r] = toy.flat();
        return "";
      },
      std::chrono::seconds(90));
  return testing::joinFailures(res);
}

inline float toyGrad(int rank, int step, size_t i) {
  return 0.05f * std::sin(static_cast<float>(i) * 0.13f + static_cast<float>(step)) *
             static_cast<float>(rank + 1) +
         0.01f * static_cast<float>(rank) - 0.002f * static_cast<float>(step);
}

}  // namespace bagua::algo::toytest
