#include "bagua/loader/batch_sampler.h"

#include <algorithm>
#include <map>

#include <gtest/gtest.h>

#include "loader_test_util.h"

namespace bagua::loader {
namespace {

using testing::lognormalCosts;
using testing::slowestOverMean;

LoadBalancingOptions lbOptions(int replicas, int rank, bool shuffle = true, uint64_t seed = 0) {
  LoadBalancingOptions o;
  o.numReplicas = replicas;
  o.rank = rank;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

TEST(LoadBalancingBatchSampler, BaguaCaseGrowingBatchSizes) {
  // Bagua's test: one replica, no shuffle, complexity = a permutation value, batch_fn giving
  // batch sizes 1, 2, 3, ...: batch i has i + 1 items and starts at complexity cur_idx.
  const size_t n = 55;
  Rng rng(2);
  std::vector<size_t> perm = rng.permutation(n);
  std::vector<int64_t> cost(n);
  for (size_t i = 0; i < n; ++i) {
    cost[i] = static_cast<int64_t>(perm[i]);
  }
  auto s = LoadBalancingDistributedSampler::create(cost, lbOptions(1, 0, false));
  ASSERT_TRUE(s.isOk());
  BatchFn growing = [](const std::vector<size_t>& idx) -> Result<Batches> {
    Batches out;
    size_t at = 0;
    for (size_t size = 1; at < idx.size(); ++size) {
      size_t end = std::min(idx.size(), at + size);
      out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(at),
                       idx.begin() + static_cast<std::ptrdiff_t>(end));
      at = end;
    }
    return out;
  };
  auto b = LoadBalancingDistributedBatchSampler::create(**s, growing, false);
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_EQ((*b)->numBatches(), 10u);  // 1 + 2 + ... + 10 = 55
  int64_t curIdx = 0;
  for (size_t i = 0; i < (*b)->numBatches(); ++i) {
    const std::vector<size_t>& batch = (*b)->batches()[i];
    ASSERT_EQ(batch.size(), i + 1);
    EXPECT_EQ(cost[batch[0]], curIdx);
    curIdx += static_cast<int64_t>(batch.size());
  }
}

// A batch function that gives rank-dependent batch counts: batch size = 1 + (first index % k).
BatchFn unevenBatchFn(size_t k) {
  return [k](const std::vector<size_t>& idx) -> Result<Batches> {
    Batches out;
    size_t at = 0;
    while (at < idx.size()) {
      size_t size = 1 + idx[at] % k;
      size_t end = std::min(idx.size(), at + size);
      out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(at),
                       idx.begin() + static_cast<std::ptrdiff_t>(end));
      at = end;
    }
    return out;
  };
}

TEST(LoadBalancingBatchSampler, AllRanksAgreeOnTheBatchCountWithAndWithoutDropLast) {
  const size_t n = 999;
  std::vector<int64_t> cost = lognormalCosts(n, 4);
  for (bool dropLast : {false, true}) {
    for (int r : {2, 5, 8}) {
      std::vector<std::unique_ptr<LoadBalancingDistributedSampler>> samplers;
      std::vector<std::unique_ptr<LoadBalancingDistributedBatchSampler>> batchers;
      for (int rank = 0; rank < r; ++rank) {
        auto s = LoadBalancingDistributedSampler::create(cost, lbOptions(r, rank, true, 9));
        ASSERT_TRUE(s.isOk());
        samplers.push_back(std::move(*s));
        auto b = LoadBalancingDistributedBatchSampler::create(*samplers.back(), unevenBatchFn(7),
                                                              dropLast);
        ASSERT_TRUE(b.isOk()) << b.status().toString();
        batchers.push_back(std::move(*b));
      }
      for (uint64_t epoch : {0u, 3u}) {
        std::vector<size_t> raw;  // what the batch fn gives each rank, before padding
        for (int rank = 0; rank < r; ++rank) {
          ASSERT_TRUE(batchers[static_cast<size_t>(rank)]->setEpoch(epoch).isOk());
          raw.push_back((*unevenBatchFn(7)(samplers[static_cast<size_t>(rank)]->indices())).size());
        }
        ASSERT_NE(*std::min_element(raw.begin(), raw.end()),
                  *std::max_element(raw.begin(), raw.end()))
            << "the test needs ranks with different batch counts";
        size_t want = dropLast ? *std::min_element(raw.begin(), raw.end())
                               : *std::max_element(raw.begin(), raw.end());
        for (int rank = 0; rank < r; ++rank) {
          auto& b = *batchers[static_cast<size_t>(rank)];
          EXPECT_EQ(b.numBatches(), want);
          ASSERT_EQ(b.batches().size(), want) << "rank " << rank << " dropLast " << dropLast;
          // Every rank agrees with every other rank's view of it.
          EXPECT_EQ(b.batches(), batchers[0]->batchesOf(rank));
          // The list is the batch fn's output, truncated or padded cyclically.
          Batches own = *unevenBatchFn(7)(samplers[static_cast<size_t>(rank)]->indices());
          for (size_t k = 0; k < want; ++k) {
            EXPECT_EQ(b.batches()[k], own[k % own.size()]);
          }
        }
      }
    }
  }
}

TEST(LoadBalancingBatchSampler, DropLastTruncatesWhereBaguaGrewTheList) {
  // Rank 0 gets 6 batches, rank 1 gets 2. Bagua with drop_last computed total = 2 and gave
  // rank 0 b + b[:-4] = 8 batches; we give both exactly 2.
  std::vector<int64_t> cost(12, 1);
  BatchFn fn = [](const std::vector<size_t>& idx) -> Result<Batches> {
    bool rank0 = std::find(idx.begin(), idx.end(), size_t{0}) != idx.end();
    if (rank0) {
      return fixedSizeBatchFn(1)(idx);
    }
    return fixedSizeBatchFn(3)(idx);
  };
  for (bool dropLast : {true, false}) {
    std::vector<size_t> counts;
    for (int rank = 0; rank < 2; ++rank) {
      auto s = LoadBalancingDistributedSampler::create(cost, lbOptions(2, rank, false));
      ASSERT_TRUE(s.isOk());
      auto b = LoadBalancingDistributedBatchSampler::create(**s, fn, dropLast);
      ASSERT_TRUE(b.isOk());
      counts.push_back((*b)->batches().size());
      EXPECT_EQ((*b)->batches().size(), (*b)->numBatches());
      if (!dropLast && rank == 1) {
        // A shortfall of 4 with only 2 batches of its own: padded cyclically, 2 -> 6.
        const Batches& got = (*b)->batches();
        for (size_t k = 2; k < got.size(); ++k) {
          EXPECT_EQ(got[k], got[k % 2]);
        }
      }
    }
    EXPECT_EQ(counts[0], counts[1]);
    EXPECT_EQ(counts[0], dropLast ? 2u : 6u);
  }
}

TEST(LoadBalancingBatchSampler, UnpaddedBatchesCoverEveryIndexOnce) {
  const size_t n = 640;
  std::vector<int64_t> cost = lognormalCosts(n, 6);
  std::map<size_t, int> seen;
  for (int rank = 0; rank < 4; ++rank) {
    auto s = LoadBalancingDistributedSampler::create(cost, lbOptions(4, rank, true, 3));
    ASSERT_TRUE(s.isOk());
    Batches own = *costBudgetBatchFn(cost, 2000)((*s)->indices());
    for (const auto& b : own) {
      int64_t sum = 0;
      for (size_t i : b) {
        ++seen[i];
        sum += cost[i];
      }
      EXPECT_TRUE(sum <= 2000 || b.size() == 1);
    }
  }
  EXPECT_EQ(seen.size(), n);
  for (auto& [i, k] : seen) {
    EXPECT_EQ(k, 1) << i;
  }
}

TEST(LoadBalancingBatchSampler, TokenBudgetBatchesAreBalancedAcrossRanks) {
  std::vector<int64_t> cost = lognormalCosts(8192, 12);
  const int r = 8;
  std::vector<Batches> perRank;
  for (int rank = 0; rank < r; ++rank) {
    auto s = LoadBalancingDistributedSampler::create(cost, lbOptions(r, rank, true, 3));
    ASSERT_TRUE(s.isOk());
    auto b = LoadBalancingDistributedBatchSampler::create(**s, costBudgetBatchFn(cost, 4096), true);
    ASSERT_TRUE(b.isOk());
    perRank.push_back((*b)->batches());
  }
  EXPECT_LT(slowestOverMean(perRank, cost), 1.05);
}

TEST(LoadBalancingBatchSampler, ErrorsNameTheCause) {
  std::vector<int64_t> cost(20, 1);
  LoadBalancingOptions o = lbOptions(2, 0);
  o.dropLast = true;
  auto dropping = LoadBalancingDistributedSampler::create(cost, o);
  ASSERT_TRUE(dropping.isOk());
  auto b = LoadBalancingDistributedBatchSampler::create(**dropping, fixedSizeBatchFn(2), false);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);

  auto s = LoadBalancingDistributedSampler::create(cost, lbOptions(2, 0));
  ASSERT_TRUE(s.isOk());
  auto failing = LoadBalancingDistributedBatchSampler::create(
      **s,
      [](const std::vector<size_t>& idx) -> Result<Batches> {
        if (std::find(idx.begin(), idx.end(), size_t{7}) != idx.end()) {
          return BAGUA_ERROR(kInvalidArgument, "cannot batch sample 7");
        }
        return fixedSizeBatchFn(2)(idx);
      },
      false);
  ASSERT_FALSE(failing.isOk());
  EXPECT_NE(failing.status().message().find("batch function failed for rank"), std::string::npos);
  EXPECT_NE(failing.status().message().find("cannot batch sample 7"), std::string::npos);

  auto foreign = LoadBalancingDistributedBatchSampler::create(
      **s, [](const std::vector<size_t>&) -> Result<Batches> { return Batches{{999}}; }, false);
  ASSERT_FALSE(foreign.isOk());
  EXPECT_NE(foreign.status().message().find("index 999"), std::string::npos);

  auto emptyBatch = LoadBalancingDistributedBatchSampler::create(
      **s, [](const std::vector<size_t>&) -> Result<Batches> { return Batches{{}}; }, false);
  EXPECT_FALSE(emptyBatch.isOk());

  EXPECT_FALSE(LoadBalancingDistributedBatchSampler::create(**s, BatchFn(), false).isOk());
  EXPECT_FALSE(costBudgetBatchFn(cost, 0)({1, 2}).isOk());
}

TEST(FixedSizeBatchPlan, GroupsTheSamplersIndices) {
  SamplerOptions o;
  o.numReplicas = 2;
  o.rank = 1;
  o.shuffle = false;
  auto s = DistributedSampler::create(11, o);
  ASSERT_TRUE(s.isOk());
  auto keep = FixedSizeBatchPlan::create(**s, 4, false);
  ASSERT_TRUE(keep.isOk());
  Batches b = *(*keep)->batchesForEpoch(0);
  // Rank 1 reads 1, 3, 5, 7, 9, 0 (padding).
  EXPECT_EQ(b, (Batches{{1, 3, 5, 7}, {9, 0}}));
  auto drop = FixedSizeBatchPlan::create(**s, 4, true);
  ASSERT_TRUE(drop.isOk());
  EXPECT_EQ(*(*drop)->batchesForEpoch(0), (Batches{{1, 3, 5, 7}}));
  EXPECT_FALSE(FixedSizeBatchPlan::create(**s, 0, false).isOk());
  EXPECT_FALSE(FixedSizeBatchPlan::create(**s, 7, true).isOk());
}

}  // namespace
}  // namespace bagua::loader
