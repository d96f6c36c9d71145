// Helpers for the dataset_cache tests: a source dataset with index-dependent bytes that counts
// its reads, a backend wrapper that records batches and fails on demand, a Redis fixture.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bagua/base/logging.h"
#include "bagua/dataset_cache/cache.h"
#include "bagua/dataset_cache/local_redis_server.h"

namespace bagua::cache::testing {

// Sample i: length 40 + (i * 37) % 200 bytes, byte j = f(seed, i, j); any misplaced or truncated
// sample differs from expected().
inline std::string patternSample(uint64_t seed, size_t i) {
  std::string s(40 + (i * 37) % 200, '\0');
  for (size_t j = 0; j < s.size(); ++j) {
    s[j] = static_cast<char>((seed * 977 + i * 131 + j * 7 + (i >> 8) * 13 + (j >> 8)) & 0xff);
  }
  return s;
}

class PatternDataset : public Dataset {
 public:
  explicit PatternDataset(size_t n, uint64_t seed = 1) : n_(n), seed_(seed), reads_(n) {
    for (auto& r : reads_) {
      r.store(0);
    }
  }
  size_t size() const override { return n_; }
  Status get(size_t index, Sample& sample) const override {
    reads_[index].fetch_add(1, std::memory_order_relaxed);
    total_.fetch_add(1, std::memory_order_relaxed);
    if (failIndex_.load() == static_cast<int64_t>(index)) {
      return BAGUA_ERROR(kSystemError, "disk error reading sample %zu", index);
    }
    sample = patternSample(seed_, index);
    return Status::ok();
  }
  std::string expected(size_t i) const { return patternSample(seed_, i); }
  uint64_t reads(size_t i) const { return reads_[i].load(); }
  uint64_t totalReads() const { return total_.load(); }
  void failAt(int64_t index) { failIndex_.store(index); }

 private:
  size_t n_;
  uint64_t seed_;
  mutable std::vector<std::atomic<uint64_t>> reads_;  // get() is const and thread-safe
  mutable std::atomic<uint64_t> total_{0};
  std::atomic<int64_t> failIndex_{-1};
};

// Wraps a backend: records the size of every putMany, fails every call while `down` is set.
class RecordingBackend : public CacheBackend {
 public:
  explicit RecordingBackend(std::shared_ptr<CacheBackend> inner) : inner_(std::move(inner)) {}

  Result<bool> get(std::string_view key, std::string& value) override {
    gets_.fetch_add(1);
    if (down_.load()) {
      return BAGUA_ERROR(kUnavailable, "test backend is down");
    }
    return inner_->get(key, value);
  }
  Status getMany(std::span<const std::string_view> keys,
                 std::vector<std::optional<std::string>>& values) override {
    if (down_.load()) {
      return BAGUA_ERROR(kUnavailable, "test backend is down");
    }
    return inner_->getMany(keys, values);
  }
  Status put(std::string_view key, std::string_view value) override {
    if (down_.load()) {
      return BAGUA_ERROR(kUnavailable, "test backend is down");
    }
    return inner_->put(key, value);
  }
  Status putMany(std::span<const KeyValue> items) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      batches_.push_back(items.size());
    }
    if (down_.load()) {
      return BAGUA_ERROR(kUnavailable, "test backend is down");
    }
    return inner_->putMany(items);
  }
  Result<uint64_t> numKeys() override { return inner_->numKeys(); }
  Status clear() override { return inner_->clear(); }
  Status ping() override { return down_.load() ? BAGUA_ERROR(kUnavailable, "down") : Status(); }
  std::string describe() const override { return "recording(" + inner_->describe() + ")"; }

  std::vector<size_t> batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  void setDown(bool down) { down_.store(down); }
  uint64_t gets() const { return gets_.load(); }
  CacheBackend& inner() { return *inner_; }

 private:
  std::shared_ptr<CacheBackend> inner_;
  std::mutex mu_;
  std::vector<size_t> batches_;
  std::atomic<bool> down_{false};
  std::atomic<uint64_t> gets_{0};
};

inline std::shared_ptr<CacheBackend> makeEmbedded(uint64_t capacity = uint64_t{64} << 20,
                                                  int shards = 8,
                                                  Eviction eviction = Eviction::kLru) {
  EmbeddedOptions o;
  o.capacityBytes = capacity;
  o.shards = shards;
  o.eviction = eviction;
  auto store = EmbeddedStore::create(o);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  return std::shared_ptr<CacheBackend>(std::move(*store));
}

// Counts WARN lines of the cache category while alive (restores the default sink after).
class WarnCounter {
 public:
  WarnCounter() {
    setLogSink([this](LogLevel level, const LogCategory& category, const char*, int,
                      const std::string& message) {
      if (category == cache::kLogCache && level == LogLevel::kWarn) {
        std::lock_guard<std::mutex> lock(mu_);
        warnings_.push_back(message);
      }
    });
  }
  ~WarnCounter() { setLogSink(nullptr); }
  WarnCounter(const WarnCounter&) = delete;
  WarnCounter& operator=(const WarnCounter&) = delete;
  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mu_);
    return warnings_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> warnings_;
};

// Starts a redis-server or skips the test with the reason.
#define BAGUA_START_REDIS_OR_SKIP(server, opts)                                    \
  do {                                                                             \
    if (!::bagua::cache::redisAvailable()) {                                       \
      GTEST_SKIP() << "this build has no hiredis: the Redis backend is not built"; \
    }                                                                              \
    ::bagua::Status start_status_ = (server).start(opts);                          \
    if (start_status_.code() == ::bagua::StatusCode::kNotFound) {                  \
      GTEST_SKIP() << "redis-server not available: " << start_status_.message();   \
    }                                                                              \
    ASSERT_TRUE(start_status_.isOk()) << start_status_.toString();                 \
  } while (0)

}  // namespace bagua::cache::testing
