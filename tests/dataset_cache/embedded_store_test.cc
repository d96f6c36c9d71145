#include "bagua/dataset_cache/embedded_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include "cache_test_util.h"

namespace bagua::cache {
namespace {

using testing::makeEmbedded;
using testing::patternSample;

std::string keyOf(size_t i) {
  return "k" + std::to_string(i);
}

std::unique_ptr<EmbeddedStore> take(Result<std::unique_ptr<EmbeddedStore>> r) {
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? std::move(r).value() : nullptr;
}

TEST(EmbeddedStore, PutGetOverwriteAndMiss) {
  auto store = makeEmbedded();
  std::string v;
  ASSERT_FALSE(*store->get("absent", v));
  ASSERT_TRUE(store->put("a", "alpha").isOk());
  ASSERT_TRUE(store->put("b", std::string("b\0eta", 5)).isOk());
  ASSERT_TRUE(*store->get("a", v));
  EXPECT_EQ(v, "alpha");
  ASSERT_TRUE(*store->get("b", v));
  EXPECT_EQ(v, std::string("b\0eta", 5));  // binary-safe
  ASSERT_TRUE(store->put("a", "a much longer value than before").isOk());
  ASSERT_TRUE(*store->get("a", v));
  EXPECT_EQ(v, "a much longer value than before");
  ASSERT_TRUE(store->put("", "empty key").isOk());
  ASSERT_TRUE(*store->get("", v));
  EXPECT_EQ(v, "empty key");
  EXPECT_EQ(*store->numKeys(), 3u);
  ASSERT_TRUE(store->clear().isOk());
  EXPECT_EQ(*store->numKeys(), 0u);
  EXPECT_FALSE(*store->get("a", v));
}

TEST(EmbeddedStore, BatchesRoundTripEveryElement) {
  auto store = makeEmbedded();
  std::vector<KeyValue> batch;
  for (size_t i = 0; i < 1000; ++i) {
    batch.push_back({keyOf(i), patternSample(3, i)});
  }
  ASSERT_TRUE(store->putMany(batch).isOk());
  std::vector<std::string> keys;
  for (size_t i = 0; i < 1010; ++i) {
    keys.push_back(keyOf(i));
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::optional<std::string>> values;
  ASSERT_TRUE(store->getMany(views, values).isOk());
  ASSERT_EQ(values.size(), 1010u);
  for (size_t i = 0; i < 1010; ++i) {
    if (i < 1000) {
      ASSERT_TRUE(values[i].has_value()) << i;
      EXPECT_EQ(*values[i], patternSample(3, i)) << i;
    } else {
      EXPECT_FALSE(values[i].has_value()) << i;
    }
  }
}

TEST(EmbeddedStore, RejectsBadOptions) {
  EmbeddedOptions o;
  o.shards = 0;
  EXPECT_EQ(EmbeddedStore::create(o).status().code(), StatusCode::kInvalidArgument);
  o.shards = 16;
  o.capacityBytes = 1000;  // 62 bytes per shard
  Result<std::unique_ptr<EmbeddedStore>> r = EmbeddedStore::create(o);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("per shard"), std::string::npos) << r.status().message();
}

// One shard, so the eviction order is fully determined. kLru is CLOCK (second chance).
TEST(EmbeddedStore, LruEvictsAnEntryNotReadSinceItsLastChanceAndStaysWithinCapacity) {
  const std::string value(100, 'v');
  const uint64_t entry = 2 + value.size() + EmbeddedStore::kEntryOverhead;  // keys "k0".."k9"
  EmbeddedOptions o;
  o.shards = 1;
  o.capacityBytes = 4 * entry;
  auto store = take(EmbeddedStore::create(o));
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(store->put(keyOf(i), value).isOk());
  }
  std::string v;
  ASSERT_TRUE(*store->get("k0", v));  // the oldest was read: k1 is the least recently used
  ASSERT_TRUE(store->put("k4", value).isOk());
  EXPECT_FALSE(*store->get("k1", v));
  for (const char* k : {"k0", "k2", "k3", "k4"}) {
    EXPECT_TRUE(*store->get(k, v)) << k;
  }
  EmbeddedStore::Usage u = store->usage();
  EXPECT_EQ(u.entries, 4u);
  EXPECT_EQ(u.bytes, 4 * entry);
  EXPECT_EQ(u.evictions, 1u);
  // Everything was read: each gets its second chance in turn and the oldest in list order (k2,
  // after k0 moved to the front) goes.
  ASSERT_TRUE(store->put("k5", value).isOk());
  EXPECT_FALSE(*store->get("k2", v));
  // The second chances cleared every mark. Read k0, k3, k4 again: new and unread k5 goes next.
  for (const char* k : {"k0", "k3", "k4"}) {
    ASSERT_TRUE(*store->get(k, v)) << k;
  }
  ASSERT_TRUE(store->put("k6", value).isOk());
  for (const char* k : {"k0", "k3", "k4", "k6"}) {
    EXPECT_TRUE(*store->get(k, v)) << k;
  }
  EXPECT_FALSE(*store->get("k5", v));
  // Every further insert evicts exactly one entry.
  ASSERT_TRUE(store->put("k7", value).isOk());
  ASSERT_TRUE(store->put("k8", value).isOk());
  ASSERT_TRUE(store->put("k9", value).isOk());
  EXPECT_EQ(store->usage().evictions, 6u);
  EXPECT_LE(store->usage().bytes, 4 * entry);
}

TEST(EmbeddedStore, RandomEvictionKeepsTheBudgetAndValues) {
  const uint64_t capacity = 64 << 10;
  auto store = makeEmbedded(capacity, 4, Eviction::kRandom);
  for (size_t i = 0; i < 2000; ++i) {
    ASSERT_TRUE(store->put(keyOf(i), patternSample(5, i)).isOk());
  }
  auto* embedded = static_cast<EmbeddedStore*>(store.get());
  EmbeddedStore::Usage u = embedded->usage();
  EXPECT_LE(u.bytes, capacity);
  EXPECT_GT(u.evictions, 0u);
  EXPECT_EQ(u.entries + u.evictions, 2000u);
  size_t present = 0;
  std::string v;
  for (size_t i = 0; i < 2000; ++i) {
    if (*store->get(keyOf(i), v)) {
      ++present;
      EXPECT_EQ(v, patternSample(5, i)) << i;
    }
  }
  EXPECT_EQ(present, u.entries);
  // Random eviction keeps some entries much older than the newest `entries` keys (LRU would
  // keep only those).
  size_t oldest = 2000;
  for (size_t i = 0; i < 2000 && oldest == 2000; ++i) {
    if (*store->get(keyOf(i), v)) {
      oldest = i;
    }
  }
  EXPECT_LT(oldest, 2000 - 2 * u.entries);
}

TEST(EmbeddedStore, NoEvictionRefusesNewEntriesWhenFull) {
  const std::string value(100, 'x');
  const uint64_t entry = 2 + value.size() + EmbeddedStore::kEntryOverhead;
  EmbeddedOptions o;
  o.shards = 1;
  o.capacityBytes = 3 * entry;
  o.eviction = Eviction::kNone;
  auto store = take(EmbeddedStore::create(o));
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(store->put(keyOf(i), value).isOk());
  }
  std::string v;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(*store->get(keyOf(i), v), i < 3) << i;
  }
  EXPECT_EQ(store->usage().rejected, 2u);
  EXPECT_EQ(store->usage().evictions, 0u);
}

TEST(EmbeddedStore, ValueLargerThanAShardIsNotStored) {
  EmbeddedOptions o;
  o.capacityBytes = 64 << 10;
  o.shards = 4;
  auto store = take(EmbeddedStore::create(o));
  std::string v;
  ASSERT_TRUE(store->put("big", std::string(20 << 10, 'b')).isOk());  // > 16 KiB per shard
  EXPECT_FALSE(*store->get("big", v));
  EXPECT_EQ(store->usage().rejected, 1u);
  // Overwriting a small value with a too-large one removes the stale small one.
  ASSERT_TRUE(store->put("x", "small").isOk());
  ASSERT_TRUE(store->put("x", std::string(20 << 10, 'b')).isOk());
  EXPECT_FALSE(*store->get("x", v));
}

TEST(EmbeddedStore, ConcurrentReadersAndWritersSeeOnlyCompleteValues) {
  // About 210 KB of entries through 160 KiB: evictions happen while others read. Random
  // eviction, since a cyclic scan larger than an LRU cache never hits.
  auto store = makeEmbedded(uint64_t{160} << 10, 4, Eviction::kRandom);
  constexpr size_t kKeys = 1000;
  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> hits{0};
  std::vector<std::jthread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::string v;
      for (size_t round = 0; round < 3; ++round) {
        for (size_t i = static_cast<size_t>(t); i < kKeys; i += 2) {
          if (*store->get(keyOf(i), v)) {
            hits.fetch_add(1);
            if (v != patternSample(9, i)) {
              bad.fetch_add(1);
            }
          } else if (!store->put(keyOf(i), patternSample(9, i)).isOk()) {
            bad.fetch_add(1);
          }
        }
      }
    });
  }
  threads.clear();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  EmbeddedStore::Usage u = static_cast<EmbeddedStore*>(store.get())->usage();
  EXPECT_LE(u.bytes, uint64_t{160} << 10);
  EXPECT_GT(u.evictions, 0u);
}

class TempFile {
 public:
  TempFile() {
    path_ = std::filesystem::temp_directory_path() /
            ("bagua_cache_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove(path_);
    std::filesystem::remove(path_.string() + "-lock");
  }
  ~TempFile() {
    std::filesystem::remove(path_);
    std::filesystem::remove(path_.string() + "-lock");
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(EmbeddedStorePersistence, SurvivesARestart) {
  if (!persistenceAvailable()) {
    GTEST_SKIP() << "this build has no LMDB: persistence is not built";
  }
  TempFile file;
  EmbeddedOptions o;
  o.capacityBytes = 4 << 20;
  o.shards = 4;
  o.persistPath = file.path();
  {
    auto store = EmbeddedStore::create(o);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    std::vector<KeyValue> batch;
    for (size_t i = 0; i < 500; ++i) {
      batch.push_back({keyOf(i), patternSample(11, i)});
    }
    ASSERT_TRUE((*store)->putMany(batch).isOk());
    ASSERT_TRUE((*store)->put("k7", "overwritten").isOk());
    EXPECT_EQ((*store)->usage().persistErrors, 0u);
  }
  auto store = EmbeddedStore::create(o);
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  EXPECT_EQ((*store)->usage().loaded, 500u);
  EXPECT_EQ(*(*store)->numKeys(), 500u);
  std::string v;
  for (size_t i = 0; i < 500; ++i) {
    ASSERT_TRUE(*(*store)->get(keyOf(i), v)) << i;
    EXPECT_EQ(v, i == 7 ? std::string("overwritten") : patternSample(11, i)) << i;
  }
}

TEST(EmbeddedStorePersistence, EvictionsAndClearReachTheFileAndASmallerCapacityTrimsIt) {
  if (!persistenceAvailable()) {
    GTEST_SKIP() << "this build has no LMDB: persistence is not built";
  }
  TempFile file;
  const std::string value(200, 'p');
  const uint64_t entry = 4 + value.size() + EmbeddedStore::kEntryOverhead;  // keys "k100".."k199"
  EmbeddedOptions o;
  o.shards = 1;
  o.capacityBytes = 50 * entry;
  o.persistPath = file.path();
  {
    auto store = take(EmbeddedStore::create(o));
    for (size_t i = 100; i < 200; ++i) {
      ASSERT_TRUE(store->put(keyOf(i), value).isOk());
    }
    EXPECT_EQ(store->usage().evictions, 50u);
  }
  {
    auto store = take(EmbeddedStore::create(o));
    EXPECT_EQ(*store->numKeys(), 50u);  // the evicted 50 left the file too
    std::string v;
    EXPECT_FALSE(*store->get("k100", v));
    EXPECT_TRUE(*store->get("k199", v));
  }
  o.capacityBytes = 20 * entry;
  {
    auto store = take(EmbeddedStore::create(o));
    EXPECT_EQ(*store->numKeys(), 20u);
    ASSERT_TRUE(store->clear().isOk());
  }
  o.capacityBytes = 50 * entry;
  auto store = take(EmbeddedStore::create(o));
  EXPECT_EQ(*store->numKeys(), 0u);
}

TEST(EmbeddedStorePersistence, OneStorePerFile) {
  if (!persistenceAvailable()) {
    GTEST_SKIP() << "this build has no LMDB: persistence is not built";
  }
  TempFile file;
  EmbeddedOptions o;
  o.capacityBytes = 1 << 20;
  o.persistPath = file.path();
  auto first = take(EmbeddedStore::create(o));
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->put("a", "1").isOk());
  Result<std::unique_ptr<EmbeddedStore>> second = EmbeddedStore::create(o);
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already used"), std::string::npos)
      << second.status().message();
  std::string v;
  ASSERT_TRUE(*first->get("a", v));  // the refused second open did not disturb the first
  first.reset();
  auto third = take(EmbeddedStore::create(o));
  ASSERT_NE(third, nullptr);
  ASSERT_TRUE(*third->get("a", v));
  EXPECT_EQ(v, "1");
}

TEST(EmbeddedStorePersistence, UnopenablePathIsAClearError) {
  if (!persistenceAvailable()) {
    GTEST_SKIP() << "this build has no LMDB: persistence is not built";
  }
  EmbeddedOptions o;
  o.persistPath = "/nonexistent-dir/sub/cache.mdb";
  Result<std::unique_ptr<EmbeddedStore>> r = EmbeddedStore::create(o);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("/nonexistent-dir/sub/cache.mdb"), std::string::npos)
      << r.status().message();
}

TEST(EmbeddedStorePersistence, WithoutLmdbAskingForItFails) {
  if (persistenceAvailable()) {
    GTEST_SKIP() << "this build has LMDB; the no-LMDB error path is not compiled";
  }
  EmbeddedOptions o;
  o.persistPath = "/tmp/x.mdb";
  Result<std::unique_ptr<EmbeddedStore>> r = EmbeddedStore::create(o);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace bagua::cache
