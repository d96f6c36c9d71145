// The dataset cache's parameter catalogue (bagua-params lists it under "dataset_cache").
//
// Every knob of the library is declared once, below; the options structs
// (EmbeddedOptions, RedisOptions, CacheLoaderOptions, CacheOptions) take their defaults from it
// through fromParams(), and a field set by the caller beats the environment.
//
// Thread safety: as ParamCatalogue (see bagua/base/params.h).
#pragma once

#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"

namespace bagua::cache {

// BAGUA_CACHE_REDIS_HOSTS's syntax (parseRedisHosts in redis_store.h).
Status validateRedisHosts(const std::string& text);

// The library's knobs, each declared once (bagua/base/params.h): read them as
// cacheParams().capacity.get().
struct CacheParams : ParamCatalogue {
  CacheParams()
      : ParamCatalogue("dataset_cache",
                       "cached dataset: embedded (default) or Redis backends, write batching") {}

  EnumParam backend{*this,
                    "BAGUA_CACHE_BACKEND",
                    "embedded",
                    {{"embedded", "in-process sharded store, optionally persisted with LMDB"},
                     {"redis", "Redis servers through hiredis, listed or spawned locally"}},
                    "Where cached samples live."};
  BytesParam capacity{
      *this,
      "BAGUA_CACHE_CAPACITY",
      uint64_t{1} << 30,
      {uint64_t{64} << 10, uint64_t{1} << 40},
      "Capacity of the embedded store in bytes (keys + values + 64 bytes per entry), split "
      "evenly over its shards. When full, the eviction policy makes room."};
  IntParam shards{
      *this,
      "BAGUA_CACHE_SHARDS",
      16,
      {1, 1024},
      "Number of independently locked shards of the embedded store. More shards mean less lock "
      "contention between reader threads; each shard gets capacity/shards bytes."};
  EnumParam eviction{
      *this,
      "BAGUA_CACHE_EVICTION",
      "lru",
      {{"lru", "drop the least recently used entry of the shard"},
       {"random", "drop a random entry of the shard (Redis allkeys-random, Bagua's choice)"},
       {"none", "keep what is cached and refuse new entries when full"}},
      "Eviction policy of the embedded store when a shard is full."};
  StringParam persistPath{
      *this, "BAGUA_CACHE_PERSIST_PATH", "",
      "LMDB file that mirrors the embedded store so a restarted job keeps its cache (a second "
      "file with suffix -lock is created beside it). Empty: memory only. One process per file.",
      "a file path, or empty"};
  IntParam writerBufferSize{
      *this,
      "BAGUA_CACHE_WRITER_BUFFER",
      20,
      {1, 1 << 20},
      "Samples loaded on a miss are written back in batches of this many (Bagua's "
      "writer_buffer_size)."};
  IntParam flushEveryReads{
      *this,
      "BAGUA_CACHE_FLUSH_EVERY_READS",
      1000,
      {0, int64_t{1} << 40},
      "A non-empty write buffer is also flushed after this many reads, so the tail of an epoch "
      "reaches the cache (0: only when full, on flush() and on destruction)."};
  StringParam redisHosts{
      *this,
      "BAGUA_CACHE_REDIS_HOSTS",
      "",
      "Redis servers as host:port[,host:port...]. Empty: spawn BAGUA_CACHE_REDIS_SPAWN local "
      "redis-server processes on free loopback ports and stop them on exit.",
      "comma-separated host:port list (IPv6 as [addr]:port), or empty",
      validateRedisHosts};
  BoolParam redisClusterMode{
      *this, "BAGUA_CACHE_REDIS_CLUSTER_MODE", true,
      "true: shard keys over all listed servers by a hash of the key. false: this node uses only "
      "server number node_rank % count (Bagua's cluster_mode=False)."};
  IntParam redisNodeRank{*this,
                         "BAGUA_CACHE_REDIS_NODE_RANK",
                         0,
                         {0, 1 << 20},
                         "Rank of this node, used to pick its server when cluster mode is off."};
  IntParam redisSpawn{*this,
                      "BAGUA_CACHE_REDIS_SPAWN",
                      1,
                      {1, 64},
                      "Number of local redis-server processes to spawn when no hosts are listed."};
  BytesParam redisCapacityPerNode{
      *this,
      "BAGUA_CACHE_REDIS_CAPACITY_PER_NODE",
      uint64_t{8} << 30,
      {uint64_t{1} << 20, uint64_t{1} << 42},
      "maxmemory of each spawned redis-server. Bagua used 100 GiB, more than many machines "
      "have; we default to 8 GiB."};
  EnumParam redisPolicy{
      *this,
      "BAGUA_CACHE_REDIS_POLICY",
      "allkeys-random",
      {{"allkeys-random", "evict random keys at maxmemory (Bagua)"},
       {"allkeys-lru", "evict approximately least recently used keys"},
       {"noeviction", "refuse writes at maxmemory (they count as dropped writes)"}},
      "maxmemory-policy of spawned redis-server processes."};
  StringParam redisServer{
      *this, "BAGUA_CACHE_REDIS_SERVER", "redis-server",
      "The redis-server binary to spawn: a path, or a name looked up on PATH and then in "
      "/usr/bin.",
      "a file name or path"};
  IntParam redisTimeoutMs{*this,
                          "BAGUA_CACHE_REDIS_TIMEOUT_MS",
                          1000,
                          {10, 600000},
                          "Connect and per-command timeout for Redis, in milliseconds."};
  IntParam redisRetryMs{
      *this,
      "BAGUA_CACHE_REDIS_RETRY_MS",
      1000,
      {1, 600000},
      "After a Redis server fails, calls to it fail fast for this long before one reconnect "
      "attempt, so an outage costs the job no timeouts per sample."};
};
CacheParams& cacheParams();

// The dataset cache's log category (BAGUA_LOG_SUBSYS name "cache").
inline const LogCategory kLogCache{"cache"};

}  // namespace bagua::cache
