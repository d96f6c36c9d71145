// Against real redis-server processes started and stopped by the fixture on loopback ports.
#include "bagua/dataset_cache/redis_store.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <thread>

#include "cache_test_util.h"

namespace bagua::cache {
namespace {

using namespace std::chrono_literals;
using testing::PatternDataset;
using testing::patternSample;
using testing::WarnCounter;

RedisOptions optionsFor(const std::vector<int>& ports) {
  RedisOptions o;
  for (int p : ports) {
    o.hosts.push_back({"127.0.0.1", p});
  }
  // Generous: a loaded CI machine (sanitizer builds, tests in parallel) can stall a healthy local
  // server past half a second. The fault tests kill servers, which fails commands at once.
  o.timeout = 5s;
  o.retryInterval = 50ms;
  return o;
}

std::unique_ptr<RedisStore> makeStore(RedisOptions o) {
  Result<std::unique_ptr<RedisStore>> r = RedisStore::create(std::move(o));
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(*r) : nullptr;
}

std::string keyOf(size_t i) {
  return "key:" + std::to_string(i);
}

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalRedisOptions o;
    o.maxMemoryBytes = 256 << 20;
    BAGUA_START_REDIS_OR_SKIP(server_, o);
  }
  LocalRedisServer server_;
};

TEST_F(RedisTest, PutGetBatchesCountAndClear) {
  auto store = makeStore(optionsFor({server_.port()}));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->ping().isOk());
  std::string v;
  EXPECT_FALSE(*store->get("absent", v));
  ASSERT_TRUE(store->put("bin", std::string("a\0b\r\nc", 6)).isOk());
  ASSERT_TRUE(*store->get("bin", v));
  EXPECT_EQ(v, std::string("a\0b\r\nc", 6));
  std::vector<KeyValue> batch;
  for (size_t i = 0; i < 500; ++i) {
    batch.push_back({keyOf(i), patternSample(21, i)});
  }
  ASSERT_TRUE(store->putMany(batch).isOk());
  std::vector<std::string> keys;
  for (size_t i = 0; i < 510; ++i) {
    keys.push_back(keyOf(509 - i));  // reversed, with 10 absent keys first
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::optional<std::string>> values;
  ASSERT_TRUE(store->getMany(views, values).isOk());
  for (size_t j = 0; j < 510; ++j) {
    size_t i = 509 - j;
    if (i < 500) {
      ASSERT_TRUE(values[j].has_value()) << i;
      EXPECT_EQ(*values[j], patternSample(21, i)) << i;
    } else {
      EXPECT_FALSE(values[j].has_value()) << i;
    }
  }
  EXPECT_EQ(*store->numKeys(), 501u);
  ASSERT_TRUE(store->clear().isOk());
  EXPECT_EQ(*store->numKeys(), 0u);
}

TEST_F(RedisTest, CachedDatasetEpochsAndConcurrentReaders) {
  std::shared_ptr<CacheBackend> store = makeStore(optionsFor({server_.port()}));
  ASSERT_NE(store, nullptr);
  PatternDataset source(400);
  CachedDataset ds(source, store, "r", 20);
  std::string sample;
  for (size_t i = 0; i < 400; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
    ASSERT_EQ(sample, source.expected(i));
  }
  EXPECT_EQ(*store->numKeys(), 400u);
  std::atomic<uint64_t> wrong{0};
  {
    std::vector<std::jthread> readers;
    for (int t = 0; t < 4; ++t) {
      readers.emplace_back([&, t] {
        std::string s;
        for (size_t k = 0; k < 400; ++k) {
          size_t i = (k * 7 + static_cast<size_t>(t) * 100) % 400;
          if (!ds.get(i, s).isOk() || s != source.expected(i)) {
            wrong.fetch_add(1);
          }
        }
      });
    }
  }
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(ds.stats().hits, 1600u);
  EXPECT_EQ(ds.stats().misses, 400u);
  EXPECT_EQ(source.totalReads(), 400u);
}

TEST(RedisCluster, ShardsKeysOverThreeServersAndEveryRankAgrees) {
  LocalRedisServer servers[3];
  for (auto& s : servers) {
    BAGUA_START_REDIS_OR_SKIP(s, LocalRedisOptions{});
  }
  std::vector<int> ports = {servers[0].port(), servers[1].port(), servers[2].port()};
  auto writer = makeStore(optionsFor(ports));
  auto reader = makeStore(optionsFor(ports));  // another rank: same list, same mapping
  ASSERT_TRUE(writer && reader);
  constexpr size_t kKeys = 900;
  std::vector<KeyValue> batch;
  for (size_t i = 0; i < kKeys; ++i) {
    batch.push_back({keyOf(i), patternSample(4, i)});
  }
  ASSERT_TRUE(writer->putMany(batch).isOk());
  EXPECT_EQ(*writer->numKeys(), kKeys);
  // Each key lives exactly on the server serverFor() names, and the load is spread.
  std::vector<std::unique_ptr<RedisStore>> single;
  for (int p : ports) {
    single.push_back(makeStore(optionsFor({p})));
  }
  std::vector<uint64_t> perServer(3);
  std::string v;
  for (size_t i = 0; i < kKeys; ++i) {
    size_t home = writer->serverFor(keyOf(i));
    ASSERT_LT(home, 3u);
    EXPECT_EQ(home, reader->serverFor(keyOf(i)));
    for (size_t s = 0; s < 3; ++s) {
      bool hit = *single[s]->get(keyOf(i), v);
      ASSERT_EQ(hit, s == home) << "key " << i << " server " << s;
      if (hit) {
        EXPECT_EQ(v, patternSample(4, i));
        ++perServer[s];
      }
    }
  }
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(*single[s]->numKeys(), perServer[s]);
    EXPECT_GT(perServer[s], kKeys / 5) << "server " << s << " got too few keys";
  }
  std::vector<std::string> keys;
  for (size_t i = 0; i < kKeys; ++i) {
    keys.push_back(keyOf(i));
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::optional<std::string>> values;
  ASSERT_TRUE(reader->getMany(views, values).isOk());
  for (size_t i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(values[i].has_value()) << i;
    EXPECT_EQ(*values[i], patternSample(4, i)) << i;
  }
  // A cached dataset over the three servers, read in batches (one MGET per server each).
  std::shared_ptr<CacheBackend> shared = std::move(reader);
  PatternDataset source(300);
  CachedDataset ds(source, shared, "cl", 25);
  std::vector<size_t> indices(300);
  std::vector<std::string> samples;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t b = 0; b < 300; b += 30) {
      for (size_t j = 0; j < 30; ++j) {
        indices[j] = b / 30 + j * 10;  // strided: each batch spans all servers
      }
      ASSERT_TRUE(ds.getMany(std::span<const size_t>(indices.data(), 30), samples).isOk());
      for (size_t j = 0; j < 30; ++j) {
        ASSERT_EQ(samples[j], source.expected(indices[j])) << "epoch " << epoch << " j " << j;
      }
    }
  }
  EXPECT_EQ(ds.stats().hits, 300u);
  EXPECT_EQ(ds.stats().misses, 300u);
}

TEST(RedisCluster, OneServerDownCostsOnlyItsShare) {
  LocalRedisServer servers[2];
  for (auto& s : servers) {
    BAGUA_START_REDIS_OR_SKIP(s, LocalRedisOptions{});
  }
  RedisOptions o = optionsFor({servers[0].port(), servers[1].port()});
  o.retryInterval = 10s;  // the dead server stays skipped for the whole test
  std::shared_ptr<CacheBackend> backend = makeStore(o);
  ASSERT_NE(backend, nullptr);
  auto* store = static_cast<RedisStore*>(backend.get());
  PatternDataset source(200);
  CachedDataset ds(source, backend, "half", 20);
  std::vector<size_t> indices(200);
  std::iota(indices.begin(), indices.end(), size_t{0});
  std::vector<std::string> samples;
  ASSERT_TRUE(ds.getMany(indices, samples).isOk());
  ASSERT_TRUE(ds.flush().isOk());
  size_t onFirst = 0;
  for (size_t i = 0; i < 200; ++i) {
    onFirst += store->serverFor(ds.loader().cacheKey(std::to_string(i))) == 0 ? 1 : 0;
  }
  ASSERT_GT(onFirst, 0u);
  ASSERT_LT(onFirst, 200u);
  servers[1].kill();
  WarnCounter warnings;
  for (int epoch = 0; epoch < 2; ++epoch) {
    uint64_t hitsBefore = ds.stats().hits;
    ASSERT_TRUE(ds.getMany(indices, samples).isOk());
    for (size_t i = 0; i < 200; ++i) {
      ASSERT_EQ(samples[i], source.expected(i)) << i;
    }
    EXPECT_EQ(ds.stats().hits - hitsBefore, onFirst) << "epoch " << epoch;
  }
  // Single reads alternate between the live and the dead server: still one outage.
  std::string sample;
  for (size_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
    ASSERT_EQ(sample, source.expected(i)) << i;
  }
  EXPECT_EQ(ds.stats().outages, 1u);
  EXPECT_EQ(warnings.warnings().size(), 1u);
}

TEST(RedisCluster, PerNodeModeUsesOnlyTheNodesServer) {
  LocalRedisServer servers[2];
  for (auto& s : servers) {
    BAGUA_START_REDIS_OR_SKIP(s, LocalRedisOptions{});
  }
  RedisOptions o = optionsFor({servers[0].port(), servers[1].port()});
  o.clusterMode = false;
  o.nodeRank = 3;  // 3 % 2 = server 1
  auto store = makeStore(o);
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->servers().size(), 1u);
  EXPECT_EQ(store->servers()[0].port, servers[1].port());
  for (size_t i = 0; i < 50; ++i) {
    ASSERT_TRUE(store->put(keyOf(i), "v").isOk());
  }
  EXPECT_EQ(*makeStore(optionsFor({servers[0].port()}))->numKeys(), 0u);
  EXPECT_EQ(*makeStore(optionsFor({servers[1].port()}))->numKeys(), 50u);
}

TEST(RedisSpawn, StartsItsOwnServersAndStopsThemOnDestruction) {
  if (!redisAvailable()) {
    GTEST_SKIP() << "this build has no hiredis: the Redis backend is not built";
  }
  RedisOptions o;
  o.spawn = 2;
  o.capacityPerNode = 64 << 20;
  o.timeout = 500ms;
  Result<std::unique_ptr<RedisStore>> r = RedisStore::create(o);
  if (r.status().code() == StatusCode::kNotFound) {
    GTEST_SKIP() << "redis-server not available: " << r.status().message();
  }
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  std::vector<RedisHost> hosts = (*r)->servers();
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_NE(hosts[0].port, hosts[1].port);
  for (const RedisHost& h : hosts) {
    // A spawned server answers only with its password: no other process of the machine reads
    // or plants cached values.
    EXPECT_GE(h.password.size(), 32u);
    EXPECT_TRUE(pingRedis(h.host, h.port, 1000ms, h.password).isOk()) << h.port;
    Status stranger = pingRedis(h.host, h.port, 1000ms);
    EXPECT_FALSE(stranger.isOk());
    EXPECT_NE(stranger.message().find("NOAUTH"), std::string::npos) << stranger.toString();
    EXPECT_FALSE(pingRedis(h.host, h.port, 1000ms, "not-the-password").isOk());
  }
  EXPECT_NE(hosts[0].password, hosts[1].password);
  for (size_t i = 0; i < 100; ++i) {
    ASSERT_TRUE((*r)->put(keyOf(i), patternSample(6, i)).isOk());
  }
  std::string v;
  ASSERT_TRUE(*(*r)->get(keyOf(42), v));
  EXPECT_EQ(v, patternSample(6, 42));
  EXPECT_EQ(*(*r)->numKeys(), 100u);
  r = BAGUA_ERROR(kAborted, "drop the store");
  for (const RedisHost& h : hosts) {
    EXPECT_FALSE(pingRedis(h.host, h.port, 300ms).isOk()) << "server on " << h.port << " survived";
  }
}

TEST(RedisSpawn, MissingBinaryIsNotFound) {
  if (!redisAvailable()) {
    GTEST_SKIP() << "this build has no hiredis: the Redis backend is not built";
  }
  RedisOptions o;
  o.serverBinary = "bagua-no-such-redis-server";
  Result<std::unique_ptr<RedisStore>> r = RedisStore::create(o);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().toString();
  EXPECT_NE(r.status().message().find("BAGUA_CACHE_REDIS_SERVER"), std::string::npos);
}

TEST(RedisEviction, MaxmemoryWithRandomEvictionKeepsServingCorrectSamples) {
  LocalRedisServer server;
  LocalRedisOptions lo;
  lo.maxMemoryBytes = 4 << 20;
  lo.maxMemoryPolicy = "allkeys-random";
  BAGUA_START_REDIS_OR_SKIP(server, lo);
  std::shared_ptr<CacheBackend> store = makeStore(optionsFor({server.port()}));
  ASSERT_NE(store, nullptr);
  // 6000 samples of 4 KiB: 24 MiB through a 4 MiB server.
  class Big : public Dataset {
   public:
    size_t size() const override { return 6000; }
    Status get(size_t i, Sample& s) const override {
      s.assign(4096, static_cast<char>(i & 0xff));
      std::memcpy(s.data(), &i, sizeof(i));
      return Status::ok();
    }
  } source;
  CachedDataset ds(source, store, "big", 50);
  std::string sample;
  std::string expected;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i < source.size(); ++i) {
      ASSERT_TRUE(ds.get(i, sample).isOk());
      ASSERT_TRUE(source.get(i, expected).isOk());
      ASSERT_EQ(sample, expected) << i;
    }
  }
  CacheStats s = ds.stats();
  EXPECT_EQ(s.droppedWrites, 0u);
  EXPECT_EQ(s.backendErrors, 0u);
  uint64_t keys = *store->numKeys();
  EXPECT_LT(keys, 1500u);  // 4 MiB cannot hold 1500 samples of 4 KiB plus overhead
  EXPECT_GT(keys, 100u);
  EXPECT_GT(s.hits, 0u);
}

TEST(RedisEviction, NoEvictionRefusalsAreDroppedWritesNotErrorsToTheCaller) {
  LocalRedisServer server;
  LocalRedisOptions lo;
  lo.maxMemoryBytes = 2 << 20;
  lo.maxMemoryPolicy = "noeviction";
  BAGUA_START_REDIS_OR_SKIP(server, lo);
  auto store = makeStore(optionsFor({server.port()}));
  ASSERT_NE(store, nullptr);
  std::vector<KeyValue> batch;
  for (size_t i = 0; i < 200; ++i) {
    batch.push_back({keyOf(i), std::string(16 << 10, 'n')});
  }
  Status s = store->putMany(batch);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.toString();
  EXPECT_TRUE(store->ping().isOk());  // an OOM reply does not mark the server down
}

TEST_F(RedisTest, OutageMidEpochServesFromTheSourceReportsOnceAndRecovers) {
  std::shared_ptr<CacheBackend> store = makeStore(optionsFor({server_.port()}));
  ASSERT_NE(store, nullptr);
  PatternDataset source(200);
  CachedDataset ds(source, store, "out", 10);
  std::string sample;
  for (size_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
  }
  ASSERT_EQ(ds.stats().writes, 200u);
  WarnCounter warnings;
  const int port = server_.port();
  // Epoch 2: the server dies in the middle; epoch 3 runs entirely without it.
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i < 200; ++i) {
      if (epoch == 0 && i == 100) {
        server_.kill();
      }
      ASSERT_TRUE(ds.get(i, sample).isOk()) << "epoch " << epoch << " sample " << i;
      ASSERT_EQ(sample, source.expected(i)) << "epoch " << epoch << " sample " << i;
    }
  }
  CacheStats s = ds.stats();
  EXPECT_EQ(s.hits, 100u);    // the first half of epoch 2 still hit
  EXPECT_EQ(s.misses, 500u);  // everything after the kill came from the source
  EXPECT_EQ(s.outages, 1u);
  EXPECT_EQ(warnings.warnings().size(), 1u) << "an outage must be reported once";
  EXPECT_EQ(source.totalReads(), 500u);
  // Restart on the same port (empty: no persistence): the store reconnects by itself, the
  // next epoch refills it and the one after hits.
  LocalRedisOptions again;
  again.port = port;
  ASSERT_TRUE(server_.start(again).isOk());
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  bool allHit = false;
  while (!allHit && std::chrono::steady_clock::now() < deadline) {
    uint64_t before = ds.stats().hits;
    for (size_t i = 0; i < 200; ++i) {
      ASSERT_TRUE(ds.get(i, sample).isOk());
      ASSERT_EQ(sample, source.expected(i));
    }
    allHit = ds.stats().hits - before == 200;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(allHit) << "the cache did not recover within 10 s after the restart";
  EXPECT_EQ(ds.stats().outages, 1u);
  EXPECT_EQ(*store->numKeys(), 200u);
}

TEST(RedisFaults, ServerDownAtStartIsNotFatal) {
  if (!redisAvailable()) {
    GTEST_SKIP() << "this build has no hiredis: the Redis backend is not built";
  }
  Result<int> port = freeLoopbackPort();
  ASSERT_TRUE(port.isOk());
  std::shared_ptr<CacheBackend> store = makeStore(optionsFor({*port}));  // nothing listens
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->ping().code(), StatusCode::kUnavailable);
  PatternDataset source(50);
  CachedDataset ds(source, store, "down", 5);
  std::string sample;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < 50; ++i) {
    ASSERT_TRUE(ds.get(i, sample).isOk());
    ASSERT_EQ(sample, source.expected(i));
  }
  // Refused connections fail fast; a dead server must not cost a timeout per sample.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(ds.stats().misses, 50u);
  EXPECT_EQ(ds.stats().outages, 1u);
}

}  // namespace
}  // namespace bagua::cache
