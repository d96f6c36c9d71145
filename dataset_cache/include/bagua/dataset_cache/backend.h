// CacheBackend: where cached values live. Two implementations: EmbeddedStore (in-process, the
// default) and RedisStore (Redis servers through hiredis). makeBackend() builds either from
// CacheOptions, whose defaults come from the catalogue (bagua/dataset_cache/params.h).
//
// Contract for every backend:
// - Keys and values are arbitrary bytes. A value written with put() may later be missing
//   (evicted, server restarted): a cache, not a store.
// - Errors: kUnavailable when the backend cannot be reached now (a Redis server is down); the
//   caller serves from the source and tries again later. kInvalidArgument for bad input.
// - Thread safety: every method may be called concurrently from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::cache {

struct KeyValue {
  std::string key;
  std::string value;
};

class CacheBackend {
 public:
  CacheBackend() = default;
  CacheBackend(const CacheBackend&) = delete;
  CacheBackend& operator=(const CacheBackend&) = delete;
  virtual ~CacheBackend() = default;

  // Looks `key` up. On a hit copies the value into `value` (reusing its capacity) and returns
  // true; on a miss returns false and leaves `value` unspecified.
  virtual Result<bool> get(std::string_view key, std::string& value) = 0;
  // Looks up many keys in as few round trips as the backend allows. `values` is resized to
  // keys.size(); values[i] is empty (nullopt) on a miss. On an error (e.g. one Redis server of
  // several is down) the values that could be read are still filled in.
  virtual Status getMany(std::span<const std::string_view> keys,
                         std::vector<std::optional<std::string>>& values) = 0;
  virtual Status put(std::string_view key, std::string_view value) = 0;
  // Writes a batch (Redis: one MSET per server, pipelined). On an error, parts of the batch may
  // have been written.
  virtual Status putMany(std::span<const KeyValue> items) = 0;
  // Number of keys held (Redis: DBSIZE summed over the servers this backend uses).
  virtual Result<uint64_t> numKeys() = 0;
  // Drops every key (Redis: FLUSHDB on each server used).
  virtual Status clear() = 0;
  // Ok when every part of the backend answers now.
  virtual Status ping() = 0;
  // One line for logs: "embedded 16 shards, 1 GiB, lru" or "redis 127.0.0.1:6379 (+2)".
  virtual std::string describe() const = 0;
};

// True when this build has the Redis backend (hiredis was found) / LMDB persistence.
bool redisAvailable();
bool persistenceAvailable();

}  // namespace bagua::cache
