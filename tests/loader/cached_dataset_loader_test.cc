// The data loader over the cached dataset (dataset_cache), as a job would use them together:
// worker threads read through the cache, the first epoch fills it from the (slow) source and
// later epochs never touch the source, with every byte of every batch checked.
#include <atomic>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "bagua/dataset_cache/cache.h"
#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/data_loader.h"
#include "bagua/loader/dataset.h"
#include "bagua/loader/sampler.h"

namespace bagua::loader {
namespace {

std::string expectedSample(size_t i) {
  std::string s = "sample-" + std::to_string(i) + "-";
  s.append(i % 97, static_cast<char>('a' + i % 26));
  return s;
}

// The expensive source: counts how often it is read.
class CountingSource final : public Dataset {
 public:
  explicit CountingSource(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  Status get(size_t index, Sample& sample) const override {
    reads_.fetch_add(1, std::memory_order_relaxed);
    sample = expectedSample(index);
    return Status::ok();
  }
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }

 private:
  size_t n_;
  mutable std::atomic<uint64_t> reads_{0};
};

TEST(LoaderOverCachedDataset, LaterEpochsAreServedFromTheCacheByteForByte) {
  constexpr size_t kSamples = 600;
  CountingSource source(kSamples);
  cache::CacheOptions options;  // the embedded backend, the default
  Result<std::shared_ptr<cache::CacheBackend>> backend = cache::makeBackend(options);
  ASSERT_TRUE(backend.isOk()) << backend.status().toString();
  // The cached dataset is the loader's dataset: one interface, no adapter.
  cache::CachedDataset dataset(source, *backend, "loader_test", /*writerBufferSize=*/16);

  SamplerOptions so;
  so.seed = 7;
  Result<std::unique_ptr<DistributedSampler>> sampler = DistributedSampler::create(kSamples, so);
  ASSERT_TRUE(sampler.isOk());
  Result<std::unique_ptr<FixedSizeBatchPlan>> plan =
      FixedSizeBatchPlan::create(**sampler, /*batchSize=*/32, /*dropLast=*/false);
  ASSERT_TRUE(plan.isOk());
  LoaderOptions lo;
  lo.numWorkers = 3;
  lo.prefetchBatches = 4;
  lo.timeoutSeconds = 20;
  lo.progress = false;
  Result<std::unique_ptr<DataLoader>> loader =
      DataLoader::create(dataset, **plan, concatCollate(), lo);
  ASSERT_TRUE(loader.isOk()) << loader.status().toString();

  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    ASSERT_TRUE((*loader)->startEpoch(epoch).isOk());
    size_t seen = 0;
    for (;;) {
      Result<std::optional<Batch>> b = (*loader)->next();
      ASSERT_TRUE(b.isOk()) << b.status().toString();
      if (!b->has_value()) {
        break;
      }
      const Batch& batch = **b;
      ASSERT_EQ(batch.offsets.size(), batch.indices.size() + 1);
      for (size_t k = 0; k < batch.indices.size(); ++k) {
        std::string got(reinterpret_cast<const char*>(batch.data.data()) + batch.offsets[k],
                        batch.offsets[k + 1] - batch.offsets[k]);
        ASSERT_EQ(got, expectedSample(batch.indices[k]))
            << "epoch " << epoch << " index " << batch.indices[k];
      }
      seen += batch.indices.size();
    }
    EXPECT_EQ(seen, kSamples) << "epoch " << epoch;
    ASSERT_TRUE(dataset.flush().isOk());
    // Only the first epoch reads the source.
    EXPECT_EQ(source.reads(), kSamples) << "after epoch " << epoch;
  }
  cache::CacheStats stats = dataset.stats();
  EXPECT_EQ(stats.misses, kSamples);
  EXPECT_EQ(stats.hits, 2 * kSamples);
}

}  // namespace
}  // namespace bagua::loader
