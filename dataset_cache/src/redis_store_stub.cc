// RedisStore in a build without hiredis: create() explains what is missing.
#include "bagua/dataset_cache/redis_store.h"

namespace bagua::cache {

bool redisAvailable() {
  return false;
}

struct RedisStore::Server {};

RedisStore::RedisStore(RedisOptions options) : options_(std::move(options)) {}
RedisStore::~RedisStore() = default;

Result<std::unique_ptr<RedisStore>> RedisStore::create(RedisOptions) {
  return BAGUA_ERROR(kFailedPrecondition,
                     "the Redis cache backend needs hiredis, and this build has none (install "
                     "libhiredis-dev and reconfigure), or use BAGUA_CACHE_BACKEND=embedded");
}

Result<bool> RedisStore::get(std::string_view, std::string&) {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
Status RedisStore::getMany(std::span<const std::string_view>,
                           std::vector<std::optional<std::string>>&) {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
Status RedisStore::put(std::string_view, std::string_view) {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
Status RedisStore::putMany(std::span<const KeyValue>) {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
Result<uint64_t> RedisStore::numKeys() {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
Status RedisStore::clear() {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
Status RedisStore::ping() {
  return BAGUA_ERROR(kFailedPrecondition, "built without hiredis");
}
std::string RedisStore::describe() const {
  return "redis (not built)";
}
std::vector<RedisHost> RedisStore::servers() const {
  return {};
}
size_t RedisStore::serverFor(std::string_view) const {
  return 0;
}

}  // namespace bagua::cache
