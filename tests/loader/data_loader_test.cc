#include "bagua/loader/data_loader.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

#include <gtest/gtest.h>

#include "bagua/loader/elastic_plan.h"
#include "bagua/loader/params.h"
#include "bagua_config.h"
#include "loader_test_util.h"

#if BAGUA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace bagua::loader {
namespace {

using Clock = std::chrono::steady_clock;

// Sample i: 1 + i % 13 bytes, byte k = (i * 31 + k * 7) & 0xff, so a misplaced sample or byte is
// caught.
Sample patternSample(size_t i) {
  Sample s(1 + i % 13, '\0');
  for (size_t k = 0; k < s.size(); ++k) {
    s[k] = static_cast<char>((i * 31 + k * 7) & 0xff);
  }
  return s;
}

std::vector<Sample> patternSamples(size_t n) {
  std::vector<Sample> v;
  for (size_t i = 0; i < n; ++i) {
    v.push_back(patternSample(i));
  }
  return v;
}

// Counts reads; optionally fails or stalls on one index.
class InstrumentedDataset final : public Dataset {
 public:
  explicit InstrumentedDataset(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  Status get(size_t index, Sample& out) const override {
    reads_.fetch_add(1, std::memory_order_relaxed);
    if (index == failAt_) {
      return BAGUA_ERROR(kSystemError, "disk read error");
    }
    if (index == stallAt_) {
      std::this_thread::sleep_for(stall_);
    }
    if (delayPerRead_.count() > 0) {
      std::this_thread::sleep_for(delayPerRead_);
    }
    out = patternSample(index);
    return Status::ok();
  }
  size_t reads() const { return reads_.load(std::memory_order_relaxed); }

  size_t failAt_ = SIZE_MAX;
  size_t stallAt_ = SIZE_MAX;
  std::chrono::milliseconds stall_{0};
  std::chrono::microseconds delayPerRead_{0};

 private:
  size_t n_;
  mutable std::atomic<size_t> reads_{0};
};

// A cache-like wrapper (what bagua::cache provides): serves from memory after the first read.
class CachingDataset final : public Dataset {
 public:
  explicit CachingDataset(const Dataset& inner) : inner_(inner) {}
  size_t size() const override { return inner_.size(); }
  Status get(size_t index, Sample& out) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(index);
      if (it != cache_.end()) {
        out = it->second;
        return Status::ok();
      }
    }
    BAGUA_RETURN_IF_ERROR(inner_.get(index, out));
    std::lock_guard<std::mutex> lock(mu_);
    cache_.emplace(index, out);
    return Status::ok();
  }

 private:
  const Dataset& inner_;
  mutable std::mutex mu_;
  mutable std::unordered_map<size_t, Sample> cache_;
};

void expectBatchMatches(const Batch& b, const std::vector<size_t>& wantIndices) {
  ASSERT_EQ(b.indices, wantIndices);
  ASSERT_EQ(b.offsets.size(), wantIndices.size() + 1);
  size_t at = 0;
  for (size_t k = 0; k < wantIndices.size(); ++k) {
    Sample want = patternSample(wantIndices[k]);
    ASSERT_EQ(b.offsets[k], at);
    ASSERT_EQ(0, std::memcmp(b.data.data() + at, want.data(), want.size()))
        << "sample " << wantIndices[k] << " in batch " << b.step;
    at += want.size();
  }
  ASSERT_EQ(b.offsets.back(), at);
  ASSERT_EQ(b.data.size(), at);
}

struct Plan {
  std::unique_ptr<LoadBalancingDistributedSampler> sampler;
  std::unique_ptr<LoadBalancingDistributedBatchSampler> plan;
};

Plan makePlan(size_t n, uint64_t seed = 1) {
  std::vector<int64_t> cost(n);
  for (size_t i = 0; i < n; ++i) {
    cost[i] = static_cast<int64_t>(1 + i % 13);
  }
  LoadBalancingOptions o;
  o.numReplicas = 2;
  o.rank = 1;
  o.seed = seed;
  Plan s;
  s.sampler = LoadBalancingDistributedSampler::create(cost, o).value();
  s.plan =
      LoadBalancingDistributedBatchSampler::create(*s.sampler, fixedSizeBatchFn(5), false).value();
  return s;
}

LoaderOptions opts(int workers, int prefetch) {
  LoaderOptions o;
  o.numWorkers = workers;
  o.prefetchBatches = prefetch;
  o.timeoutSeconds = 20;
  o.progress = false;
  return o;
}

std::vector<Batch> drain(DataLoader& l) {
  std::vector<Batch> out;
  for (;;) {
    auto b = l.next();
    EXPECT_TRUE(b.isOk()) << b.status().toString();
    if (!b.isOk() || !b->has_value()) {
      break;
    }
    out.push_back(std::move(**b));
  }
  return out;
}

TEST(DataLoader, YieldsThePlanInOrderForAnyWorkerCount) {
  VectorDataset ds(patternSamples(203));
  for (int workers : {0, 1, 3}) {
    for (int prefetch : {1, 2, 8}) {
      Plan s = makePlan(ds.size());
      auto l = DataLoader::create(ds, *s.plan, concatCollate(), opts(workers, prefetch));
      ASSERT_TRUE(l.isOk()) << l.status().toString();
      for (uint64_t epoch : {0u, 1u}) {
        ASSERT_TRUE((*l)->startEpoch(epoch).isOk());
        Batches want = s.plan->batches();
        ASSERT_EQ((*l)->numBatches(), want.size());
        std::vector<Batch> got = drain(**l);
        ASSERT_EQ(got.size(), want.size()) << workers << " workers, prefetch " << prefetch;
        for (size_t k = 0; k < got.size(); ++k) {
          EXPECT_EQ(got[k].step, k);
          EXPECT_EQ(got[k].epoch, epoch);
          expectBatchMatches(got[k], want[k]);
        }
        // After the end, next() keeps saying so.
        auto after = (*l)->next();
        ASSERT_TRUE(after.isOk());
        EXPECT_FALSE(after->has_value());
      }
    }
  }
}

TEST(DataLoader, SameSeedSameOrderAndEpochsDiffer) {
  VectorDataset ds(patternSamples(300));
  Plan a = makePlan(ds.size(), 7);
  Plan b = makePlan(ds.size(), 7);
  auto la = DataLoader::create(ds, *a.plan, concatCollate(), opts(2, 3));
  auto lb = DataLoader::create(ds, *b.plan, concatCollate(), opts(3, 1));
  ASSERT_TRUE(la.isOk() && lb.isOk());
  ASSERT_TRUE((*la)->startEpoch(4).isOk());
  ASSERT_TRUE((*lb)->startEpoch(4).isOk());
  std::vector<Batch> x = drain(**la);
  std::vector<Batch> y = drain(**lb);
  ASSERT_EQ(x.size(), y.size());
  for (size_t k = 0; k < x.size(); ++k) {
    EXPECT_EQ(x[k].indices, y[k].indices);
  }
  ASSERT_TRUE((*la)->startEpoch(5).isOk());
  std::vector<Batch> z = drain(**la);
  ASSERT_EQ(z.size(), x.size());
  bool differ = false;
  for (size_t k = 0; k < z.size(); ++k) {
    differ = differ || z[k].indices != x[k].indices;
  }
  EXPECT_TRUE(differ);
}

TEST(DataLoader, PrefetchIsBounded) {
  InstrumentedDataset ds(400);
  Plan s = makePlan(ds.size());
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), opts(3, 4));
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  // Without consuming, the workers fill exactly 4 batches of 5 samples, then stop.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (ds.reads() < 20 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(ds.reads(), 20u);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(ds.reads(), 20u) << "workers read past the prefetch window";
  // Consuming one batch lets exactly one more be read.
  auto b = (*l)->next();
  ASSERT_TRUE(b.isOk() && b->has_value());
  const auto deadline2 = Clock::now() + std::chrono::seconds(10);
  while (ds.reads() < 25 && Clock::now() < deadline2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(ds.reads(), 25u);
}

TEST(DataLoader, ADatasetErrorIsReportedForItsBatchAndTheEpochGoesOn) {
  InstrumentedDataset ds(200);
  Plan s = makePlan(ds.size());
  // Fail on an index this rank reads, in the middle of the epoch.
  Batches plan = *s.plan->batchesForEpoch(0);
  ds.failAt_ = plan[7][2];
  for (int workers : {0, 2}) {
    auto l = DataLoader::create(ds, *s.plan, concatCollate(), opts(workers, 3));
    ASSERT_TRUE(l.isOk());
    ASSERT_TRUE((*l)->startEpoch(0).isOk());
    size_t good = 0;
    size_t bad = 0;
    for (size_t k = 0; k < plan.size(); ++k) {
      auto b = (*l)->next();
      if (!b.isOk()) {
        ++bad;
        EXPECT_EQ(k, 7u);
        EXPECT_EQ(b.status().code(), StatusCode::kSystemError);
        EXPECT_NE(b.status().message().find("disk read error"), std::string::npos);
        EXPECT_NE(b.status().message().find(strPrintf("batch 7: reading sample %zu", ds.failAt_)),
                  std::string::npos)
            << b.status().toString();
        continue;
      }
      ASSERT_TRUE(b->has_value());
      expectBatchMatches(**b, plan[k]);
      ++good;
    }
    EXPECT_EQ(bad, 1u);
    EXPECT_EQ(good, plan.size() - 1);
  }
}

TEST(DataLoader, CollateErrorsCarryContext) {
  VectorDataset ds(patternSamples(50));
  Plan s = makePlan(ds.size());
  CollateFn failing = [](std::span<const Sample>, HostAllocator&, Batch& b) -> Status {
    if (b.step == 2) {
      return BAGUA_ERROR(kInvalidArgument, "ragged batch");
    }
    return Status::ok();
  };
  auto l = DataLoader::create(ds, *s.plan, failing, opts(2, 2));
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  ASSERT_TRUE((*l)->next().isOk());
  ASSERT_TRUE((*l)->next().isOk());
  auto third = (*l)->next();
  ASSERT_FALSE(third.isOk());
  EXPECT_NE(third.status().message().find("batch 2: collate"), std::string::npos);
  EXPECT_NE(third.status().message().find("ragged batch"), std::string::npos);
}

TEST(DataLoader, AStuckReadTimesOutAndShutdownStillCompletes) {
  InstrumentedDataset ds(100);
  Plan s = makePlan(ds.size());
  Batches plan = *s.plan->batchesForEpoch(0);
  ds.stallAt_ = plan[0][0];
  ds.stall_ = std::chrono::milliseconds(600);
  LoaderOptions o = opts(2, 2);
  o.timeoutSeconds = 0.05;
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), o);
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  auto t0 = Clock::now();
  auto b = (*l)->next();
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(b.status().message().find("BAGUA_LOADER_TIMEOUT"), std::string::npos);
  // Bounds against a hang only: the read stalls 0.6 s, the timeout is 0.05 s.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  auto t1 = Clock::now();
  l->reset();  // joins the worker still inside the stalled read
  EXPECT_LT(Clock::now() - t1, std::chrono::seconds(10));
}

TEST(DataLoader, RestartingAnEpochMidwayGivesTheNewEpochExactly) {
  VectorDataset ds(patternSamples(250));
  Plan s = makePlan(ds.size());
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), opts(3, 4));
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  ASSERT_TRUE((*l)->next().isOk());
  ASSERT_TRUE((*l)->next().isOk());
  ASSERT_TRUE((*l)->startEpoch(1).isOk());
  Batches want = s.plan->batches();
  std::vector<Batch> got = drain(**l);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].epoch, 1u);
    expectBatchMatches(got[k], want[k]);
  }
}

// Exact resume on another world size with the loader in the loop: 3 ranks each take 4 batches
// (the loader has prefetched more), save the plan's position at the loader's count, and 2 ranks
// resume the epoch from it through new loaders. Every sample of the epoch arrives exactly once,
// with its own bytes.
TEST(DataLoader, AnElasticPlanResumesOnAnotherWorldSizeThroughTheLoader) {
  VectorDataset ds(patternSamples(211));
  auto makeRank = [&](int world, int rank) {
    ElasticPlanOptions o;
    o.numReplicas = world;
    o.rank = rank;
    o.batchSize = 5;
    o.seed = 3;
    return ElasticBatchPlan::create(ds.size(), o).value();
  };
  std::vector<size_t> seen;
  std::vector<uint8_t> saved;
  for (int r = 0; r < 3; ++r) {
    auto plan = makeRank(3, r);
    auto l = DataLoader::create(ds, *plan, concatCollate(), opts(2, 6));
    ASSERT_TRUE(l.isOk());
    ASSERT_TRUE((*l)->startEpoch(2).isOk());
    for (int k = 0; k < 4; ++k) {
      auto b = (*l)->next();
      ASSERT_TRUE(b.isOk() && b->has_value());
      expectBatchMatches(**b, plan->batchOf(r, k));
      seen.insert(seen.end(), (*b)->indices.begin(), (*b)->indices.end());
    }
    auto pos = plan->position((*l)->position().batchesConsumed);
    ASSERT_TRUE(pos.isOk());
    if (r == 0) {
      saved = pos->serialize();
    }
    EXPECT_EQ(pos->serialize(), saved) << "rank " << r << " saved another position";
  }
  auto pos = ElasticPosition::parse(saved);
  ASSERT_TRUE(pos.isOk());
  EXPECT_EQ(pos->remaining.size(), 211u - 3 * 4 * 5);
  for (int r = 0; r < 2; ++r) {
    auto plan = makeRank(2, r);
    ASSERT_TRUE(plan->resume(*pos).isOk());
    auto l = DataLoader::create(ds, *plan, concatCollate(), opts(3, 2));
    ASSERT_TRUE(l.isOk());
    ASSERT_TRUE((*l)->startEpoch(2).isOk());
    std::vector<Batch> got = drain(**l);
    ASSERT_EQ(got.size(), plan->numSteps());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].epoch, 2u);
      expectBatchMatches(got[k], plan->batchOf(r, k));
      seen.insert(seen.end(), got[k].indices.begin(), got[k].indices.end());
    }
  }
  std::sort(seen.begin(), seen.end());
  std::vector<size_t> all(ds.size());
  std::iota(all.begin(), all.end(), size_t{0});
  EXPECT_EQ(seen, all);
}

TEST(DataLoader, DestroyingWithAFullPrefetchWindowIsPrompt) {
  InstrumentedDataset ds(500);
  ds.delayPerRead_ = std::chrono::microseconds(200);
  Plan s = makePlan(ds.size());
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), opts(4, 8));
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  ASSERT_TRUE((*l)->next().isOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = Clock::now();
  l->reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10)) << "a bound against a hang";
}

TEST(DataLoader, WorksOverACachingDataset) {
  InstrumentedDataset backing(180);
  CachingDataset cached(backing);
  Plan s = makePlan(cached.size());
  auto l = DataLoader::create(cached, *s.plan, concatCollate(), opts(2, 4));
  ASSERT_TRUE(l.isOk());
  for (uint64_t epoch : {0u, 1u, 2u}) {
    ASSERT_TRUE((*l)->startEpoch(epoch).isOk());
    Batches want = s.plan->batches();
    std::vector<Batch> got = drain(**l);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      expectBatchMatches(got[k], want[k]);
    }
    if (epoch == 0) {
      // This rank reads 90 distinct samples (2 replicas, no padding needed).
      EXPECT_EQ(backing.reads(), 90u);
    }
  }
  EXPECT_EQ(backing.reads(), 90u) << "later epochs must be served from the cache";
}

TEST(DataLoader, PadCollateMakesAMatrix) {
  VectorDataset ds(patternSamples(40));
  Plan s = makePlan(ds.size());
  auto l = DataLoader::create(ds, *s.plan, padCollate(0xEE), opts(1, 2));
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  auto b = (*l)->next();
  ASSERT_TRUE(b.isOk() && b->has_value());
  const Batch& batch = **b;
  size_t width = batch.offsets.back();
  ASSERT_EQ(batch.data.size(), width * batch.indices.size());
  for (size_t k = 0; k < batch.indices.size(); ++k) {
    Sample want = patternSample(batch.indices[k]);
    EXPECT_EQ(batch.offsets[k], want.size());
    const uint8_t* row = batch.data.data() + k * width;
    EXPECT_EQ(0, std::memcmp(row, want.data(), want.size()));
    for (size_t j = want.size(); j < width; ++j) {
      EXPECT_EQ(row[j], 0xEE);
    }
  }
}

TEST(DataLoader, PinnedMemory) {
  VectorDataset ds(patternSamples(120));
  Plan s = makePlan(ds.size());
  LoaderOptions o = opts(2, 3);
  o.pinMemory = true;
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), o);
  ASSERT_TRUE(l.isOk());
  EXPECT_TRUE((*l)->allocator().pinned());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  auto b = (*l)->next();
  if (!b.isOk() && b.status().code() == StatusCode::kResourceExhausted) {
    GTEST_SKIP() << "page-locked memory unavailable here: " << b.status().message();
  }
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  ASSERT_TRUE(b->has_value());
  EXPECT_TRUE((*b)->data.pinned());
  expectBatchMatches(**b, s.plan->batches()[0]);
  std::vector<Batch> rest = drain(**l);
  EXPECT_EQ(rest.size() + 1, s.plan->batches().size());
  // A batch may outlive its loader (the pinned block cache lives for the process).
  Batch kept = std::move(**b);
  l->reset();
  expectBatchMatches(kept, s.plan->batches()[0]);
}

TEST(DataLoader, PinnedBatchesCopyToTheGpu) {
#if BAGUA_HAVE_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device visible: the cudaHostAlloc path runs on the GPU machine";
  }
  HostAllocator& pinned = pinnedHostAllocator();
  EXPECT_STREQ(pinned.name(), "cudaHostAlloc");
  VectorDataset ds(patternSamples(120));
  Plan s = makePlan(ds.size());
  LoaderOptions o = opts(2, 3);
  o.pinMemory = true;
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), o);
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(0).isOk());
  auto b = (*l)->next();
  ASSERT_TRUE(b.isOk() && b->has_value()) << b.status().toString();
  const Batch& batch = **b;
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, batch.data.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "batch memory is not CUDA page-locked";
  // Round trip through the device with asynchronous copies from the pinned buffer.
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, batch.data.size()), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<uint8_t> back(batch.data.size());
  EXPECT_EQ(
      cudaMemcpyAsync(dev, batch.data.data(), batch.data.size(), cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(back.data(), dev, back.size(), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(0, std::memcmp(back.data(), batch.data.data(), back.size()));
  cudaStreamDestroy(stream);
  cudaFree(dev);
#else
  GTEST_SKIP() << "bagua built without CUDA";
#endif
}

TEST(Dataset, InMemoryAndFunctionDatasetsCheckTheIndex) {
  VectorDataset v(patternSamples(3));
  Sample out;
  ASSERT_TRUE(v.get(2, out).isOk());
  EXPECT_EQ(out, patternSample(2));
  Status bad = v.get(3, out);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("index 3 out of range"), std::string::npos);
  FunctionDataset f(5, [](size_t i, Sample& s) {
    s = patternSample(i * 2);
    return Status::ok();
  });
  EXPECT_EQ(f.size(), 5u);
  ASSERT_TRUE(f.get(4, out).isOk());
  EXPECT_EQ(out, patternSample(8));
  EXPECT_FALSE(f.get(5, out).isOk());
}

TEST(CachingHostAllocator, ReusesFreedBlocks) {
  CachingHostAllocator a(defaultHostAllocator(), 1 << 20);
  void* p = *a.allocate(1000);
  a.deallocate(p, 1000);
  EXPECT_EQ(a.cachedBytes(), 1000u);
  void* q = *a.allocate(1000);
  EXPECT_EQ(p, q);
  EXPECT_EQ(a.hits(), 1u);
  void* r = *a.allocate(2000);
  a.deallocate(q, 1000);
  a.deallocate(r, 2000);
  EXPECT_EQ(a.cachedBytes(), 3000u);
  CachingHostAllocator tiny(defaultHostAllocator(), 10);
  void* big = *tiny.allocate(100);
  tiny.deallocate(big, 100);
  EXPECT_EQ(tiny.cachedBytes(), 0u);
}

TEST(DataLoader, ParametersComeFromTheCatalogueUnlessSetByTheApi) {
  VectorDataset ds(patternSamples(30));
  Plan s = makePlan(ds.size());
  {
    ScopedEnvForTesting env(loaderParams(), {{"BAGUA_LOADER_NUM_WORKERS", "3"},
                                             {"BAGUA_LOADER_PREFETCH_BATCHES", "5"}});
    auto l = DataLoader::create(ds, *s.plan, concatCollate(), {});
    ASSERT_TRUE(l.isOk()) << l.status().toString();
    EXPECT_EQ((*l)->numWorkers(), 3);
    EXPECT_EQ((*l)->prefetchBatches(), 5);
    LoaderOptions o;
    o.numWorkers = 1;
    auto api = DataLoader::create(ds, *s.plan, concatCollate(), o);
    ASSERT_TRUE(api.isOk());
    EXPECT_EQ((*api)->numWorkers(), 1);
  }
  {
    ScopedEnvForTesting env(loaderParams(), {{"BAGUA_LOADER_NUM_WORKERS", "many"}});
    auto l = DataLoader::create(ds, *s.plan, concatCollate(), {});
    ASSERT_FALSE(l.isOk());
    EXPECT_NE(l.status().message().find("BAGUA_LOADER_NUM_WORKERS"), std::string::npos);
  }
}

TEST(DataLoader, BadUseIsRejected) {
  VectorDataset ds(patternSamples(30));
  Plan s = makePlan(ds.size());
  EXPECT_FALSE(DataLoader::create(ds, *s.plan, CollateFn(), opts(1, 1)).isOk());
  EXPECT_FALSE(DataLoader::create(ds, *s.plan, concatCollate(), opts(-1, 1)).isOk());
  EXPECT_FALSE(DataLoader::create(ds, *s.plan, concatCollate(), opts(1, 0)).isOk());
  VectorDataset empty({});
  EXPECT_FALSE(DataLoader::create(empty, *s.plan, concatCollate(), opts(1, 1)).isOk());
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), opts(1, 1));
  ASSERT_TRUE(l.isOk());
  auto early = (*l)->next();
  ASSERT_FALSE(early.isOk());
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
}

TEST(DataLoader, ShowsProgressWhenAsked) {
  VectorDataset ds(patternSamples(100));
  Plan s = makePlan(ds.size());
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  LoaderOptions o = opts(2, 2);
  o.progress = true;
  o.progressOut = f;
  o.progressOptions.mode = ProgressOptions::Mode::kLines;
  o.progressOptions.lineIntervalSeconds = 0;
  auto l = DataLoader::create(ds, *s.plan, concatCollate(), o);
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(3).isOk());
  std::vector<Batch> got = drain(**l);
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), f) != nullptr) {
    text += buf;
  }
  std::fclose(f);
  EXPECT_NE(text.find("epoch 3"), std::string::npos) << text;
  EXPECT_NE(text.find("50/50 samples  100.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("samples/s"), std::string::npos);
}

}  // namespace
}  // namespace bagua::loader
