// The reducer (DistributedDataParallel) and its default algorithm: DDP's bucket assignment
// oracle, bucket order and rebuild, and training equivalence (reducer_runs.h): a 4-rank DDP run
// of a real MLP equals single-process training on the concatenated batch, with
// gradient_as_bucket_view on and off, buckets at the gradients' homes, unused parameters, ignore
// lists, no_sync accumulation, hierarchical all-reduce; a rank that dies makes the others fail
// instead of hang.
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
#include "reducer_runs.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using namespace reducertest;

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

// A model smaller than four first buckets is cut into about four (both limits a quarter of it, at
// least 64 KiB), so its first gradients communicate while the rest are computed; larger models
// and smaller limits given by the user are kept.
TEST(BucketAssignment, SmallModelsAreCutIntoFourBuckets) {
  const BucketOptions defaults;  // 1 MiB first, 25 MiB cap
  BucketOptions l = limitsForModel(defaults, 480000);
  EXPECT_EQ(l.firstBucketBytes, 120000u);
  EXPECT_EQ(l.bucketCapBytes, 120000u);
  l = limitsForModel(defaults, 100000);  // a quarter would be below the floor
  EXPECT_EQ(l.firstBucketBytes, kMinBucketBytes);
  EXPECT_EQ(l.bucketCapBytes, kMinBucketBytes);
  l = limitsForModel(defaults, 4 << 20);  // four first buckets: DDP's limits as they are
  EXPECT_EQ(l.firstBucketBytes, defaults.firstBucketBytes);
  EXPECT_EQ(l.bucketCapBytes, defaults.bucketCapBytes);
  l = limitsForModel({1 << 20, 100000}, 480000);  // the user's smaller cap stays
  EXPECT_EQ(l.firstBucketBytes, 120000u);
  EXPECT_EQ(l.bucketCapBytes, 100000u);
  l = limitsForModel({10000, 20000}, 480000);  // limits already below a quarter: unchanged
  EXPECT_EQ(l.firstBucketBytes, 10000u);
  EXPECT_EQ(l.bucketCapBytes, 20000u);

  // 16 tensors of 30,000 B (480,000 B): four buckets of four tensors, in the given order.
  auto t = refs(std::vector<std::pair<size_t, DataType>>(16, {7500, DataType::kF32}));
  std::vector<int> order(16);
  for (int i = 0; i < 16; ++i) {
    order[i] = 15 - i;
  }
  l = limitsForModel(defaults, 480000);
  EXPECT_EQ(computeBucketAssignmentInOrder(t, order, {l.firstBucketBytes, l.bucketCapBytes}),
            (Assignment{{15, 14, 13, 12}, {11, 10, 9, 8}, {7, 6, 5, 4}, {3, 2, 1, 0}}));
}

class DdpEquivalence : public ::testing::TestWithParam<bool> {};

TEST_P(DdpEquivalence, MatchesSingleProcessOnConcatenatedBatch) {
  RunSpec spec;
  spec.ddp.gradientAsBucketView = GetParam();
  expectDdpMatchesReference(spec);
}

TEST_P(DdpEquivalence, SmallBucketsAreRebuiltInReadyOrder) {
  RunSpec spec;
  spec.ddp.gradientAsBucketView = GetParam();
  spec.ddp.firstBucketBytes = 512;
  spec.ddp.bucketCapMb = 4096.0 / (1024 * 1024);  // 4 KiB
  std::vector<RankResult> got;
  ASSERT_NO_FATAL_FAILURE(expectDdpMatchesReference(spec, &got));
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
  ASSERT_NO_FATAL_FAILURE(expectDdpMatchesReference(spec, &got));
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
  ASSERT_NO_FATAL_FAILURE(expectDdpMatchesReference(spec, &got));
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
  expectDdpMatchesReference(spec);
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
  expectDdpMatchesReference(spec);
}

TEST(Ddp, HierarchicalAllReduceMatchesReference) {
  RunSpec spec;
  spec.hierarchical = true;
  spec.localWorldSize = 2;
  expectDdpMatchesReference(spec);
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

}  // namespace
}  // namespace bagua::core
