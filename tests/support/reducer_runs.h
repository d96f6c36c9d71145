// The reducer tests' training harness: the example MLP trained for a few steps by `world`
// ranks (threads) through DistributedDataParallel on the host backend (ddpRun, with the options
// of a RunSpec: bucket layout, gradient homes, no_sync, unused parameters, hierarchical groups,
// stepping inside backward), against single-process training on the concatenated batch
// (referenceRun). Header only, for tests/core/reducer_*_test.cc.
//
// Thread safety: ddpRun runs the ranks on threads of its own; call it from the test's thread.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "bagua/core/ddp.h"
#include "example_mlp.h"
#include "multi_rank.h"

namespace bagua::core::reducertest {

using namespace std::chrono_literals;

using example::Mlp;
using example::MlpConfig;

// A one-rank process group on its own in-memory store, for the single-process tests (null if
// it could not be made).
inline std::unique_ptr<ProcessGroup> oneRankGroup(const ProcessGroupOptions& po = {}) {
  auto pg = ProcessGroup::create(std::make_shared<InMemoryStore>(), po);
  return pg.isOk() ? std::move(*pg) : nullptr;
}

constexpr int kIn = 12;
constexpr int kClasses = 5;
constexpr int kPerRank = 8;

inline MlpConfig modelConfig(uint64_t seed, bool aux = false) {
  MlpConfig c;
  c.sizes = {kIn, 48, 40, kClasses};
  c.seed = seed;
  c.auxHead = aux;
  return c;
}

// Deterministic data: sample s of step t.
inline void makeBatch(int step, int first, int count, std::vector<float>* x,
                      std::vector<int32_t>* y) {
  x->resize(static_cast<size_t>(count) * kIn);
  y->resize(count);
  for (int k = 0; k < count; ++k) {
    std::mt19937 rng(static_cast<uint32_t>(step * 100003 + first + k));
    std::normal_distribution<float> d(0.0f, 1.0f);
    float score[kClasses] = {};
    for (int i = 0; i < kIn; ++i) {
      float v = d(rng);
      (*x)[static_cast<size_t>(k) * kIn + i] = v;
      for (int c = 0; c < kClasses; ++c) {
        score[c] += v * static_cast<float>(((i + 1) * (c + 3)) % 7 - 3);
      }
    }
    (*y)[k] = static_cast<int32_t>(std::max_element(score, score + kClasses) - score);
  }
}

inline std::vector<float> flatWeights(Mlp& m) {
  std::vector<float> w;
  for (auto& p : m.parameters()) {
    auto* d = static_cast<float*>(p.data);
    w.insert(w.end(), d, d + p.numel);
  }
  return w;
}

// do_flatten's laid-out gradients (Parameter::gradHome): one buffer, the parameters' places back
// to back in reverse registration order (the reducer's initial bucket order) or in registration
// order (never adjacent in a bucket's order once a bucket holds two tensors).
enum class Homes {
  kNone,
  kGradsAtHomes,       // gradients written at their homes (in-place accumulation)
  kGradsElsewhere,     // homes given, gradients in the model's own memory (fresh each step)
  kRegistrationOrder,  // gradients at homes laid out in the wrong order for the buckets
};

// SGD with momentum (core::Sgd's formula) that can also step one bucket's parameters inside the
// backward pass (BucketStepper); step() then steps the parameters it has not stepped. Records
// which buckets each backward stepped; `decline` makes it refuse, with a reason.
class BucketSgd final : public Optimizer, public BucketStepper {
 public:
  BucketSgd(std::vector<Parameter>& params, float lr, float momentum, bool decline)
      : params_(params), lr_(lr), momentum_(momentum), decline_(decline) {
    for (const Parameter& p : params_) {
      velocity_.emplace_back(p.numel, 0.0f);
    }
    done_.assign(params_.size(), 0);
  }
  Status step() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (done_[i] == 0) {
        stepParam(i);
      }
      done_[i] = 0;
    }
    return Status::ok();
  }
  void zeroGrad() override {
    for (Parameter& p : params_) {
      std::fill_n(static_cast<float*>(p.grad), p.numel, 0.0f);
    }
  }
  std::vector<Parameter> stateTensors() override {
    std::vector<Parameter> out;
    for (size_t i = 0; i < velocity_.size(); ++i) {
      Parameter s;
      s.name = params_[i].name + ".momentum_buffer";
      s.data = velocity_[i].data();
      s.numel = velocity_[i].size();
      s.requiresGrad = false;
      out.push_back(s);
    }
    return out;
  }
  bool beginBackwardStep(DistributedDataParallel&, std::string* why) override {
    if (decline_) {
      *why = "this test's optimizer declines";
      return false;
    }
    stepped.emplace_back();
    return true;
  }
  Status stepBucket(DistributedDataParallel& ddp, int bucket) override {
    stepped.back().push_back(bucket);
    for (int t : ddp.buckets()[static_cast<size_t>(bucket)].tensors) {
      const auto i = static_cast<size_t>(ddp.tensors()[static_cast<size_t>(t)].paramIndex);
      if (done_[i] != 0) {
        return BAGUA_ERROR(kInternal, "parameter %zu stepped twice", i);
      }
      stepParam(i);
      done_[i] = 1;
    }
    return Status::ok();
  }
  std::vector<std::vector<int>> stepped;  // per backward that stepped: buckets, in order

 private:
  void stepParam(size_t i) {
    Parameter& p = params_[i];
    auto* w = static_cast<float*>(p.data);
    const auto* g = static_cast<const float*>(p.grad);
    float* v = velocity_[i].data();
    for (size_t k = 0; k < p.numel; ++k) {
      v[k] = momentum_ * v[k] + g[k];
      w[k] -= lr_ * v[k];
    }
  }
  std::vector<Parameter>& params_;
  float lr_, momentum_;
  bool decline_;
  std::vector<std::vector<float>> velocity_;
  std::vector<uint8_t> done_;
};

enum class Stepper { kSgd, kBucketSgd, kDeclining };

struct RunSpec {
  int world = 4;
  Stepper optimizer = Stepper::kSgd;
  int steps = 4;
  int microBatches = 1;  // > 1: the first ones under noSync()
  DdpOptions ddp;
  bool hierarchical = false;
  int localWorldSize = -1;
  std::function<bool(int rank, int step)> useAux;  // null: never
  bool aux = false;
  Homes homes = Homes::kNone;
};

// Lays out `params`' homes in one buffer (see Homes) and points the gradients there when asked.
inline std::vector<float> layOutHomes(std::vector<Parameter>& params, Homes homes) {
  size_t total = 0;
  for (const Parameter& p : params) {
    total += p.numel;
  }
  std::vector<float> flat(total, 0.0f);
  if (homes == Homes::kNone) {
    return flat;
  }
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = homes == Homes::kRegistrationOrder ? i : order.size() - 1 - i;
  }
  size_t off = 0;
  for (size_t i : order) {
    Parameter& p = params[i];
    p.gradHome = flat.data() + off;
    if (homes != Homes::kGradsElsewhere) {
      p.grad = p.gradHome;
    }
    off += p.numel;
  }
  return flat;
}

// Single-process reference: the mean of the per-rank mean losses, i.e. per-rank gradients
// accumulated and divided by the world size (equal batches: the mean over the whole batch).
inline std::vector<float> referenceRun(const RunSpec& spec,
                                       const std::vector<std::string>& ignore = {}) {
  Mlp m(modelConfig(1000, spec.aux));  // rank 0's seed: DDP broadcasts rank 0's weights
  Sgd opt(m.parameters(), 0.05f, 0.9f);
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int step = 0; step < spec.steps; ++step) {
    m.zeroGrad();
    for (int mb = 0; mb < spec.microBatches; ++mb) {
      for (int r = 0; r < spec.world; ++r) {
        makeBatch(step * spec.microBatches + mb, r * kPerRank, kPerRank, &x, &y);
        bool aux = spec.useAux && spec.useAux(r, step);
        m.forward(x.data(), y.data(), kPerRank, aux);
        m.backward([](int) {});
      }
    }
    for (auto& p : m.parameters()) {
      auto* g = static_cast<float*>(p.grad);
      for (size_t k = 0; k < p.numel; ++k) {
        g[k] /= static_cast<float>(spec.world);
      }
    }
    (void)opt.step();
  }
  (void)ignore;
  return flatWeights(m);
}

struct RankResult {
  std::vector<float> weights;
  std::vector<std::vector<std::string>> layout;
  bool rebuilt = false;
  std::vector<float> buffer;
  DdpStats stats;
  int inPlace = 0;  // buckets in place at the end, each checked to lie in the homes' buffer
  std::vector<std::vector<int>> stepped;  // BucketSgd: buckets stepped inside each backward
  size_t buckets = 0;
};

inline std::string ddpRun(const RunSpec& spec, std::vector<RankResult>* results) {
  auto store = std::make_shared<InMemoryStore>();
  results->assign(spec.world, {});
  auto res = bagua::testing::runRanks(
      spec.world,
      [&](int r) -> std::string {
        ProcessGroupOptions po;
        po.rank = r;
        po.worldSize = spec.world;
        po.localWorldSize = spec.localWorldSize;
        po.hierarchical = spec.hierarchical;
        po.rendezvousTimeout = 20000ms;
        po.collectiveTimeout = 30000ms;
        auto pg = ProcessGroup::create(store, po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Mlp m(modelConfig(1000 + static_cast<uint64_t>(r) * 17, spec.aux));  // differ per rank
        Sgd sgd(m.parameters(), 0.05f, 0.9f);
        BucketSgd bucketSgd(m.parameters(), 0.05f, 0.9f, spec.optimizer == Stepper::kDeclining);
        Optimizer& opt = spec.optimizer == Stepper::kSgd ? static_cast<Optimizer&>(sgd)
                                                         : static_cast<Optimizer&>(bucketSgd);
        const std::vector<float> homes = layOutHomes(m.parameters(), spec.homes);  // outlives ddp
        auto ddp =
            withBagua(m.parameters(), m.buffers(), {&opt},
                      std::make_shared<GradientAllReduce>(spec.hierarchical), **pg, spec.ddp);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        DistributedDataParallel& d = **ddp;
        std::vector<float> x;
        std::vector<int32_t> y;
        for (int step = 0; step < spec.steps; ++step) {
          opt.zeroGrad();
          for (int mb = 0; mb < spec.microBatches; ++mb) {
            const bool sync = mb == spec.microBatches - 1;
            std::optional<DistributedDataParallel::NoSyncGuard> guard;
            if (!sync) {
              guard.emplace(&d);
            }
            Status s = d.prepareForward();
            if (!s.isOk()) {
              return s.toString();
            }
            makeBatch(step * spec.microBatches + mb, r * kPerRank, kPerRank, &x, &y);
            bool aux = spec.useAux && spec.useAux(r, step);
            m.forward(x.data(), y.data(), kPerRank, aux);
            Status ready;
            m.backward([&](int p) {
              if (ready.isOk()) {
                ready = d.markGradReady(p);
              }
            });
            if (!ready.isOk()) {
              return ready.toString();
            }
            s = d.finishBackward();
            if (!s.isOk()) {
              return s.toString();
            }
          }
          Status s = d.step();
          if (!s.isOk()) {
            return s.toString();
          }
        }
        (*results)[r].weights = flatWeights(m);
        (*results)[r].layout = d.bucketLayout();
        (*results)[r].rebuilt = d.bucketsRebuilt();
        (*results)[r].stats = d.stats();
        (*results)[r].stepped = bucketSgd.stepped;
        (*results)[r].buckets = d.buckets().size();
        for (const Bucket& b : d.buckets()) {
          const auto* f = static_cast<const float*>(b.flat);
          if (b.inPlace && (f < homes.data() || f + b.numel > homes.data() + homes.size())) {
            return "bucket " + std::to_string(b.index) + " is in place outside the homes";
          }
          (*results)[r].inPlace += b.inPlace ? 1 : 0;
        }
        auto* b = static_cast<float*>(m.buffers()[0].data);
        (*results)[r].buffer.assign(b, b + m.buffers()[0].numel);
        return "";
      },
      120s);
  return bagua::testing::joinFailures(res);
}

inline void expectMatchesReference(const std::vector<RankResult>& got,
                                   const std::vector<float>& want) {
  ASSERT_FALSE(got.empty());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].weights.size(), want.size());
    // Every rank holds bitwise the same model.
    EXPECT_EQ(std::memcmp(got[r].weights.data(), got[0].weights.data(), want.size() * 4), 0)
        << "rank " << r << " diverged from rank 0";
  }
  double maxErr = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    maxErr = std::max(maxErr, std::fabs(static_cast<double>(got[0].weights[k]) - want[k]) /
                                  std::max(1.0, std::fabs(static_cast<double>(want[k]))));
  }
  EXPECT_LT(maxErr, 2e-5) << "DDP differs from single-process training beyond rounding";
}

// ddpRun(spec) must pass and match referenceRun(spec) (expectMatchesReference); `got` (optional)
// keeps the ranks' results for further checks.
inline void expectDdpMatchesReference(const RunSpec& spec, std::vector<RankResult>* got = nullptr) {
  std::vector<RankResult> own;
  std::vector<RankResult>& out = got != nullptr ? *got : own;
  ASSERT_EQ(ddpRun(spec, &out), "");
  expectMatchesReference(out, referenceRun(spec));
}

}  // namespace bagua::core::reducertest
