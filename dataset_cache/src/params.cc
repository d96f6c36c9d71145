#include "bagua/dataset_cache/params.h"

#include "bagua/dataset_cache/redis_store.h"

namespace bagua::cache {

Status validateRedisHosts(const std::string& text) {
  Result<std::vector<RedisHost>> hosts = parseRedisHosts(text);
  return hosts.isOk() ? Status::ok() : hosts.takeStatus();
}

CacheParams& cacheParams() {
  static CacheParams params;
  return params;
}

}  // namespace bagua::cache
