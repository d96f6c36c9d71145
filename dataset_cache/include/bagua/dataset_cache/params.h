// The dataset cache's parameter catalogue (bagua-params lists it under "dataset_cache").
//
// Every knob of the library is declared once in src/params.cc; the options structs
// (EmbeddedOptions, RedisOptions, CacheLoaderOptions, CacheOptions) take their defaults from it
// through fromParams(), and a field set by the caller beats the environment.
//
// Thread safety: as ParamCatalogue (see bagua/base/params.h).
#pragma once

#include "bagua/base/params.h"

namespace bagua::cache {

// The catalogue, created on first call (function-local static).
ParamCatalogue& cacheParams();

// Typed accessors for the parameters above. Each returns the validated value or the error that
// names the key, the bad value and what is accepted.
namespace params {
Param<std::string>& backend();
Param<uint64_t>& capacity();
Param<int64_t>& shards();
Param<std::string>& eviction();
Param<std::string>& persistPath();
Param<int64_t>& writerBufferSize();
Param<int64_t>& flushEveryReads();
Param<std::string>& redisHosts();
Param<bool>& redisClusterMode();
Param<int64_t>& redisNodeRank();
Param<int64_t>& redisSpawn();
Param<uint64_t>& redisCapacityPerNode();
Param<std::string>& redisPolicy();
Param<std::string>& redisServer();
Param<int64_t>& redisTimeoutMs();
Param<int64_t>& redisRetryMs();
}  // namespace params

}  // namespace bagua::cache
