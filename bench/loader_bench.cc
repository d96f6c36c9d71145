// Loader benchmarks.
//
// BM_StepBalance: how much longer a synchronous training step takes than perfectly balanced
// work, sum over steps of (slowest rank's cost) / sum of (mean cost), on lognormal token counts
// (mu 5, sigma 1: median 148 tokens, a tail into the thousands), 128 Ki samples. Peers in the
// same run: the plain distributed sampler (PyTorch semantics) against the load-balancing
// sampler, with fixed batches of 32 per rank, and the load-balancing batch sampler with a token
// budget of 32 x the mean cost. Counter `slowest_over_mean` (1.0 = perfect); the time is that
// of computing one epoch's order for all ranks.
//
// BM_LoaderThroughput: samples/s through the DataLoader over a dataset whose reads take 100 us
// each (a storage or cache round trip) plus 4 KiB of byte work, while the consumer spends 5 ms
// per batch of 32 (a training step that does not use the CPU, like a GPU step). workers = 0 is
// the loader without prefetch (each batch read in next()); the others prefetch 8 batches.
#include <benchmark/benchmark.h>

#include <chrono>
#include <thread>

#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/data_loader.h"
#include "bagua/loader/random.h"

namespace {

using namespace bagua::loader;

constexpr size_t kSamples = 131072;
constexpr size_t kBatch = 32;

const std::vector<int64_t>& tokenCounts() {
  static const std::vector<int64_t> costs = [] {
    Rng rng(2024);
    std::vector<int64_t> c(kSamples);
    for (auto& x : c) {
      x = 1 + static_cast<int64_t>(rng.logNormal(5.0, 1.0));
    }
    return c;
  }();
  return costs;
}

double slowestOverMean(const std::vector<Batches>& perRank, const std::vector<int64_t>& cost) {
  double sumMax = 0;
  double sumMean = 0;
  for (size_t s = 0; s < perRank[0].size(); ++s) {
    double mx = 0;
    double total = 0;
    for (const Batches& b : perRank) {
      double c = 0;
      for (size_t i : b[s]) {
        c += static_cast<double>(cost[i]);
      }
      mx = std::max(mx, c);
      total += c;
    }
    sumMax += mx;
    sumMean += total / static_cast<double>(perRank.size());
  }
  return sumMax / sumMean;
}

Batches fixedBatches(const std::vector<size_t>& idx) {
  Batches out;
  for (size_t b = 0; b + kBatch <= idx.size(); b += kBatch) {
    out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(b),
                     idx.begin() + static_cast<std::ptrdiff_t>(b + kBatch));
  }
  return out;
}

enum Kind : int64_t { kPlain = 0, kBalanced = 1, kBalancedTokenBudget = 2 };

void BM_StepBalance(benchmark::State& state) {
  const auto kind = static_cast<Kind>(state.range(0));
  const int ranks = static_cast<int>(state.range(1));
  const std::vector<int64_t>& cost = tokenCounts();
  double mean = 0;
  for (int64_t c : cost) {
    mean += static_cast<double>(c);
  }
  mean /= static_cast<double>(cost.size());
  const auto budget = static_cast<int64_t>(mean * kBatch);

  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<LoadBalancingDistributedBatchSampler> batcher;
  if (kind == kPlain) {
    SamplerOptions o;
    o.numReplicas = ranks;
    o.seed = 1;
    sampler = std::move(DistributedSampler::create(cost.size(), o).value());
  } else {
    LoadBalancingOptions o;
    o.numReplicas = ranks;
    o.seed = 1;
    auto lb = std::move(LoadBalancingDistributedSampler::create(cost, o).value());
    if (kind == kBalancedTokenBudget) {
      batcher = std::move(
          LoadBalancingDistributedBatchSampler::create(*lb, costBudgetBatchFn(cost, budget), true)
              .value());
    }
    sampler = std::move(lb);
  }
  double ratioSum = 0;
  double steps = 0;
  uint64_t epoch = 0;
  for (auto _ : state) {
    std::vector<Batches> perRank(static_cast<size_t>(ranks));
    if (batcher) {
      if (!batcher->setEpoch(epoch).isOk()) {
        state.SkipWithError("batch sampler failed");
        return;
      }
      for (int r = 0; r < ranks; ++r) {
        perRank[static_cast<size_t>(r)] = batcher->batchesOf(r);
      }
    } else {
      sampler->setEpoch(epoch);
      for (int r = 0; r < ranks; ++r) {
        perRank[static_cast<size_t>(r)] = fixedBatches(sampler->indicesOf(r));
      }
    }
    ++epoch;
    state.PauseTiming();
    ratioSum += slowestOverMean(perRank, cost);
    steps = static_cast<double>(perRank[0].size());
    state.ResumeTiming();
  }
  state.counters["slowest_over_mean"] = ratioSum / static_cast<double>(state.iterations());
  state.counters["steps"] = steps;
  state.SetLabel(kind == kPlain ? "plain" : kind == kBalanced ? "balanced" : "balanced+tokens");
}
BENCHMARK(BM_StepBalance)
    ->ArgNames({"kind", "ranks"})
    ->ArgsProduct({{kPlain, kBalanced, kBalancedTokenBudget}, {8, 64}})
    ->Unit(benchmark::kMillisecond);

class SlowDataset final : public Dataset {
 public:
  size_t size() const override { return 4096; }
  bagua::Status get(size_t index, Sample& out) const override {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    out.resize(4096);
    uint32_t h = static_cast<uint32_t>(index) * 2654435761u;
    for (auto& b : out) {
      h = h * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(h >> 24);
    }
    return bagua::Status::ok();
  }
};

void BM_LoaderThroughput(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const bool train = state.range(1) != 0;
  SlowDataset ds;
  SamplerOptions so;
  so.seed = 3;
  auto sampler = std::move(DistributedSampler::create(ds.size(), so).value());
  auto plan = std::move(FixedSizeBatchPlan::create(*sampler, kBatch, true).value());
  LoaderOptions lo;
  lo.numWorkers = workers;
  lo.prefetchBatches = 8;
  lo.progress = false;
  auto loader = std::move(DataLoader::create(ds, *plan, concatCollate(), lo).value());
  uint64_t epoch = 0;
  int64_t samples = 0;
  if (!loader->startEpoch(epoch).isOk()) {
    state.SkipWithError("startEpoch failed");
    return;
  }
  for (auto _ : state) {
    auto b = loader->next();
    if (!b.isOk()) {
      state.SkipWithError("next failed");
      return;
    }
    if (!b->has_value()) {
      state.PauseTiming();
      if (!loader->startEpoch(++epoch).isOk()) {
        state.SkipWithError("startEpoch failed");
        return;
      }
      state.ResumeTiming();
      continue;
    }
    samples += static_cast<int64_t>((*b)->indices.size());
    benchmark::DoNotOptimize((*b)->data.data());
    if (train) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  state.SetItemsProcessed(samples);
  state.SetLabel(workers == 0 ? "no prefetch" : "prefetch 8");
}
BENCHMARK(BM_LoaderThroughput)
    ->ArgNames({"workers", "train"})
    ->ArgsProduct({{0, 1, 2, 4}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
