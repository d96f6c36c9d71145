// CacheLoader: key -> value through a cache backend, with a loader function for misses (Bagua's
// CacheLoader). CachedDataset (cached_dataset.h) is built on it.
//
// get(key, value, load): the backend is asked for "{datasetName}_{key}" (Bagua's key format; two
// loaders with the same dataset name share entries). On a miss, load(key, value) produces the
// value, which is returned and queued for writing; the queue is written with one putMany() when
// it holds writerBufferSize values, every flushEveryReads reads if not empty, on flush(), and in
// the destructor.
//
// Faults, never losing a sample: a backend error on a read counts as a miss (the value comes from
// the loader); a failed batch write is dropped and counted (a cache may forget; keeping the batch
// would grow without bound during an outage). The first failure after a healthy period is logged
// once as a warning (an "outage"). The outage ends when, after a successful call, the whole
// backend answers ping() (probed at most every 100 ms), logged once at info level; so a cluster
// with one server down reports one outage, not one per sample. A
// cached value rejected by the caller's check (it did not deserialize) is a miss, is counted as
// corrupt, is overwritten with the freshly loaded value, and is logged at warning level at the
// 1st, 10th, 100th, ... occurrence.
//
// Thread model: get(), flush(), stats() may be called from any number of threads at once; the
// load and check functions run on the calling thread, without any lock of the loader held. One
// mutex guards the write queue; it is never held across a backend call. Counters are relaxed
// atomics: a snapshot from stats() is consistent per field, not across fields.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/dataset_cache/backend.h"

namespace bagua::cache {

// Counters for progress displays. Plain values (a snapshot).
struct CacheStats {
  uint64_t hits = 0;           // values served from the cache
  uint64_t misses = 0;         // values produced by the loader (includes corrupt and errors)
  uint64_t hitBytes = 0;       // bytes served from the cache
  uint64_t missBytes = 0;      // bytes produced by the loader
  uint64_t writes = 0;         // values written to the backend
  uint64_t writtenBytes = 0;   // bytes (values only) written to the backend
  uint64_t droppedWrites = 0;  // values whose batch write failed
  uint64_t corrupt = 0;        // cached values the check rejected
  uint64_t backendErrors = 0;  // failed backend calls (reads and batch writes)
  uint64_t outages = 0;        // transitions from healthy to failing

  uint64_t reads() const { return hits + misses; }
  // hits / reads, 0 when nothing was read.
  double hitRate() const {
    return reads() == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(reads());
  }
};

// A non-owning reference to a callable (no allocation on the hot path). The callable must outlive
// the call it is passed to.
template <typename Sig>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
           std::is_invocable_r_v<R, F&, Args...>)
      FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

struct CacheLoaderOptions {
  std::string datasetName;
  size_t writerBufferSize = 20;
  uint64_t flushEveryReads = 1000;  // 0: never by count

  // writerBufferSize and flushEveryReads from the catalogue (BAGUA_CACHE_WRITER_BUFFER,
  // BAGUA_CACHE_FLUSH_EVERY_READS).
  static Result<CacheLoaderOptions> fromParams(std::string datasetName);
};

class CacheLoader {
 public:
  // Produces the value of `key` (the caller's key, without the dataset prefix) into `value`.
  using LoadFn = FunctionRef<Status(std::string_view key, std::string& value)>;
  // Accepts (Ok) or rejects a cached value; typically deserializes it.
  using CheckFn = FunctionRef<Status(std::string_view value)>;

  // A null `backend` disables caching: every read goes to the loader and nothing is written
  // (an uncached baseline through the same code). writerBufferSize 0 is treated as 1.
  CacheLoader(std::shared_ptr<CacheBackend> backend, CacheLoaderOptions options);
  // Flushes the write queue; a failure is logged.
  ~CacheLoader();
  CacheLoader(const CacheLoader&) = delete;
  CacheLoader& operator=(const CacheLoader&) = delete;

  // Fills `value` (reusing its capacity) from the cache or from `load`. Errors only come from
  // `load` (with the key added as context); backend failures are absorbed as described above.
  Status get(std::string_view key, std::string& value, LoadFn load);
  Status get(std::string_view key, std::string& value, LoadFn load, CheckFn check);

  // Batch form: values[i] for keys[i], with one backend getMany (Redis: one MGET per server) for
  // all of them; misses are loaded with load(i, values[i]) in order and queued for writing.
  // `values` is resized to keys.size(). Counted and faulted exactly like get() per key.
  using LoadAtFn = FunctionRef<Status(size_t i, std::string& value)>;
  using CheckAtFn = FunctionRef<Status(size_t i, std::string_view value)>;
  Status getMany(std::span<const std::string_view> keys, std::vector<std::string>& values,
                 LoadAtFn load);
  Status getMany(std::span<const std::string_view> keys, std::vector<std::string>& values,
                 LoadAtFn load, CheckAtFn check);

  // Writes the queued values now. Returns the backend's error if the write failed (the batch is
  // dropped and counted either way).
  Status flush();

  // Keys in the backend (all datasets sharing it, as Bagua's num_keys).
  Result<uint64_t> numKeys() { return backend_->numKeys(); }
  CacheStats stats() const;
  void resetStats();
  // The backend key of `key`: "{datasetName}_{key}".
  std::string cacheKey(std::string_view key) const;
  const CacheLoaderOptions& options() const { return options_; }
  CacheBackend& backend() { return *backend_; }

 private:
  Status getImpl(std::string_view key, std::string& value, LoadFn load, const CheckFn* check);
  Status getManyImpl(std::span<const std::string_view> keys, std::vector<std::string>& values,
                     LoadAtFn load, const CheckAtFn* check);
  void countReads(uint64_t n);
  void reportCorrupt(std::string_view fullKey, size_t bytes, const Status& why);
  void enqueue(std::string fullKey, const std::string& value);
  Status writeBatch(std::vector<KeyValue>& batch);
  void backendFailed(const Status& status);
  void backendOk();

  std::shared_ptr<CacheBackend> backend_;
  CacheLoaderOptions options_;

  std::mutex queueMu_;  // guards queue_
  std::vector<KeyValue> queue_;

  static constexpr int64_t kProbeIntervalNs = 100'000'000;  // 100 ms
  bool disabled_ = false;                                   // constructed with a null backend
  std::atomic<bool> healthy_{true};
  std::atomic<int64_t> lastProbeNs_{0};  // steady-clock time of the last recovery probe
  std::atomic<uint64_t> reads_{0};
  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, hitBytes{0}, missBytes{0}, writes{0}, writtenBytes{0},
        droppedWrites{0}, corrupt{0}, backendErrors{0}, outages{0};
  };
  Counters c_;
};

}  // namespace bagua::cache
