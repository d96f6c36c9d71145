#include "bagua/dataset_cache/params.h"

#include "bagua/dataset_cache/redis_store.h"

namespace bagua::cache {
namespace {

Status validateHosts(const std::string& text) {
  Result<std::vector<RedisHost>> hosts = parseRedisHosts(text);
  return hosts.isOk() ? Status::ok() : hosts.takeStatus();
}

// The catalogue and typed references to its parameters; members are initialised in order, so
// `cat` exists before the add*() calls below use it.
struct Catalogue {
  ParamCatalogue cat{"dataset_cache",
                     "cached dataset: embedded (default) or Redis backends, write batching"};

  Param<std::string>& backend =
      cat.addEnum("BAGUA_CACHE_BACKEND", "embedded",
                  {{"embedded", "in-process sharded store, optionally persisted with LMDB"},
                   {"redis", "Redis servers through hiredis, listed or spawned locally"}},
                  "Where cached samples live.");
  Param<uint64_t>& capacity = cat.addBytes(
      "BAGUA_CACHE_CAPACITY", uint64_t{1} << 30, uint64_t{64} << 10, uint64_t{1} << 40,
      "Capacity of the embedded store in bytes (keys + values + 64 bytes per entry), split "
      "evenly over its shards. When full, the eviction policy makes room.");
  Param<int64_t>& shards = cat.addInt(
      "BAGUA_CACHE_SHARDS", 16, 1, 1024,
      "Number of independently locked shards of the embedded store. More shards mean less lock "
      "contention between reader threads; each shard gets capacity/shards bytes.");
  Param<std::string>& eviction = cat.addEnum(
      "BAGUA_CACHE_EVICTION", "lru",
      {{"lru", "drop the least recently used entry of the shard"},
       {"random", "drop a random entry of the shard (Redis allkeys-random, Bagua's choice)"},
       {"none", "keep what is cached and refuse new entries when full"}},
      "Eviction policy of the embedded store when a shard is full.");
  Param<std::string>& persistPath = cat.addString(
      "BAGUA_CACHE_PERSIST_PATH", "",
      "LMDB file that mirrors the embedded store so a restarted job keeps its cache (a second "
      "file with suffix -lock is created beside it). Empty: memory only. One process per file.",
      "a file path, or empty");
  Param<int64_t>& writerBufferSize =
      cat.addInt("BAGUA_CACHE_WRITER_BUFFER", 20, 1, 1 << 20,
                 "Samples loaded on a miss are written back in batches of this many (Bagua's "
                 "writer_buffer_size).");
  Param<int64_t>& flushEveryReads = cat.addInt(
      "BAGUA_CACHE_FLUSH_EVERY_READS", 1000, 0, int64_t{1} << 40,
      "A non-empty write buffer is also flushed after this many reads, so the tail of an epoch "
      "reaches the cache (0: only when full, on flush() and on destruction).");
  Param<std::string>& redisHosts = cat.addString(
      "BAGUA_CACHE_REDIS_HOSTS", "",
      "Redis servers as host:port[,host:port...]. Empty: spawn BAGUA_CACHE_REDIS_SPAWN local "
      "redis-server processes on free loopback ports and stop them on exit.",
      "comma-separated host:port list (IPv6 as [addr]:port), or empty", validateHosts);
  Param<bool>& redisClusterMode = cat.addBool(
      "BAGUA_CACHE_REDIS_CLUSTER_MODE", true,
      "true: shard keys over all listed servers by a hash of the key. false: this node uses only "
      "server number node_rank % count (Bagua's cluster_mode=False).");
  Param<int64_t>& redisNodeRank =
      cat.addInt("BAGUA_CACHE_REDIS_NODE_RANK", 0, 0, 1 << 20,
                 "Rank of this node, used to pick its server when cluster mode is off.");
  Param<int64_t>& redisSpawn =
      cat.addInt("BAGUA_CACHE_REDIS_SPAWN", 1, 1, 64,
                 "Number of local redis-server processes to spawn when no hosts are listed.");
  Param<uint64_t>& redisCapacityPerNode = cat.addBytes(
      "BAGUA_CACHE_REDIS_CAPACITY_PER_NODE", uint64_t{8} << 30, uint64_t{1} << 20,
      uint64_t{1} << 42,
      "maxmemory of each spawned redis-server. Bagua used 100 GiB, more than many machines "
      "have; we default to 8 GiB.");
  Param<std::string>& redisPolicy =
      cat.addEnum("BAGUA_CACHE_REDIS_POLICY", "allkeys-random",
                  {{"allkeys-random", "evict random keys at maxmemory (Bagua)"},
                   {"allkeys-lru", "evict approximately least recently used keys"},
                   {"noeviction", "refuse writes at maxmemory (they count as dropped writes)"}},
                  "maxmemory-policy of spawned redis-server processes.");
  Param<std::string>& redisServer = cat.addString(
      "BAGUA_CACHE_REDIS_SERVER", "redis-server",
      "The redis-server binary to spawn: a path, or a name looked up on PATH and then in "
      "/usr/bin.",
      "a file name or path");
  Param<int64_t>& redisTimeoutMs =
      cat.addInt("BAGUA_CACHE_REDIS_TIMEOUT_MS", 1000, 10, 600000,
                 "Connect and per-command timeout for Redis, in milliseconds.");
  Param<int64_t>& redisRetryMs = cat.addInt(
      "BAGUA_CACHE_REDIS_RETRY_MS", 1000, 1, 600000,
      "After a Redis server fails, calls to it fail fast for this long before one reconnect "
      "attempt, so an outage costs the job no timeouts per sample.");
};

Catalogue& catalogue() {
  static Catalogue c;
  return c;
}

}  // namespace

ParamCatalogue& cacheParams() {
  return catalogue().cat;
}

namespace params {
Param<std::string>& backend() {
  return catalogue().backend;
}
Param<uint64_t>& capacity() {
  return catalogue().capacity;
}
Param<int64_t>& shards() {
  return catalogue().shards;
}
Param<std::string>& eviction() {
  return catalogue().eviction;
}
Param<std::string>& persistPath() {
  return catalogue().persistPath;
}
Param<int64_t>& writerBufferSize() {
  return catalogue().writerBufferSize;
}
Param<int64_t>& flushEveryReads() {
  return catalogue().flushEveryReads;
}
Param<std::string>& redisHosts() {
  return catalogue().redisHosts;
}
Param<bool>& redisClusterMode() {
  return catalogue().redisClusterMode;
}
Param<int64_t>& redisNodeRank() {
  return catalogue().redisNodeRank;
}
Param<int64_t>& redisSpawn() {
  return catalogue().redisSpawn;
}
Param<uint64_t>& redisCapacityPerNode() {
  return catalogue().redisCapacityPerNode;
}
Param<std::string>& redisPolicy() {
  return catalogue().redisPolicy;
}
Param<std::string>& redisServer() {
  return catalogue().redisServer;
}
Param<int64_t>& redisTimeoutMs() {
  return catalogue().redisTimeoutMs;
}
Param<int64_t>& redisRetryMs() {
  return catalogue().redisRetryMs;
}
}  // namespace params

}  // namespace bagua::cache
