#include "bagua/dataset_cache/cached_dataset.h"

#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "cache_test_util.h"

namespace bagua::cache {
namespace {

using testing::makeEmbedded;
using testing::PatternDataset;
using testing::RecordingBackend;
using testing::WarnCounter;

TEST(CachedDataset, EverySampleIsCorrectOverSeveralEpochsAndLaterEpochsHit) {
  PatternDataset source(301);
  CachedDataset ds(source, makeEmbedded(), "ds", 20);
  ASSERT_EQ(ds.size(), 301u);
  std::string sample;
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (size_t i = 0; i < ds.size(); ++i) {
      ASSERT_TRUE(ds.get(i, sample).isOk());
      ASSERT_EQ(sample, source.expected(i)) << "epoch " << epoch << " sample " << i;
    }
    if (epoch == 0) {
      CacheStats s = ds.stats();
      EXPECT_EQ(s.misses, 301u);
      EXPECT_EQ(s.hits, 0u);
      // 15 full batches of 20 went out; 1 sample waits in the queue.
      EXPECT_EQ(s.writes, 300u);
    }
  }
  CacheStats s = ds.stats();
  // Sample 300 stays queued (the queue never fills again) until the 1000th read flushes it, in
  // the 4th epoch: it misses in epochs 1-3, then hits.
  EXPECT_EQ(s.hits + s.misses, 4u * 301u);
  EXPECT_EQ(s.misses, 303u);
  EXPECT_EQ(source.reads(300), 3u);
  uint64_t expectedBytes = 0;
  for (size_t i = 0; i < 301; ++i) {
    expectedBytes += source.expected(i).size();
  }
  EXPECT_EQ(s.hitBytes + s.missBytes, 4 * expectedBytes);
  for (size_t i = 0; i < 300; ++i) {
    EXPECT_EQ(source.reads(i), 1u) << "sample " << i << " was loaded more than once";
  }
  EXPECT_EQ(s.corrupt, 0u);
  EXPECT_EQ(s.backendErrors, 0u);
  EXPECT_DOUBLE_EQ(s.hitRate(), static_cast<double>(s.hits) / (4.0 * 301.0));
}

TEST(CachedDataset, WritesGoOutInBatchesOfWriterBufferSize) {
  PatternDataset source(53);
  auto rec = std::make_shared<RecordingBackend>(makeEmbedded());
  {
    CachedDataset ds(source, rec, "b", 7);
    std::string sample;
    for (size_t i = 0; i < 53; ++i) {
      ASSERT_TRUE(ds.get(i, sample).isOk());
    }
    EXPECT_EQ(rec->batches(), std::vector<size_t>(7, 7));  // 49 written, 4 queued
    EXPECT_EQ(*rec->numKeys(), 49u);
  }  // the destructor flushes the tail
  EXPECT_EQ(rec->batches().back(), 4u);
  EXPECT_EQ(*rec->numKeys(), 53u);
}

TEST(CachedDataset, FlushEveryReadsWritesThePartialBuffer) {
  PatternDataset source(10);
  auto rec = std::make_shared<RecordingBackend>(makeEmbedded());
  CacheLoaderOptions o;
  o.datasetName = "f";
  o.writerBufferSize = 100;
  o.flushEveryReads = 4;
  CachedDataset ds(source, rec, o);
  std::string sample;
  for (size_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
  }
  // The 4th and 8th reads flush what was queued before them (3, then 4).
  EXPECT_EQ(rec->batches(), (std::vector<size_t>{3, 4}));
  ASSERT_TRUE(ds.flush().isOk());
  EXPECT_EQ(rec->batches(), (std::vector<size_t>{3, 4, 3}));
}

// Bagua's tests/contrib/test_cached_dataset.py: two 102-sample datasets named d1 and d2 over
// one backend, iterated 10 times; every sample equals the original and the key count is 102,
// then 204.
TEST(CachedDataset, TwoDatasetsShareOneBackendUnderTheirOwnNames) {
  auto backend = makeEmbedded();
  PatternDataset src1(102, 1);
  PatternDataset src2(102, 2);
  CachedDataset d1(src1, backend, "d1", 20);
  CachedDataset d2(src2, backend, "d2", 20);
  std::string sample;
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (size_t i = 0; i < 102; ++i) {
      ASSERT_TRUE(d1.get(i, sample).isOk());
      ASSERT_EQ(sample, src1.expected(i));
    }
  }
  ASSERT_TRUE(d1.flush().isOk());
  EXPECT_EQ(*d1.loader().numKeys(), 102u);
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (size_t i = 0; i < 102; ++i) {
      ASSERT_TRUE(d2.get(i, sample).isOk());
      ASSERT_EQ(sample, src2.expected(i));
    }
  }
  ASSERT_TRUE(d2.flush().isOk());
  EXPECT_EQ(*d2.loader().numKeys(), 204u);
  // Bagua's key format.
  std::string v;
  ASSERT_TRUE(*backend->get("d2_17", v));
  EXPECT_EQ(v, src2.expected(17));
  EXPECT_EQ(d1.loader().cacheKey("5"), "d1_5");
}

// A cached dataset whose source is another cached dataset (e.g. decoded samples over cached raw
// files), read on one thread: each level keeps its own keys and values.
TEST(CachedDataset, NestedCachedDatasetsKeepTheirOwnKeys) {
  class Doubler : public Dataset {
   public:
    explicit Doubler(Dataset& inner) : inner_(inner) {}
    size_t size() const override { return inner_.size(); }
    Status get(size_t index, Sample& sample) const override {
      BAGUA_RETURN_IF_ERROR(inner_.get(index, sample));
      sample += sample;
      return Status::ok();
    }

   private:
    Dataset& inner_;
  };
  auto backend = makeEmbedded();
  PatternDataset raw(30);
  CachedDataset rawCached(raw, backend, "raw", 1);
  Doubler doubled(rawCached);
  CachedDataset top(doubled, backend, "top", 1);
  std::string sample;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i < 30; ++i) {
      ASSERT_TRUE(top.get(i, sample).isOk());
      ASSERT_EQ(sample, raw.expected(i) + raw.expected(i)) << i;
    }
  }
  std::string v;
  ASSERT_TRUE(*backend->get("raw_4", v));
  EXPECT_EQ(v, raw.expected(4));
  ASSERT_TRUE(*backend->get("top_4", v));
  EXPECT_EQ(v, raw.expected(4) + raw.expected(4));
  EXPECT_EQ(*backend->numKeys(), 60u);
  EXPECT_EQ(top.stats().hits, 30u);
}

TEST(CachedDataset, NullBackendDisablesCaching) {
  PatternDataset source(20);
  CachedDataset ds(source, nullptr, "none", 4);
  std::string sample;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i < 20; ++i) {
      ASSERT_TRUE(ds.get(i, sample).isOk());
      ASSERT_EQ(sample, source.expected(i));
    }
  }
  ASSERT_TRUE(ds.flush().isOk());
  CacheStats s = ds.stats();
  EXPECT_EQ(s.misses, 40u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.writes, 0u);
  EXPECT_EQ(*ds.loader().numKeys(), 0u);
}

TEST(CachedDataset, SourceErrorsReachTheCallerAndAreNotCached) {
  PatternDataset source(10);
  CachedDataset ds(source, makeEmbedded(), "e", 1);
  source.failAt(3);
  std::string sample;
  Status s = ds.get(3, sample);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), StatusCode::kSystemError);
  EXPECT_NE(s.message().find("sample '3' of 'e'"), std::string::npos) << s.message();
  source.failAt(-1);
  ASSERT_TRUE(ds.get(3, sample).isOk());
  EXPECT_EQ(sample, source.expected(3));
  EXPECT_EQ(ds.get(10, sample).code(), StatusCode::kInvalidArgument);
}

TEST(CachedDataset, ConcurrentReadersGetEverySampleRight) {
  PatternDataset source(2000);
  CachedDataset ds(source, makeEmbedded(), "c", 16);
  std::atomic<uint64_t> wrong{0};
  std::vector<std::jthread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      std::string sample;
      for (int epoch = 0; epoch < 3; ++epoch) {
        // Each thread walks the whole set from a different offset.
        for (size_t k = 0; k < 2000; ++k) {
          size_t i = (k + static_cast<size_t>(t) * 500) % 2000;
          if (!ds.get(i, sample).isOk() || sample != source.expected(i)) {
            wrong.fetch_add(1);
          }
        }
      }
    });
  }
  readers.clear();
  EXPECT_EQ(wrong.load(), 0u);
  CacheStats s = ds.stats();
  EXPECT_EQ(s.hits + s.misses, 4u * 3u * 2000u);
  // Two threads may both miss a sample before either writes it back, but not often.
  EXPECT_LT(s.misses, 2u * 2000u);
  EXPECT_GT(s.hits, 8000u);
}

TEST(CachedDataset, BackendOutageIsReportedOnceAndServesFromTheSource) {
  PatternDataset source(100);
  auto rec = std::make_shared<RecordingBackend>(makeEmbedded());
  CachedDataset ds(source, rec, "o", 10);
  std::string sample;
  for (size_t i = 0; i < 100; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
  }
  WarnCounter warnings;
  rec->setDown(true);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i < 100; ++i) {
      ASSERT_TRUE(ds.get(i, sample).isOk());
      ASSERT_EQ(sample, source.expected(i));
    }
  }
  CacheStats s = ds.stats();
  EXPECT_EQ(s.outages, 1u);
  EXPECT_EQ(s.misses, 300u);
  EXPECT_EQ(s.droppedWrites, 200u);  // 20 failed batches of 10
  EXPECT_EQ(s.backendErrors, 200u + 20u);
  ASSERT_EQ(warnings.warnings().size(), 1u);
  EXPECT_NE(warnings.warnings()[0].find("serving samples from the source"), std::string::npos);
  rec->setDown(false);
  for (size_t i = 0; i < 100; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
    ASSERT_EQ(sample, source.expected(i));
  }
  EXPECT_EQ(ds.stats().hits, 100u);  // the first epoch's writes are still there
  rec->setDown(true);
  ASSERT_TRUE(ds.get(0, sample).isOk());
  EXPECT_EQ(ds.stats().outages, 2u);
  EXPECT_EQ(warnings.warnings().size(), 2u);
}

TEST(CachedDataset, ReadManyMixesHitsAndMissesInOrder) {
  PatternDataset source(100);
  auto rec = std::make_shared<RecordingBackend>(makeEmbedded());
  CachedDataset ds(source, rec, "m", 8);
  std::string sample;
  for (size_t i = 0; i < 100; i += 2) {  // even samples cached (50 = 6 batches of 8 + 2 queued)
    ASSERT_TRUE(ds.get(i, sample).isOk());
  }
  ASSERT_TRUE(ds.flush().isOk());
  // Reversed, with a duplicate and every odd sample missing from the cache.
  std::vector<size_t> indices;
  for (size_t k = 0; k < 100; ++k) {
    indices.push_back(99 - k);
  }
  indices.push_back(42);
  std::vector<std::string> samples;
  ASSERT_TRUE(ds.getMany(indices, samples).isOk());
  ASSERT_EQ(samples.size(), indices.size());
  for (size_t j = 0; j < indices.size(); ++j) {
    ASSERT_EQ(samples[j], source.expected(indices[j])) << "position " << j;
  }
  CacheStats s = ds.stats();
  EXPECT_EQ(s.hits, 51u);          // 50 even samples and the duplicate 42
  EXPECT_EQ(s.misses, 50u + 50u);  // the first pass, then the odd samples
  for (size_t i = 1; i < 100; i += 2) {
    EXPECT_EQ(source.reads(i), 1u) << i;
  }
  ASSERT_TRUE(ds.flush().isOk());
  EXPECT_EQ(*rec->numKeys(), 100u);
  ASSERT_TRUE(ds.getMany(indices, samples).isOk());
  EXPECT_EQ(ds.stats().hits, 51u + 101u);
  std::vector<size_t> bad = {1, 100};
  EXPECT_EQ(ds.getMany(bad, samples).code(), StatusCode::kInvalidArgument);
  std::vector<size_t> none;
  ASSERT_TRUE(ds.getMany(none, samples).isOk());
  EXPECT_TRUE(samples.empty());
}

TEST(CachedDataset, ReadManyWithTheBackendDownServesFromTheSource) {
  PatternDataset source(40);
  auto rec = std::make_shared<RecordingBackend>(makeEmbedded());
  CachedDataset ds(source, rec, "md", 100);
  rec->setDown(true);
  std::vector<size_t> indices(40);
  std::iota(indices.begin(), indices.end(), size_t{0});
  std::vector<std::string> samples;
  WarnCounter warnings;
  ASSERT_TRUE(ds.getMany(indices, samples).isOk());
  ASSERT_TRUE(ds.getMany(indices, samples).isOk());
  for (size_t i = 0; i < 40; ++i) {
    ASSERT_EQ(samples[i], source.expected(i));
  }
  EXPECT_EQ(ds.stats().misses, 80u);
  EXPECT_EQ(ds.stats().outages, 1u);
  EXPECT_EQ(warnings.warnings().size(), 1u);
  source.failAt(7);
  Status s = ds.getMany(indices, samples);
  EXPECT_EQ(s.code(), StatusCode::kSystemError);
}

// ---- Typed samples ---------------------------------------------------------------------------

class FloatDataset : public TypedDataset<std::vector<float>> {
 public:
  size_t size() const override { return 64; }
  Result<std::vector<float>> get(size_t index) override {
    loads.fetch_add(1);
    std::vector<float> v(index % 9 + 1);
    for (size_t j = 0; j < v.size(); ++j) {
      v[j] = static_cast<float>(index) * 100.0f + static_cast<float>(j) + 0.25f;
    }
    return v;
  }
  std::atomic<uint64_t> loads{0};
};

TEST(TypedCachedDataset, RoundTripsAndTreatsUndecodableValuesAsMisses) {
  FloatDataset source;
  auto backend = makeEmbedded();
  TypedCachedDataset<std::vector<float>> ds(source, backend, "t", 1);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i < 64; ++i) {
      Result<std::vector<float>> v = ds.get(i);
      ASSERT_TRUE(v.isOk()) << v.status().toString();
      ASSERT_EQ(*v, *source.get(i)) << i;
    }
  }
  EXPECT_EQ(ds.stats().hits, 64u);
  // Corrupt three values in the backend: a wrong header, a truncated payload, an empty value.
  ASSERT_TRUE(backend->put("t_5", "garbage").isOk());
  std::string truncated;
  ASSERT_TRUE(*backend->get("t_8", truncated));
  truncated.pop_back();
  ASSERT_TRUE(backend->put("t_8", truncated).isOk());
  ASSERT_TRUE(backend->put("t_13", "").isOk());
  WarnCounter warnings;
  for (size_t i : {5u, 8u, 13u, 5u}) {
    Result<std::vector<float>> v = ds.get(i);
    ASSERT_TRUE(v.isOk()) << v.status().toString();
    ASSERT_EQ(*v, *source.get(i)) << i;
  }
  EXPECT_EQ(ds.stats().corrupt, 3u);          // the last read of 5 hits the rewritten value
  EXPECT_EQ(warnings.warnings().size(), 1u);  // reported at the 1st, 10th, 100th...
  std::string fixed;
  ASSERT_TRUE(*backend->get("t_5", fixed));
  EXPECT_TRUE(Serializer<std::vector<float>>::decode(fixed).isOk());
}

TEST(Serializer, VectorRejectsWrongElementSizeAndCounts) {
  std::string bytes;
  Serializer<std::vector<double>>::encode({1.0, 2.0}, bytes);
  EXPECT_TRUE(Serializer<std::vector<double>>::decode(bytes).isOk());
  EXPECT_FALSE(Serializer<std::vector<float>>::decode(bytes).isOk());
  bytes.push_back('x');
  EXPECT_FALSE(Serializer<std::vector<double>>::decode(bytes).isOk());
  std::string empty;
  Serializer<std::vector<int>>::encode({}, empty);
  Result<std::vector<int>> e = Serializer<std::vector<int>>::decode(empty);
  ASSERT_TRUE(e.isOk());
  EXPECT_TRUE(e->empty());
}

// ---- Backend selection from the catalogue -----------------------------------------------------

TEST(CacheParams, OptionsComeFromTheEnvironment) {
  ScopedEnvForTesting env(cacheParams(), {{"BAGUA_CACHE_CAPACITY", "8M"},
                                          {"BAGUA_CACHE_SHARDS", "2"},
                                          {"BAGUA_CACHE_EVICTION", "random"},
                                          {"BAGUA_CACHE_WRITER_BUFFER", "5"},
                                          {"BAGUA_CACHE_REDIS_HOSTS", "10.0.0.1:7000,[::1]:7001"},
                                          {"BAGUA_CACHE_REDIS_CLUSTER_MODE", "no"}});
  Result<CacheOptions> o = CacheOptions::fromParams();
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->backend, BackendKind::kEmbedded);
  EXPECT_EQ(o->embedded.capacityBytes, uint64_t{8} << 20);
  EXPECT_EQ(o->embedded.shards, 2);
  EXPECT_EQ(o->embedded.eviction, Eviction::kRandom);
  ASSERT_EQ(o->redis.hosts.size(), 2u);
  EXPECT_EQ(o->redis.hosts[0].host, "10.0.0.1");
  EXPECT_EQ(o->redis.hosts[0].port, 7000);
  EXPECT_EQ(o->redis.hosts[1].host, "::1");
  EXPECT_EQ(o->redis.hosts[1].port, 7001);
  EXPECT_FALSE(o->redis.clusterMode);
  EXPECT_EQ(CacheLoaderOptions::fromParams("x")->writerBufferSize, 5u);
  Result<std::shared_ptr<CacheBackend>> b = makeBackend(*o);
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  EXPECT_NE((*b)->describe().find("embedded 2 shards, 8 MiB, random"), std::string::npos)
      << (*b)->describe();
}

TEST(CacheParams, BadValuesAreErrorsNamingTheKey) {
  for (auto [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"BAGUA_CACHE_REDIS_HOSTS", "localhost"},
                                                        {"BAGUA_CACHE_REDIS_HOSTS", "a:1,b:0"},
                                                        {"BAGUA_CACHE_REDIS_HOSTS", "[::1:5"},
                                                        {"BAGUA_CACHE_EVICTION", "fifo"},
                                                        {"BAGUA_CACHE_SHARDS", "0"},
                                                        {"BAGUA_CACHE_BACKEND", "memcached"}}) {
    ScopedEnvForTesting env(cacheParams(), {{key, value}});
    Result<CacheOptions> o = CacheOptions::fromParams();
    ASSERT_FALSE(o.isOk()) << key << "=" << value;
    EXPECT_NE(o.status().message().find(key), std::string::npos) << o.status().message();
  }
}

TEST(CacheParams, ParseRedisHosts) {
  Result<std::vector<RedisHost>> h = parseRedisHosts("a:1,b.example:65535");
  ASSERT_TRUE(h.isOk());
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[1].host, "b.example");
  EXPECT_EQ((*h)[1].port, 65535);
  EXPECT_TRUE(parseRedisHosts("")->empty());
  for (const char* bad : {"a", "a:", ":1", "a:65536", "a:1,", "a:1x", "::1:5", "[::1]5"}) {
    EXPECT_FALSE(parseRedisHosts(bad).isOk()) << bad;
  }
}

}  // namespace
}  // namespace bagua::cache
