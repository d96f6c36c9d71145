#include "bagua/dataset_cache/cache_loader.h"

#include <chrono>

#include "bagua/base/logging.h"
#include "bagua/dataset_cache/params.h"

namespace bagua::cache {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

bool isPowerOf10(uint64_t n) {
  while (n >= 10 && n % 10 == 0) {
    n /= 10;
  }
  return n == 1;
}

// Stands in for a null backend: every read misses, nothing is written.
class NoCache final : public CacheBackend {
 public:
  Result<bool> get(std::string_view, std::string&) override { return false; }
  Status getMany(std::span<const std::string_view> keys,
                 std::vector<std::optional<std::string>>& values) override {
    values.assign(keys.size(), std::nullopt);
    return Status::ok();
  }
  Status put(std::string_view, std::string_view) override { return Status::ok(); }
  Status putMany(std::span<const KeyValue>) override { return Status::ok(); }
  Result<uint64_t> numKeys() override { return uint64_t{0}; }
  Status clear() override { return Status::ok(); }
  Status ping() override { return Status::ok(); }
  std::string describe() const override { return "none (caching disabled)"; }
};

}  // namespace

Result<CacheLoaderOptions> CacheLoaderOptions::fromParams(std::string datasetName) {
  CacheLoaderOptions o;
  o.datasetName = std::move(datasetName);
  BAGUA_ASSIGN_OR_RETURN(int64_t buffer, cacheParams().writerBufferSize.get());
  o.writerBufferSize = static_cast<size_t>(buffer);
  BAGUA_ASSIGN_OR_RETURN(int64_t every, cacheParams().flushEveryReads.get());
  o.flushEveryReads = static_cast<uint64_t>(every);
  return o;
}

CacheLoader::CacheLoader(std::shared_ptr<CacheBackend> backend, CacheLoaderOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {
  if (backend_ == nullptr) {
    backend_ = std::make_shared<NoCache>();
    disabled_ = true;
  }
  if (options_.writerBufferSize == 0) {
    options_.writerBufferSize = 1;
  }
  queue_.reserve(options_.writerBufferSize);
}

CacheLoader::~CacheLoader() {
  Status s = flush();
  if (!s.isOk()) {
    BAGUA_LOG_WARN(kLogCache, "cache '%s': final flush failed, %llu values not cached: %s",
                   options_.datasetName.c_str(),
                   static_cast<unsigned long long>(c_.droppedWrites.load(kRelaxed)),
                   s.toString().c_str());
  }
}

std::string CacheLoader::cacheKey(std::string_view key) const {
  std::string full;
  full.reserve(options_.datasetName.size() + 1 + key.size());
  full.append(options_.datasetName).append(1, '_').append(key);
  return full;
}

Status CacheLoader::get(std::string_view key, std::string& value, LoadFn load) {
  return getImpl(key, value, load, nullptr);
}

Status CacheLoader::get(std::string_view key, std::string& value, LoadFn load, CheckFn check) {
  return getImpl(key, value, load, &check);
}

Status CacheLoader::getImpl(std::string_view key, std::string& value, LoadFn load,
                            const CheckFn* check) {
  // One key buffer per thread: no allocation per read once it has grown.
  thread_local std::string full;
  full.assign(options_.datasetName).append(1, '_').append(key);

  countReads(1);

  Result<bool> hit = backend_->get(full, value);
  if (!hit.isOk()) {
    backendFailed(hit.status());
  } else {
    backendOk();
    if (*hit) {
      Status ok = check != nullptr ? (*check)(value) : Status::ok();
      if (ok.isOk()) {
        c_.hits.fetch_add(1, kRelaxed);
        c_.hitBytes.fetch_add(value.size(), kRelaxed);
        return Status::ok();
      }
      reportCorrupt(full, value.size(), ok);
    }
  }

  c_.misses.fetch_add(1, kRelaxed);
  Status loaded = load(key, value);
  if (!loaded.isOk()) {
    loaded.withContext(strPrintf("loading sample '%.*s' of '%s'", static_cast<int>(key.size()),
                                 key.data(), options_.datasetName.c_str()));
    return std::move(loaded.addFrame(__FILE__, __LINE__));
  }
  c_.missBytes.fetch_add(value.size(), kRelaxed);
  // Not `full`: load() may have read through another CacheLoader on this thread (a cached
  // dataset over a cached dataset), which reuses the thread's key buffer.
  enqueue(cacheKey(key), value);
  return Status::ok();
}

void CacheLoader::countReads(uint64_t n) {
  const uint64_t after = reads_.fetch_add(n, kRelaxed) + n;
  const uint64_t every = options_.flushEveryReads;
  // Flush when this call crossed a multiple of `every` (a batch may cross one).
  if (every > 0 && after / every != (after - n) / every) {
    flush().ignore();  // counted and reported inside
  }
}

void CacheLoader::reportCorrupt(std::string_view fullKey, size_t bytes, const Status& why) {
  const uint64_t bad = c_.corrupt.fetch_add(1, kRelaxed) + 1;
  if (isPowerOf10(bad)) {
    BAGUA_LOG_WARN(kLogCache,
                   "cache '%s': cached value of key '%.*s' (%zu bytes) is unreadable, reloading "
                   "it from the source (%llu so far): %s",
                   options_.datasetName.c_str(), static_cast<int>(fullKey.size()), fullKey.data(),
                   bytes, static_cast<unsigned long long>(bad), why.message().c_str());
  }
}

Status CacheLoader::getMany(std::span<const std::string_view> keys,
                            std::vector<std::string>& values, LoadAtFn load) {
  return getManyImpl(keys, values, load, nullptr);
}

Status CacheLoader::getMany(std::span<const std::string_view> keys,
                            std::vector<std::string>& values, LoadAtFn load, CheckAtFn check) {
  return getManyImpl(keys, values, load, &check);
}

Status CacheLoader::getManyImpl(std::span<const std::string_view> keys,
                                std::vector<std::string>& values, LoadAtFn load,
                                const CheckAtFn* check) {
  values.resize(keys.size());
  if (keys.empty()) {
    return Status::ok();
  }
  std::vector<std::string> full(keys.size());
  std::vector<std::string_view> views(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    full[i].assign(options_.datasetName).append(1, '_').append(keys[i]);
    views[i] = full[i];
  }
  countReads(keys.size());
  std::vector<std::optional<std::string>> cached;
  Status s = backend_->getMany(views, cached);
  if (!s.isOk()) {
    // What could be read (other Redis servers) is still used.
    backendFailed(s);
    cached.resize(keys.size());
  } else {
    backendOk();
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (cached[i].has_value()) {
      Status ok = check != nullptr ? (*check)(i, *cached[i]) : Status::ok();
      if (ok.isOk()) {
        c_.hits.fetch_add(1, kRelaxed);
        c_.hitBytes.fetch_add(cached[i]->size(), kRelaxed);
        values[i] = std::move(*cached[i]);
        continue;
      }
      reportCorrupt(full[i], cached[i]->size(), ok);
    }
    c_.misses.fetch_add(1, kRelaxed);
    Status loaded = load(i, values[i]);
    if (!loaded.isOk()) {
      loaded.withContext(strPrintf("loading sample '%.*s' of '%s'",
                                   static_cast<int>(keys[i].size()), keys[i].data(),
                                   options_.datasetName.c_str()));
      return std::move(loaded.addFrame(__FILE__, __LINE__));
    }
    c_.missBytes.fetch_add(values[i].size(), kRelaxed);
    enqueue(full[i], values[i]);
  }
  return Status::ok();
}

void CacheLoader::enqueue(std::string fullKey, const std::string& value) {
  if (disabled_) {
    return;
  }
  std::vector<KeyValue> batch;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    queue_.push_back({std::move(fullKey), value});
    if (queue_.size() < options_.writerBufferSize) {
      return;
    }
    batch.swap(queue_);
    queue_.reserve(options_.writerBufferSize);
  }
  writeBatch(batch).ignore();  // counted and reported inside
}

Status CacheLoader::flush() {
  std::vector<KeyValue> batch;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (queue_.empty()) {
      return Status::ok();
    }
    batch.swap(queue_);
    queue_.reserve(options_.writerBufferSize);
  }
  return writeBatch(batch);
}

Status CacheLoader::writeBatch(std::vector<KeyValue>& batch) {
  Status s = backend_->putMany(batch);
  if (!s.isOk()) {
    c_.droppedWrites.fetch_add(batch.size(), kRelaxed);
    backendFailed(s);
    return s;
  }
  backendOk();
  uint64_t bytes = 0;
  for (const KeyValue& kv : batch) {
    bytes += kv.value.size();
  }
  c_.writes.fetch_add(batch.size(), kRelaxed);
  c_.writtenBytes.fetch_add(bytes, kRelaxed);
  return Status::ok();
}

void CacheLoader::backendFailed(const Status& status) {
  c_.backendErrors.fetch_add(1, kRelaxed);
  if (healthy_.exchange(false, std::memory_order_acq_rel)) {
    c_.outages.fetch_add(1, kRelaxed);
    BAGUA_LOG_WARN(kLogCache,
                   "cache '%s': backend %s failed; serving samples from the source until it "
                   "is back: %s",
                   options_.datasetName.c_str(), backend_->describe().c_str(),
                   status.message().c_str());
  }
}

void CacheLoader::backendOk() {
  if (healthy_.load(kRelaxed)) {
    return;
  }
  // One call succeeding does not end an outage: with one Redis server of several down, calls to
  // the others succeed in between. The whole backend must answer ping(), probed by one thread at
  // most every kProbeInterval.
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = lastProbeNs_.load(kRelaxed);
  if (now - last < kProbeIntervalNs || !lastProbeNs_.compare_exchange_strong(last, now, kRelaxed)) {
    return;
  }
  if (!backend_->ping().isOk()) {
    return;
  }
  if (!healthy_.exchange(true, std::memory_order_acq_rel)) {
    BAGUA_LOG_INFO(kLogCache, "cache '%s': backend %s is back; caching again",
                   options_.datasetName.c_str(), backend_->describe().c_str());
  }
}

CacheStats CacheLoader::stats() const {
  CacheStats s;
  s.hits = c_.hits.load(kRelaxed);
  s.misses = c_.misses.load(kRelaxed);
  s.hitBytes = c_.hitBytes.load(kRelaxed);
  s.missBytes = c_.missBytes.load(kRelaxed);
  s.writes = c_.writes.load(kRelaxed);
  s.writtenBytes = c_.writtenBytes.load(kRelaxed);
  s.droppedWrites = c_.droppedWrites.load(kRelaxed);
  s.corrupt = c_.corrupt.load(kRelaxed);
  s.backendErrors = c_.backendErrors.load(kRelaxed);
  s.outages = c_.outages.load(kRelaxed);
  return s;
}

void CacheLoader::resetStats() {
  for (std::atomic<uint64_t>* a :
       {&c_.hits, &c_.misses, &c_.hitBytes, &c_.missBytes, &c_.writes, &c_.writtenBytes,
        &c_.droppedWrites, &c_.corrupt, &c_.backendErrors, &c_.outages}) {
    a->store(0, kRelaxed);
  }
}

}  // namespace bagua::cache
