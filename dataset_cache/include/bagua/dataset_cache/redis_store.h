// RedisStore: the cache backend on Redis servers, through hiredis (Bagua's RedisStore).
//
// Servers: a list of host:port. With none listed, the store spawns `spawn` local redis-server
// processes (LocalRedisServer) with a memory cap, an eviction policy and a fresh random password
// each (protected mode, loopback only), and stops them when it is destroyed. Cluster mode (the
// default) shards keys over every server by a stable hash of the key; otherwise this node uses only
// server nodeRank % count. Batches are one MGET / MSET per server, all sent before any reply is
// read (pipelined across servers).
//
// Faults: a command that fails on the connection (refused, reset, timed out) marks that server
// down; calls that need it then fail fast with kUnavailable for `retryInterval`, after which one
// caller tries to reconnect. So a dead server costs one timeout per retry interval, not one per
// sample, and a server that comes back is used again without any action from the caller.
// Reporting the outage (once) is the caller's job (CacheLoader does it). A Redis error reply
// (e.g. OOM under noeviction) does not mark the server down and returns kResourceExhausted.
//
// Thread model: every method may be called from any thread. Each server keeps a pool of idle
// connections under its own mutex (held only to take or return a connection, never across a
// network call); a call borrows one connection per server it needs, one server at a time, so
// the number of connections per server grows to the number of concurrent callers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/dataset_cache/backend.h"
#include "bagua/dataset_cache/local_redis_server.h"

struct redisReply;  // hiredis, used only by the implementation

namespace bagua::cache {

struct RedisHost {
  std::string host;
  int port = 6379;
  std::string password{};  // sent with AUTH on every new connection when not empty
};

// Parses "host:port[,host:port...]" (IPv6 as "[::1]:6379"); empty text gives an empty list.
Result<std::vector<RedisHost>> parseRedisHosts(std::string_view text);

struct RedisOptions {
  std::vector<RedisHost> hosts;  // empty: spawn local servers
  bool clusterMode = true;
  int nodeRank = 0;
  // Spawned servers (hosts empty only).
  int spawn = 1;
  uint64_t capacityPerNode = uint64_t{8} << 30;
  std::string maxMemoryPolicy = "allkeys-random";
  std::string serverBinary = "redis-server";
  std::chrono::milliseconds timeout{1000};        // connect and per command
  std::chrono::milliseconds retryInterval{1000};  // a down server is skipped this long

  // Defaults from the catalogue (BAGUA_CACHE_REDIS_*).
  static Result<RedisOptions> fromParams();
};

class RedisStore final : public CacheBackend {
 public:
  // Spawns servers if none are listed (kNotFound when redis-server is missing). Servers that do
  // not answer yet are not an error: they are marked down and retried later. Fails with
  // kFailedPrecondition in a build without hiredis.
  static Result<std::unique_ptr<RedisStore>> create(RedisOptions options);
  ~RedisStore() override;

  Result<bool> get(std::string_view key, std::string& value) override;
  Status getMany(std::span<const std::string_view> keys,
                 std::vector<std::optional<std::string>>& values) override;
  Status put(std::string_view key, std::string_view value) override;
  Status putMany(std::span<const KeyValue> items) override;
  Result<uint64_t> numKeys() override;
  Status clear() override;
  Status ping() override;
  std::string describe() const override;

  // The servers in use (after spawning), in shard order.
  std::vector<RedisHost> servers() const;
  // Index into servers() that holds `key`.
  size_t serverFor(std::string_view key) const;

 private:
  struct Server;
  class Conn;

  explicit RedisStore(RedisOptions options);

  // Sends one `command` per server that holds any of the `count` items (keyOf(i) places item
  // i; addArgs appends its arguments), all before any reply is read, then hands each server's
  // reply to onReply with that server's item indices. A server that fails leaves its items out;
  // the others still complete, and the first error is returned.
  Status pipelinePerServer(
      size_t count, const std::function<std::string_view(size_t)>& keyOf, const char* command,
      const std::function<void(size_t, std::vector<const char*>&, std::vector<size_t>&)>& addArgs,
      const std::function<Status(const std::vector<size_t>&, const redisReply&)>& onReply);

  RedisOptions options_;
  std::vector<LocalRedisServer> spawned_;
  std::vector<std::unique_ptr<Server>> servers_;  // the servers this node uses
};

}  // namespace bagua::cache
