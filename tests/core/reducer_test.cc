// The reducer (DistributedDataParallel) and its default algorithm: DDP's bucket assignment
// oracle, bucket order and rebuild, and training equivalence: a 4-rank DDP run of a real MLP
// equals single-process training on the concatenated batch, with gradient_as_bucket_view on and
// off, unused parameters, ignore lists, no_sync accumulation, hierarchical all-reduce; a rank
// that dies makes the others fail instead of hang. Stepping inside the backward pass
// (BucketStepper): each bucket stepped once, as it is reduced, on the reduced gradients, to the
// same bits as stepping after backward, in copy mode, at gradient homes, with bucket views and
// with unused parameters; a stepper that declines is left to step().
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "bagua/core/bucket_assignment.h"
#include "bagua/core/ddp.h"
#include "example_mlp.h"
#include "multi_rank.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using example::Mlp;
using example::MlpConfig;

// ---- Bucket assignment (PyTorch's test_c10d_common cases, copied into Bagua's suite) ---------

std::vector<TensorRef> refs(const std::vector<std::pair<size_t, DataType>>& spec) {
  std::vector<TensorRef> out;
  for (size_t i = 0; i < spec.size(); ++i) {
    out.push_back(
        {"t" + std::to_string(i), static_cast<int>(i), spec[i].first, spec[i].second, Device{}});
  }
  return out;
}

using Assignment = std::vector<std::vector<int>>;

TEST(BucketAssignment, SingleLimitSingleDtype) {
  auto t = refs(
      {{100, DataType::kF32}, {200, DataType::kF32}, {100, DataType::kF32}, {50, DataType::kF32}});
  EXPECT_EQ(computeBucketAssignmentBySize(t, {400}), (Assignment{{0}, {1}, {2}, {3}}));
}

TEST(BucketAssignment, SingleLimitMultiDtype) {
  auto t = refs({{50, DataType::kF32},
                 {25, DataType::kF64},
                 {50, DataType::kF32},
                 {25, DataType::kF64},
                 {50, DataType::kF32},
                 {25, DataType::kF64}});
  EXPECT_EQ(computeBucketAssignmentBySize(t, {400}), (Assignment{{0, 2}, {1, 3}, {4}, {5}}));
}

TEST(BucketAssignment, MultiLimitSingleDtype) {
  auto t = refs(
      {{10, DataType::kF32}, {10, DataType::kF32}, {10, DataType::kF32}, {10, DataType::kF32}});
  EXPECT_EQ(computeBucketAssignmentBySize(t, {40, 80}), (Assignment{{0}, {1, 2}, {3}}));
}

TEST(BucketAssignment, MultiLimitMultiDtype) {
  auto t = refs({{50, DataType::kF32},
                 {25, DataType::kF64},
                 {50, DataType::kF32},
                 {25, DataType::kF64},
                 {50, DataType::kF32},
                 {25, DataType::kF64}});
  EXPECT_EQ(computeBucketAssignmentBySize(t, {200, 400}), (Assignment{{0}, {1}, {2, 4}, {3, 5}}));
}

// The rebuild's form: the given order is walked and the buckets stay in the order they closed
// (sorting them by smallest position, as computeBucketAssignmentBySize does, would give
// {{2, 0}, {3, 1}, {4}, {5}}).
TEST(BucketAssignment, InOrderKeepsClosingOrder) {
  auto t = refs({{50, DataType::kF32},
                 {25, DataType::kF64},
                 {50, DataType::kF32},
                 {25, DataType::kF64},
                 {50, DataType::kF32},
                 {25, DataType::kF64}});
  EXPECT_EQ(computeBucketAssignmentInOrder(t, {5, 4, 3, 2, 1, 0}, {200, 400}),
            (Assignment{{5}, {4}, {3, 1}, {2, 0}}));
  EXPECT_EQ(computeBucketAssignmentInOrder(t, {}, {200, 400}), Assignment{});
}

// A one-rank process group on its own in-memory store, for the single-process tests (null if
// it could not be made).
std::unique_ptr<ProcessGroup> oneRankGroup(const ProcessGroupOptions& po = {}) {
  auto pg = ProcessGroup::create(std::make_shared<InMemoryStore>(), po);
  return pg.isOk() ? std::move(*pg) : nullptr;
}

// ---- Training harness ------------------------------------------------------------------------

constexpr int kIn = 12;
constexpr int kClasses = 5;
constexpr int kPerRank = 8;

MlpConfig modelConfig(uint64_t seed, bool aux = false) {
  MlpConfig c;
  c.sizes = {kIn, 48, 40, kClasses};
  c.seed = seed;
  c.auxHead = aux;
  return c;
}

// Deterministic data: sample s of step t.
void makeBatch(int step, int first, int count, std::vector<float>* x, std::vector<int32_t>* y) {
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

std::vector<float> flatWeights(Mlp& m) {
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
std::vector<float> layOutHomes(std::vector<Parameter>& params, Homes homes) {
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
std::vector<float> referenceRun(const RunSpec& spec, const std::vector<std::string>& ignore = {}) {
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

std::string ddpRun(const RunSpec& spec, std::vector<RankResult>* results) {
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

void expectMatchesReference(const std::vector<RankResult>& got, const std::vector<float>& want) {
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

class DdpEquivalence : public ::testing::TestWithParam<bool> {};

TEST_P(DdpEquivalence, MatchesSingleProcessOnConcatenatedBatch) {
  RunSpec spec;
  spec.ddp.gradientAsBucketView = GetParam();
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
}

TEST_P(DdpEquivalence, SmallBucketsAreRebuiltInReadyOrder) {
  RunSpec spec;
  spec.ddp.gradientAsBucketView = GetParam();
  spec.ddp.firstBucketBytes = 512;
  spec.ddp.bucketCapMb = 4096.0 / (1024 * 1024);  // 4 KiB
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
  EXPECT_TRUE(got[0].rebuilt);
  // Backward produces the last layer first (bias, then weight). In that order with limits
  // [512 B, 4 KiB]: fc2 (820 B) closes the first bucket, fc1 (7840 B) the second, fc0 is left.
  std::vector<std::vector<std::string>> want = {
      {"fc2.bias", "fc2.weight"}, {"fc1.bias", "fc1.weight"}, {"fc0.bias", "fc0.weight"}};
  EXPECT_EQ(got[0].layout, want);
  for (size_t r = 1; r < got.size(); ++r) {
    EXPECT_EQ(got[r].layout, got[0].layout) << "ranks disagree on buckets";
  }
  // The time accounting counted every communicating iteration and every bucket run (3 buckets
  // after the rebuild; the first iteration's layout has its own count).
  for (const RankResult& g : got) {
    const DdpStats& st = g.stats;
    EXPECT_EQ(st.iterations, spec.steps);
    EXPECT_GE(st.buckets, 3 * (spec.steps - 1) + 1);
    EXPECT_LE(st.buckets, 3 * (spec.steps - 1) + 6);
    EXPECT_GT(st.markNs, 0);
    EXPECT_GT(st.bucketRunNs, 0);
    EXPECT_GE(st.finishWaitNs, 0);
    EXPECT_GE(st.copyOutNs, 0);
    EXPECT_GE(st.bucketQueueNs, 0);
    EXPECT_GE(st.bucketWaitNs, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(GradientAsBucketView, DdpEquivalence, ::testing::Bool());

// ---- Buckets in place at the gradients' homes (Parameter::gradHome) ----------------------------

class DdpHomes : public ::testing::TestWithParam<Homes> {};

// Small buckets (three, rebuilt in ready order, which is reverse registration for the MLP) and
// two micro-batches, the first under noSync(): the same reference as copied buckets, and the
// buckets run in place exactly when the homes line up in their order.
TEST_P(DdpHomes, MatchTheReferenceAndRunInPlaceWhereTheHomesLineUp) {
  RunSpec spec;
  spec.homes = GetParam();
  spec.microBatches = 2;
  spec.ddp.firstBucketBytes = 512;
  spec.ddp.bucketCapMb = 4096.0 / (1024 * 1024);
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
  for (const RankResult& g : got) {
    EXPECT_TRUE(g.rebuilt);
    ASSERT_EQ(g.layout.size(), 3u);
    const bool lineUp = spec.homes == Homes::kGradsAtHomes || spec.homes == Homes::kGradsElsewhere;
    EXPECT_EQ(g.inPlace, lineUp ? 3 : 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Homes, DdpHomes,
                         ::testing::Values(Homes::kGradsAtHomes, Homes::kGradsElsewhere,
                                           Homes::kRegistrationOrder),
                         [](const ::testing::TestParamInfo<Homes>& i) {
                           switch (i.param) {
                           case Homes::kGradsAtHomes:
                             return std::string("GradientsAtHomes");
                           case Homes::kGradsElsewhere:
                             return std::string("GradientsElsewhere");
                           case Homes::kRegistrationOrder:
                             return std::string("HomesInTheWrongOrder");
                           default:
                             return std::string("None");
                           }
                         });

// The default limits put the whole MLP in one bucket; the homes line up, so it runs in place and
// the trainer's gradients are the bucket.
TEST(Ddp, OneBucketAtTheHomesIsTheGradientsThemselves) {
  RunSpec spec;
  spec.homes = Homes::kGradsAtHomes;
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
  EXPECT_EQ(got[0].layout.size(), 1u);
  EXPECT_EQ(got[0].inPlace, 1);
}

// New homes between iterations (what Python does after the reducer's layout changed): the same
// buckets laid out again over them, in place where they line up; a wrong count is refused.
TEST(Ddp, SetGradHomesLaysTheCurrentBucketsOutAgain) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  Mlp m(modelConfig(1000));
  const std::vector<float> wrong = layOutHomes(m.parameters(), Homes::kRegistrationOrder);
  auto ddp = withBagua(m.parameters(), m.buffers(), {}, std::make_shared<GradientAllReduce>(), *pg,
                       DdpOptions{});
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  DistributedDataParallel& d = **ddp;
  ASSERT_EQ(d.buckets().size(), 1u);
  EXPECT_FALSE(d.buckets()[0].inPlace);
  const int64_t gen = d.layoutGeneration();
  const auto layout = d.bucketLayout();

  std::vector<float> right(wrong.size());
  std::vector<void*> homes(m.parameters().size());
  size_t off = 0;
  for (size_t i = homes.size(); i-- > 0;) {  // reverse registration: the bucket's order
    homes[i] = right.data() + off;
    off += m.parameters()[i].numel;
  }
  ASSERT_TRUE(d.setGradHomes(homes).isOk());
  EXPECT_EQ(d.layoutGeneration(), gen + 1);
  EXPECT_EQ(d.bucketLayout(), layout);
  EXPECT_TRUE(d.buckets()[0].inPlace);
  EXPECT_EQ(d.buckets()[0].flat, static_cast<void*>(right.data()));

  homes.pop_back();
  Status s = d.setGradHomes(homes);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_TRUE(d.buckets()[0].inPlace);  // nothing changed
}

TEST(Ddp, GradientHomesWithGradientAsBucketViewAreRefusedByName) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  Mlp m(modelConfig(1000));
  const std::vector<float> homes = layOutHomes(m.parameters(), Homes::kGradsAtHomes);
  DdpOptions o;
  o.gradientAsBucketView = true;
  auto ddp =
      withBagua(m.parameters(), m.buffers(), {}, std::make_shared<GradientAllReduce>(), *pg, o);
  ASSERT_FALSE(ddp.isOk());
  EXPECT_EQ(ddp.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ddp.status().message().find("gradient home"), std::string::npos)
      << ddp.status().toString();
  EXPECT_NE(ddp.status().message().find(m.parameters()[0].name), std::string::npos);
}

// ---- Buckets started without waiting (AlgorithmImpl::launchBucket) --------------------------

// A Work the test finishes by hand.
class HeldWork final : public Work {
 public:
  bool test() override { return done_.load(); }
  Status wait(std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done_.load()) {
      if (std::chrono::steady_clock::now() >= until) {
        return BAGUA_ERROR(kDeadlineExceeded, "held");
      }
      std::this_thread::sleep_for(1ms);
    }
    return Status::ok();
  }
  Status status() override { return done_.load() ? Status::ok() : BAGUA_ERROR(kInternal, "held"); }
  void finish() { done_.store(true); }

 private:
  std::atomic<bool> done_{false};
};

// Every bucket's "collective" is a HeldWork; the test sees which were started.
class HeldAlgorithm final : public Algorithm {
 public:
  std::string name() const override { return "held"; }
  Result<std::unique_ptr<AlgorithmImpl>> reify(ProcessGroup& /*group*/) override {
    return std::unique_ptr<AlgorithmImpl>(new Impl(this));
  }
  std::vector<std::shared_ptr<HeldWork>> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return works_;
  }

 private:
  class Impl final : public AlgorithmImpl {
   public:
    explicit Impl(HeldAlgorithm* owner) : owner_(owner) {}
    Status runBucket(Bucket& /*b*/, ProcessGroup& /*g*/) override {
      return BAGUA_ERROR(kInternal, "runBucket called for a launchable bucket");
    }
    Result<WorkPtr> launchBucket(Bucket& /*b*/, ProcessGroup& /*g*/) override {
      auto w = std::make_shared<HeldWork>();
      std::lock_guard<std::mutex> lock(owner_->mu_);
      owner_->works_.push_back(w);
      return WorkPtr(w);
    }

   private:
    HeldAlgorithm* owner_;
  };
  std::mutex mu_;
  std::vector<std::shared_ptr<HeldWork>> works_;
};

struct HeldModel {
  std::vector<std::vector<float>> mem;
  std::vector<Parameter> params;
  std::vector<Parameter> buffers;
  explicit HeldModel(int n) : mem(static_cast<size_t>(n), std::vector<float>(2048, 1.0f)) {
    for (int i = 0; i < n; ++i) {
      Parameter p;
      p.name = "p" + std::to_string(i);
      p.numel = 1024;
      p.data = mem[static_cast<size_t>(i)].data();
      p.grad = mem[static_cast<size_t>(i)].data() + 1024;
      params.push_back(p);
    }
  }
};

TEST(Ddp, LaunchableBucketsStartWithoutWaitingForEarlierOnes) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  HeldModel m(4);
  auto algo = std::make_shared<HeldAlgorithm>();
  DdpOptions o;
  o.firstBucketBytes = 4096;  // one 4 KiB parameter per bucket
  o.bucketCapMb = 4096.0 / (1 << 20);
  o.rebuildBuckets = false;
  auto ddp = withBagua(m.params, m.buffers, {}, algo, *pg, o);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  ASSERT_EQ((*ddp)->buckets().size(), 4u);
  ASSERT_TRUE((*ddp)->prepareForward().isOk());
  for (int i = 3; i >= 0; --i) {
    ASSERT_TRUE((*ddp)->markGradReady(i).isOk());
  }
  // All four are started although none has finished.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (algo->started().size() < 4 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  auto works = algo->started();
  ASSERT_EQ(works.size(), 4u) << "a bucket waited for an earlier bucket's collective";
  std::thread finisher([&] {
    std::this_thread::sleep_for(20ms);
    for (auto& w : works) {
      w->finish();
    }
  });
  EXPECT_TRUE((*ddp)->finishBackward().isOk());
  finisher.join();
  const DdpStats st = (*ddp)->stats();
  EXPECT_EQ(st.buckets, 4);
  EXPECT_EQ(st.iterations, 1);
}

TEST(Ddp, ALaunchedBucketThatNeverFinishesFailsFinishBackwardInTime) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  HeldModel m(2);
  auto algo = std::make_shared<HeldAlgorithm>();
  DdpOptions o;
  o.rebuildBuckets = false;
  o.timeout = 300ms;
  auto ddp = withBagua(m.params, m.buffers, {}, algo, *pg, o);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  ASSERT_TRUE((*ddp)->prepareForward().isOk());
  ASSERT_TRUE((*ddp)->markGradReady(1).isOk());
  ASSERT_TRUE((*ddp)->markGradReady(0).isOk());
  const auto t0 = std::chrono::steady_clock::now();
  Status s = (*ddp)->finishBackward();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.toString();
  EXPECT_LT(waited, 10s);
  for (auto& w : algo->started()) {
    w->finish();  // let the reducer's destructor find nothing in flight
  }
}

TEST(Ddp, InitialBucketsAreReverseRegistrationWithSmallFirstBucketLast) {
  ProcessGroupOptions po;
  po.hierarchical = false;
  auto pg = oneRankGroup(po);
  ASSERT_NE(pg, nullptr);
  // 4 params of 512 KiB f32 each, then one f64 param: first bucket limit 1 MiB, cap 1.5 MiB.
  std::vector<std::vector<uint8_t>> mem;
  std::vector<Parameter> params;
  auto add = [&](const std::string& n, size_t numel, DataType t) {
    mem.emplace_back(numel * dataTypeSize(t) * 2);
    Parameter p;
    p.name = n;
    p.numel = numel;
    p.dtype = t;
    p.data = mem.back().data();
    p.grad = mem.back().data() + numel * dataTypeSize(t);
    params.push_back(p);
  };
  for (int i = 0; i < 4; ++i) {
    add("l" + std::to_string(i) + ".weight", 128 * 1024, DataType::kF32);
  }
  add("head.weight", 1000, DataType::kF64);
  std::vector<Parameter> buffers;
  DdpOptions o;
  o.bucketCapMb = 1.5;
  auto ddp = withBagua(params, buffers, {}, std::make_shared<GradientAllReduce>(), *pg, o);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  // Forward-order assignment: f32 [l0,l1] (1 MiB, first limit), [l2,l3] (1 MiB < 1.5 MiB:
  // leftover), f64 [head]; sorted by first member then reversed.
  auto layout = (*ddp)->bucketLayout();
  std::vector<std::vector<std::string>> want = {
      {"head.weight"}, {"l3.weight", "l2.weight"}, {"l1.weight", "l0.weight"}};
  EXPECT_EQ(layout, want);
}

TEST(Ddp, FindUnusedParametersMatchesReference) {
  RunSpec spec;
  spec.aux = true;
  spec.ddp.findUnusedParameters = true;
  spec.useAux = [](int rank, int step) { return (rank + step) % 2 == 0; };
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
}

TEST(Ddp, UnusedParameterWithoutFindUnusedIsAnErrorEverywhereNotAHang) {
  RunSpec spec;
  spec.aux = true;
  spec.steps = 2;
  spec.useAux = [](int rank, int) { return rank != 1; };  // rank 1 never uses the aux head
  std::vector<RankResult> got;
  auto t0 = std::chrono::steady_clock::now();
  std::string err = ddpRun(spec, &got);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 25s);
  EXPECT_NE(err.find("[rank 1]"), std::string::npos) << err;
  EXPECT_NE(err.find("find_unused_parameters"), std::string::npos) << err;
  EXPECT_NE(err.find("aux.weight"), std::string::npos) << err;
  for (int r : {0, 2, 3}) {
    EXPECT_NE(err.find("[rank " + std::to_string(r) + "]"), std::string::npos)
        << "rank " << r << " did not fail: " << err;
  }
}

TEST(Ddp, NoSyncAccumulatesThenReducesTheSum) {
  RunSpec spec;
  spec.microBatches = 3;
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
}

TEST(Ddp, HierarchicalAllReduceMatchesReference) {
  RunSpec spec;
  spec.hierarchical = true;
  spec.localWorldSize = 2;
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  expectMatchesReference(got, referenceRun(spec));
}

TEST(Ddp, BuffersAreBroadcastFromRankZero) {
  RunSpec spec;
  spec.steps = 2;
  std::vector<RankResult> got;
  ASSERT_EQ(ddpRun(spec, &got), "");
  // Each rank's running mean saw different data in its last forward, so they differ; but every
  // forward starts from rank 0's buffer: the difference is only the last update's share.
  std::vector<RankResult> noBcast;
  spec.ddp.broadcastBuffers = false;
  ASSERT_EQ(ddpRun(spec, &noBcast), "");
  // Without broadcast the buffers drift further apart than with it.
  double with = 0, without = 0;
  for (size_t k = 0; k < got[0].buffer.size(); ++k) {
    with += std::fabs(got[1].buffer[k] - got[0].buffer[k]);
    without += std::fabs(noBcast[1].buffer[k] - noBcast[0].buffer[k]);
  }
  EXPECT_LT(with, without);
}

TEST(Ddp, IgnoredParametersAreNeitherBroadcastNorReduced) {
  auto store = std::make_shared<InMemoryStore>();
  const int world = 2;
  std::vector<std::vector<float>> bias(world), weight(world);
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        ProcessGroupOptions po;
        po.rank = r;
        po.worldSize = world;
        po.hierarchical = false;
        auto pg = ProcessGroup::create(store, po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Mlp m(modelConfig(50 + static_cast<uint64_t>(r)));
        // Give the ignored bias a per-rank value to see that it is not broadcast.
        auto& params = m.parameters();
        int bi = -1;
        for (size_t i = 0; i < params.size(); ++i) {
          if (params[i].name == "fc0.bias") {
            bi = static_cast<int>(i);
          }
        }
        std::fill_n(static_cast<float*>(params[bi].data), params[bi].numel, 1.0f + r);
        DdpOptions o;
        o.paramsToIgnore = {"fc0.bias"};
        auto ddp =
            withBagua(params, m.buffers(), {}, std::make_shared<GradientAllReduce>(), **pg, o);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        for (const auto& b : (*ddp)->bucketLayout()) {
          for (const auto& n : b) {
            if (n == "fc0.bias") {
              return "ignored parameter is in a bucket";
            }
          }
        }
        // One step: set every gradient to rank+1 and mark them ready.
        for (auto& p : params) {
          std::fill_n(static_cast<float*>(p.grad), p.numel, 1.0f + r);
        }
        Status s = (*ddp)->prepareForward();
        for (size_t i = 0; i < params.size() && s.isOk(); ++i) {
          s = (*ddp)->markGradReady(static_cast<int>(i));
        }
        if (s.isOk()) {
          s = (*ddp)->finishBackward();
        }
        if (!s.isOk()) {
          return s.toString();
        }
        bias[r].assign(static_cast<float*>(params[bi].data),
                       static_cast<float*>(params[bi].data) + 1);
        bias[r].push_back(static_cast<float*>(params[bi].grad)[0]);
        weight[r].assign(static_cast<float*>(params[0].grad),
                         static_cast<float*>(params[0].grad) + 1);
        return "";
      },
      60s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_EQ(bias[0][0], 1.0f);  // data not broadcast
  EXPECT_EQ(bias[1][0], 2.0f);
  EXPECT_EQ(bias[0][1], 1.0f);  // gradient not reduced
  EXPECT_EQ(bias[1][1], 2.0f);
  EXPECT_EQ(weight[0][0], 1.5f);  // others averaged
  EXPECT_EQ(weight[1][0], 1.5f);
}

TEST(Ddp, RankThatDiesMidTrainingFailsTheOthersWithinTheTimeout) {
  auto store = std::make_shared<InMemoryStore>();
  const int world = 3;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        ProcessGroupOptions po;
        po.rank = r;
        po.worldSize = world;
        po.hierarchical = false;
        po.collectiveTimeout = 15000ms;
        auto pg = ProcessGroup::create(store, po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Mlp m(modelConfig(7));
        Sgd opt(m.parameters(), 0.05f);
        auto ddp = withBagua(m.parameters(), m.buffers(), {&opt},
                             std::make_shared<GradientAllReduce>(), **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        std::vector<float> x;
        std::vector<int32_t> y;
        auto t0 = std::chrono::steady_clock::now();
        for (int step = 0; step < 5; ++step) {
          if (r == 2 && step == 2) {
            ddp->reset();
            pg->reset();  // dies
            return "";
          }
          Status s = (*ddp)->prepareForward();
          makeBatch(step, r * kPerRank, kPerRank, &x, &y);
          m.forward(x.data(), y.data(), kPerRank);
          m.backward([&](int p) {
            if (s.isOk()) {
              s = (*ddp)->markGradReady(p);
            }
          });
          if (s.isOk()) {
            s = (*ddp)->finishBackward();
          }
          if (!s.isOk()) {
            if (step < 2) {
              return "failed before the peer died: " + s.toString();
            }
            if (std::chrono::steady_clock::now() - t0 > 12s) {
              return "error only after the deadline: " + s.toString();
            }
            return "";  // expected: an error, promptly
          }
          (void)(*ddp)->step();
        }
        return "training went on although rank 2 died";
      },
      60s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// ---- Stepping inside the backward pass -----------------------------------------------------

struct InBackwardCase {
  const char* name;
  bool bucketView;
  Homes homes;
  bool unused;  // an aux head some ranks skip, with findUnusedParameters
};

void PrintTo(const InBackwardCase& c, std::ostream* os) {
  *os << c.name;
}

class DdpStepInBackward : public ::testing::TestWithParam<InBackwardCase> {};

TEST_P(DdpStepInBackward, EachBucketIsSteppedOnceAsItIsReducedToTheSameBits) {
  const InBackwardCase& c = GetParam();
  RunSpec spec;
  spec.world = 3;
  spec.steps = 6;
  spec.optimizer = Stepper::kBucketSgd;
  spec.homes = c.homes;
  spec.ddp.gradientAsBucketView = c.bucketView;
  spec.ddp.firstBucketBytes = 256;  // several buckets
  spec.ddp.bucketCapMb = 1024.0 / (1 << 20);
  if (c.unused) {
    spec.aux = true;
    spec.ddp.findUnusedParameters = true;
    spec.useAux = [](int rank, int step) { return (rank + step) % 2 == 0; };
  }
  RunSpec after = spec;
  after.ddp.stepInBackward = false;
  std::vector<RankResult> in, ref;
  ASSERT_EQ(ddpRun(spec, &in), "");
  ASSERT_EQ(ddpRun(after, &ref), "");
  for (size_t r = 0; r < in.size(); ++r) {
    ASSERT_EQ(in[r].weights.size(), ref[0].weights.size());
    EXPECT_EQ(std::memcmp(in[r].weights.data(), ref[0].weights.data(), ref[0].weights.size() * 4),
              0)
        << "rank " << r << ": stepping inside backward differs from stepping after it";
    ASSERT_GT(in[r].buckets, 2u);
    // Every backward stepped every bucket of its layout once, in bucket order (host buckets
    // complete in order; the layout changes once, at the rebuild in ready order), and the
    // reducer counted them.
    ASSERT_EQ(in[r].stepped.size(), static_cast<size_t>(spec.steps));
    int64_t total = 0;
    for (const std::vector<int>& one : in[r].stepped) {
      ASSERT_GT(one.size(), 2u);
      for (size_t b = 0; b < one.size(); ++b) {
        EXPECT_EQ(one[b], static_cast<int>(b)) << "rank " << r;
      }
      total += static_cast<int64_t>(one.size());
    }
    EXPECT_EQ(in[r].stepped.back().size(), in[r].buckets) << "rank " << r;
    EXPECT_EQ(in[r].stats.bucketsStepped, total) << "rank " << r;
    EXPECT_TRUE(ref[r].stepped.empty());
    EXPECT_EQ(ref[r].stats.bucketsStepped, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DdpStepInBackward,
    ::testing::Values(InBackwardCase{"copy", false, Homes::kNone, false},
                      InBackwardCase{"bucket_view", true, Homes::kNone, false},
                      InBackwardCase{"at_homes", false, Homes::kGradsAtHomes, false},
                      InBackwardCase{"homes_elsewhere", false, Homes::kGradsElsewhere, false},
                      InBackwardCase{"unused_copy", false, Homes::kNone, true}),
    [](const ::testing::TestParamInfo<InBackwardCase>& p) { return p.param.name; });

TEST(Ddp, AStepperThatDeclinesStepsAfterBackward) {
  RunSpec spec;
  spec.world = 2;
  spec.steps = 3;
  spec.optimizer = Stepper::kDeclining;
  RunSpec plain = spec;
  plain.optimizer = Stepper::kBucketSgd;
  plain.ddp.stepInBackward = false;
  std::vector<RankResult> got, ref;
  ASSERT_EQ(ddpRun(spec, &got), "");
  ASSERT_EQ(ddpRun(plain, &ref), "");
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_TRUE(got[r].stepped.empty());
    EXPECT_EQ(got[r].stats.bucketsStepped, 0);
    ASSERT_EQ(got[r].weights.size(), ref[0].weights.size());
    EXPECT_EQ(std::memcmp(got[r].weights.data(), ref[0].weights.data(), ref[0].weights.size() * 4),
              0);
  }
}

TEST(Ddp, ReducedBucketCallsOutsideABackwardOrOutOfRangeAreRefused) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  Mlp m(modelConfig(3));
  Sgd opt(m.parameters(), 0.05f);
  auto ddp =
      withBagua(m.parameters(), m.buffers(), {&opt}, std::make_shared<GradientAllReduce>(), *pg);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  EXPECT_EQ((*ddp)->bucketsReduced(), 0);
  Status s = (*ddp)->waitBucketReduced(0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.toString();
  ASSERT_TRUE((*ddp)->prepareForward().isOk());
  std::vector<float> x;
  std::vector<int32_t> y;
  makeBatch(0, 0, kPerRank, &x, &y);
  m.forward(x.data(), y.data(), kPerRank);
  Status ready;
  m.backward([&](int p) {
    if (ready.isOk()) {
      ready = (*ddp)->markGradReady(p);
    }
  });
  ASSERT_TRUE(ready.isOk()) << ready.toString();
  s = (*ddp)->waitBucketReduced(99);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_TRUE((*ddp)->waitBucketReduced(0).isOk());
  s = (*ddp)->copyBucketOutOn(0, nullptr);  // a host bucket: waitBucketReduced copied it back
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_GE((*ddp)->bucketsReduced(), 1);
  EXPECT_TRUE((*ddp)->finishBackward().isOk());
}

}  // namespace
}  // namespace bagua::core
