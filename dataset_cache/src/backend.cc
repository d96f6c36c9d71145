#include <charconv>
#include <utility>

#include "bagua/dataset_cache/cache.h"

namespace bagua::cache {

Result<std::vector<RedisHost>> parseRedisHosts(std::string_view text) {
  std::vector<RedisHost> hosts;
  if (text.empty()) {
    return hosts;
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    std::string_view host;
    std::string_view port;
    if (!item.empty() && item.front() == '[') {
      size_t close = item.find(']');
      if (close == item.npos || close + 1 >= item.size() || item[close + 1] != ':') {
        return BAGUA_ERROR(kInvalidArgument, "'%.*s' is not [ipv6]:port",
                           static_cast<int>(item.size()), item.data());
      }
      host = item.substr(1, close - 1);
      port = item.substr(close + 2);
    } else {
      size_t colon = item.rfind(':');
      if (colon == item.npos || item.find(':') != colon) {
        return BAGUA_ERROR(kInvalidArgument, "'%.*s' is not host:port",
                           static_cast<int>(item.size()), item.data());
      }
      host = item.substr(0, colon);
      port = item.substr(colon + 1);
    }
    int p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() ||
        p < 1 || p > 65535) {
      return BAGUA_ERROR(kInvalidArgument, "'%.*s': need a host and a port in [1, 65535]",
                         static_cast<int>(item.size()), item.data());
    }
    hosts.push_back({std::string(host), p});
    if (comma == std::string_view::npos) {
      break;
    }
    pos = comma + 1;
  }
  return hosts;
}

Result<RedisOptions> RedisOptions::fromParams() {
  RedisOptions o;
  BAGUA_ASSIGN_OR_RETURN(std::string hosts, cacheParams().redisHosts.get());
  BAGUA_ASSIGN_OR_RETURN(o.hosts, parseRedisHosts(hosts));
  BAGUA_ASSIGN_OR_RETURN(o.clusterMode, cacheParams().redisClusterMode.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t rank, cacheParams().redisNodeRank.get());
  o.nodeRank = static_cast<int>(rank);
  BAGUA_ASSIGN_OR_RETURN(int64_t spawn, cacheParams().redisSpawn.get());
  o.spawn = static_cast<int>(spawn);
  BAGUA_ASSIGN_OR_RETURN(o.capacityPerNode, cacheParams().redisCapacityPerNode.get());
  BAGUA_ASSIGN_OR_RETURN(o.maxMemoryPolicy, cacheParams().redisPolicy.get());
  BAGUA_ASSIGN_OR_RETURN(o.serverBinary, cacheParams().redisServer.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t timeoutMs, cacheParams().redisTimeoutMs.get());
  o.timeout = std::chrono::milliseconds(timeoutMs);
  BAGUA_ASSIGN_OR_RETURN(int64_t retryMs, cacheParams().redisRetryMs.get());
  o.retryInterval = std::chrono::milliseconds(retryMs);
  return o;
}

Result<CacheOptions> CacheOptions::fromParams() {
  CacheOptions o;
  BAGUA_ASSIGN_OR_RETURN(std::string backend, cacheParams().backend.get());
  o.backend = backend == "redis" ? BackendKind::kRedis : BackendKind::kEmbedded;
  BAGUA_ASSIGN_OR_RETURN(o.embedded, EmbeddedOptions::fromParams());
  BAGUA_ASSIGN_OR_RETURN(o.redis, RedisOptions::fromParams());
  return o;
}

Result<std::shared_ptr<CacheBackend>> makeBackend(CacheOptions options) {
  if (options.backend == BackendKind::kRedis) {
    BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<RedisStore> redis,
                           RedisStore::create(std::move(options.redis)));
    return std::shared_ptr<CacheBackend>(std::move(redis));
  }
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddedStore> embedded,
                         EmbeddedStore::create(std::move(options.embedded)));
  return std::shared_ptr<CacheBackend>(std::move(embedded));
}

}  // namespace bagua::cache
