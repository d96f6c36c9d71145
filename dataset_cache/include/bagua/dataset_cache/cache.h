// The dataset cache in one include: backends, CacheLoader, CachedDataset, and makeBackend(),
// which builds the backend the catalogue (or the caller) asks for.
#pragma once

#include <memory>
#include <string>

#include "bagua/base/status.h"
#include "bagua/dataset_cache/backend.h"
#include "bagua/dataset_cache/cache_loader.h"
#include "bagua/dataset_cache/cached_dataset.h"
#include "bagua/dataset_cache/embedded_store.h"
#include "bagua/dataset_cache/params.h"
#include "bagua/dataset_cache/redis_store.h"

namespace bagua::cache {

enum class BackendKind { kEmbedded, kRedis };

struct CacheOptions {
  BackendKind backend = BackendKind::kEmbedded;
  EmbeddedOptions embedded;
  RedisOptions redis;

  // Every field from the catalogue (BAGUA_CACHE_*); the first invalid value is the error.
  static Result<CacheOptions> fromParams();
};

// Builds the backend. The result is shared: several CacheLoaders (datasets) may use one backend,
// and it lives until the last of them is gone (spawned Redis servers stop then).
Result<std::shared_ptr<CacheBackend>> makeBackend(CacheOptions options);

}  // namespace bagua::cache
