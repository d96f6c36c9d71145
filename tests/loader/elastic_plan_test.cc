// ElasticBatchPlan: every sample of an epoch read exactly once across resumes and
// world-size changes, the same plan on every rank, balance kept after a re-cut, positions that
// survive serialization and refuse to resume the wrong run.
#include "bagua/loader/elastic_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "loader_test_util.h"

namespace bagua::loader {
namespace {

using Plans = std::vector<std::unique_ptr<ElasticBatchPlan>>;

// One plan per rank, as every rank of a job builds its own.
Plans makePlans(size_t n, int world, size_t batch, uint64_t seed = 7,
                std::vector<int64_t> complexities = {}, double randomLevel = 0.0) {
  Plans plans;
  for (int r = 0; r < world; ++r) {
    ElasticPlanOptions o;
    o.numReplicas = world;
    o.rank = r;
    o.batchSize = batch;
    o.seed = seed;
    o.complexities = complexities;
    o.randomLevel = randomLevel;
    auto p = ElasticBatchPlan::create(n, std::move(o));
    EXPECT_TRUE(p.isOk()) << p.status().toString();
    plans.push_back(std::move(*p));
  }
  return plans;
}

// Every rank plans `epoch`; returns each rank's batches, checking that all ranks agree on the
// number of steps and that a batch is empty only in a segment smaller than the world.
std::vector<Batches> planEpoch(Plans& plans, uint64_t epoch) {
  std::vector<Batches> out;
  for (auto& p : plans) {
    auto b = p->batchesForEpoch(epoch);
    EXPECT_TRUE(b.isOk()) << b.status().toString();
    out.push_back(*b);
  }
  const size_t world = plans.size();
  for (size_t r = 0; r < world; ++r) {
    EXPECT_EQ(out[r].size(), out[0].size()) << "rank " << r << " runs another number of steps";
    for (const auto& batch : out[r]) {
      if (batch.empty()) {
        EXPECT_LT(plans[0]->segment().size(), world)
            << "an empty batch in a segment of " << plans[0]->segment().size();
      }
    }
  }
  return out;
}

// Appends what every rank reads in steps [from, to) to `read`.
void consume(const std::vector<Batches>& batches, size_t from, size_t to,
             std::vector<size_t>& read) {
  for (const Batches& rank : batches) {
    for (size_t s = from; s < to && s < rank.size(); ++s) {
      read.insert(read.end(), rank[s].begin(), rank[s].end());
    }
  }
}

// The position every rank reports after `k` steps; they must be byte-for-byte the same.
ElasticPosition agreedPosition(const Plans& plans, size_t k) {
  auto first = plans[0]->position(k);
  EXPECT_TRUE(first.isOk()) << first.status().toString();
  for (size_t r = 1; r < plans.size(); ++r) {
    auto p = plans[r]->position(k);
    EXPECT_TRUE(p.isOk());
    EXPECT_EQ(p->serialize(), first->serialize()) << "rank " << r << " disagrees";
  }
  return *first;
}

void expectEachOnce(std::vector<size_t> read, size_t n) {
  std::sort(read.begin(), read.end());
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  EXPECT_EQ(read, all) << "the epoch's samples were not read exactly once";
}

TEST(ElasticPlan, AFreshEpochReadsEverySampleOnceWithEqualSteps) {
  for (size_t n : {1u, 5u, 17u, 100u, 257u}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (size_t batch : {1u, 3u, 8u}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " world=" << world << " batch=" << batch);
        Plans plans = makePlans(n, world, batch);
        std::vector<Batches> b = planEpoch(plans, 2);
        std::vector<size_t> read;
        consume(b, 0, b[0].size(), read);
        expectEachOnce(read, n);
        for (const Batches& rank : b) {
          for (const auto& batch_ : rank) {
            EXPECT_LE(batch_.size(), batch + 1);  // + 1 at most: a short tail joined a step
          }
        }
      }
    }
  }
}

TEST(ElasticPlan, EpochsAndSeedsGiveDifferentOrdersAndNoShuffleIsSequential) {
  Plans a = makePlans(64, 2, 4, 1);
  Plans b = makePlans(64, 2, 4, 2);
  EXPECT_NE(planEpoch(a, 0), planEpoch(a, 1));
  EXPECT_NE(planEpoch(a, 0), planEpoch(b, 0));
  EXPECT_EQ(planEpoch(a, 3), planEpoch(a, 3));
  ElasticPlanOptions o;
  o.numReplicas = 2;
  o.rank = 1;
  o.batchSize = 2;
  o.shuffle = false;
  auto p = ElasticBatchPlan::create(10, o);
  ASSERT_TRUE(p.isOk());
  auto batches = (*p)->batchesForEpoch(0);
  ASSERT_TRUE(batches.isOk());
  EXPECT_EQ(*batches, (Batches{{1, 3}, {5, 7}, {9}}));
}

// The scenario of an elastic job: 4 ranks read 5 steps of epoch 3 and a node is lost; 3 ranks
// resume and read 4 steps; a node joins, 4 ranks resume again, then 2 ranks finish.
TEST(ElasticPlan, ResumingOnOtherWorldSizesReadsTheRestExactlyOnce) {
  for (bool balanced : {false, true}) {
    SCOPED_TRACE(balanced ? "with complexities" : "plain");
    const size_t n = 203;
    std::vector<int64_t> cost = balanced ? testing::lognormalCosts(n, 3) : std::vector<int64_t>{};
    std::vector<size_t> read;
    Plans plans = makePlans(n, 4, 3, 11, cost, 0.1);
    std::vector<Batches> b = planEpoch(plans, 3);
    consume(b, 0, 5, read);
    ElasticPosition pos = agreedPosition(plans, 5);
    EXPECT_EQ(pos.remaining.size(), n - 4 * 3 * 5);
    EXPECT_EQ(pos.numReplicas, 4u);
    for (auto [world, steps] : std::vector<std::pair<int, size_t>>{{3, 4}, {4, 2}, {2, 1000}}) {
      // Through the bytes a checkpoint stores.
      auto parsed = ElasticPosition::parse(pos.serialize());
      ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
      plans = makePlans(n, world, 3, 11, cost, 0.1);
      for (auto& p : plans) {
        ASSERT_TRUE(p->resume(*parsed).isOk());
      }
      b = planEpoch(plans, 3);
      size_t k = std::min(steps, b[0].size());
      consume(b, 0, k, read);
      pos = agreedPosition(plans, k);
    }
    EXPECT_TRUE(pos.remaining.empty());
    expectEachOnce(read, n);
    // The next epoch starts whole again.
    std::vector<Batches> next = planEpoch(plans, 4);
    std::vector<size_t> all;
    consume(next, 0, next[0].size(), all);
    expectEachOnce(all, n);
  }
}

TEST(ElasticPlan, ResumingOnTheSameWorldContinuesTheUninterruptedOrder) {
  Plans plans = makePlans(100, 3, 4);
  std::vector<Batches> whole = planEpoch(plans, 1);
  ElasticPosition pos = agreedPosition(plans, 3);
  Plans again = makePlans(100, 3, 4);
  for (auto& p : again) {
    ASSERT_TRUE(p->resume(pos).isOk());
  }
  std::vector<Batches> rest = planEpoch(again, 1);
  for (size_t r = 0; r < 3; ++r) {
    Batches tail(whole[r].begin() + 3, whole[r].end());
    EXPECT_EQ(rest[r], tail) << "rank " << r;
  }
  // A position applies only to its epoch: planning another epoch ignores it.
  Plans other = makePlans(100, 3, 4);
  ASSERT_TRUE(other[0]->resume(pos).isOk());
  auto b = other[0]->batchesForEpoch(2);
  ASSERT_TRUE(b.isOk());
  std::vector<size_t> read;
  for (const auto& batch : *b) {
    read.insert(read.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(read.size(), 34u);  // rank 0's share of the whole epoch 2
}

// Load balancing: with R dividing N a fresh epoch is exactly the load-balancing sampler's order;
// after a re-cut on another world size the steps stay as balanced as a fresh epoch's, far
// better than the plain shuffled plan.
TEST(ElasticPlan, ComplexitiesKeepStepsBalancedAfterAReCut) {
  const size_t n = 960;
  std::vector<int64_t> cost = testing::lognormalCosts(n, 5);
  LoadBalancingOptions lo;
  lo.numReplicas = 4;
  lo.seed = 9;
  lo.randomLevel = 0.001;
  auto sampler = LoadBalancingDistributedSampler::create(cost, lo);
  ASSERT_TRUE(sampler.isOk());
  (*sampler)->setEpoch(6);
  Plans four = makePlans(n, 4, 2, 9, cost, 0.001);
  double freshRatio = testing::slowestOverMean(planEpoch(four, 6), cost);
  EXPECT_EQ(four[0]->segment(), (*sampler)->order());

  ElasticPosition pos = agreedPosition(four, 40);
  Plans three = makePlans(n, 3, 2, 9, cost, 0.001);
  Plans plain = makePlans(n, 3, 2, 9);
  for (auto& p : three) {
    ASSERT_TRUE(p->resume(pos).isOk());
  }
  for (auto& p : plain) {
    ASSERT_TRUE(p->resume(pos).isOk());
  }
  double balancedRatio = testing::slowestOverMean(planEpoch(three, 6), cost);
  double plainRatio = testing::slowestOverMean(planEpoch(plain, 6), cost);
  EXPECT_LT(balancedRatio, freshRatio + 0.03) << "slowest/mean step cost after a 4 -> 3 re-cut "
                                              << balancedRatio << ", fresh epoch " << freshRatio;
  EXPECT_GT(plainRatio, balancedRatio + 0.12) << "plain " << plainRatio;
}

TEST(ElasticPlan, BadOptionsAndPositionsAreClearErrors) {
  ElasticPlanOptions o;
  o.numReplicas = 2;
  o.rank = 2;
  auto bad = ElasticBatchPlan::create(10, o);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().toString().find("rank 2 is outside [0, 2)"), std::string::npos);
  o.rank = 0;
  o.batchSize = 0;
  EXPECT_FALSE(ElasticBatchPlan::create(10, o).isOk());
  o.batchSize = 1;
  EXPECT_FALSE(ElasticBatchPlan::create(0, o).isOk());
  o.complexities = {1, 2, 3};
  auto wrongCount = ElasticBatchPlan::create(10, o);
  ASSERT_FALSE(wrongCount.isOk());
  EXPECT_NE(wrongCount.status().toString().find("3 complexities for a dataset of 10"),
            std::string::npos);
  o.complexities.clear();

  auto plan = ElasticBatchPlan::create(10, o);
  ASSERT_TRUE(plan.isOk());
  EXPECT_EQ((*plan)->position(0).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*plan)->batchesForEpoch(0).isOk());
  EXPECT_EQ((*plan)->position(6).status().code(), StatusCode::kInvalidArgument);
  auto pos = (*plan)->position(2);
  ASSERT_TRUE(pos.isOk());

  ElasticPosition other = *pos;
  other.datasetSize = 11;
  EXPECT_NE((*plan)->resume(other).toString().find("dataset of 11 samples"), std::string::npos);
  other = *pos;
  other.seed = 5;
  EXPECT_NE((*plan)->resume(other).toString().find("seed 5"), std::string::npos);
  other = *pos;
  other.remaining.push_back(other.remaining.front());
  EXPECT_NE((*plan)->resume(other).toString().find("twice"), std::string::npos);
  other = *pos;
  other.remaining.push_back(10);
  EXPECT_NE((*plan)->resume(other).toString().find("sample 10 of a dataset of 10"),
            std::string::npos);

  std::vector<uint8_t> bytes = pos->serialize();
  EXPECT_FALSE(ElasticPosition::parse(std::span(bytes).first(bytes.size() - 1)).isOk());
  bytes.push_back(0);
  EXPECT_FALSE(ElasticPosition::parse(bytes).isOk());
  bytes.pop_back();
  bytes[0] ^= 1;
  EXPECT_NE(ElasticPosition::parse(bytes).status().toString().find("bad magic"), std::string::npos);
}

}  // namespace
}  // namespace bagua::loader
