#include "bagua/dataset_cache/embedded_store.h"

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <random>
#include <unordered_map>
#include <utility>

#if BAGUA_CACHE_HAVE_LMDB
#include <lmdb.h>
#endif

#include "bagua/base/logging.h"
#include "bagua/dataset_cache/params.h"
#include "hash.h"

namespace bagua::cache {

const char* evictionName(Eviction eviction) {
  switch (eviction) {
  case Eviction::kLru:
    return "lru";
  case Eviction::kRandom:
    return "random";
  case Eviction::kNone:
    return "none";
  }
  return "?";
}

Result<Eviction> parseEviction(std::string_view name) {
  if (name == "lru") {
    return Eviction::kLru;
  }
  if (name == "random") {
    return Eviction::kRandom;
  }
  if (name == "none") {
    return Eviction::kNone;
  }
  return BAGUA_ERROR(kInvalidArgument, "unknown eviction policy '%.*s' (lru, random or none)",
                     static_cast<int>(name.size()), name.data());
}

Result<EmbeddedOptions> EmbeddedOptions::fromParams() {
  EmbeddedOptions o;
  BAGUA_ASSIGN_OR_RETURN(o.capacityBytes, params::capacity().get());
  BAGUA_ASSIGN_OR_RETURN(int64_t shards, params::shards().get());
  o.shards = static_cast<int>(shards);
  BAGUA_ASSIGN_OR_RETURN(std::string eviction, params::eviction().get());
  BAGUA_ASSIGN_OR_RETURN(o.eviction, parseEviction(eviction));
  BAGUA_ASSIGN_OR_RETURN(o.persistPath, params::persistPath().get());
  return o;
}

// ---- Persistence mirror ------------------------------------------------------------------------

#if BAGUA_CACHE_HAVE_LMDB

bool persistenceAvailable() {
  return true;
}

class EmbeddedStore::Mirror {
 public:
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;

  static Result<std::unique_ptr<Mirror>> open(const std::string& path, uint64_t mapBytes) {
    auto m = std::unique_ptr<Mirror>(new Mirror(path));
    int rc = mdb_env_create(&m->env_);
    if (rc != 0) {
      return m->lmdbError(rc, "mdb_env_create");
    }
    rc = mdb_env_set_mapsize(m->env_, mapBytes);
    if (rc != 0) {
      return m->lmdbError(rc, "mdb_env_set_mapsize");
    }
    // MDB_NOSYNC: see the header (synced on close). MDB_NOTLS: read transactions are not tied
    // to a thread.
    rc = mdb_env_open(m->env_, path.c_str(), MDB_NOSUBDIR | MDB_NOSYNC | MDB_NOTLS, 0644);
    if (rc != 0) {
      return m->lmdbError(rc, "mdb_env_open");
    }
    MDB_txn* txn = nullptr;
    rc = mdb_txn_begin(m->env_, nullptr, 0, &txn);
    if (rc != 0) {
      return m->lmdbError(rc, "mdb_txn_begin");
    }
    rc = mdb_dbi_open(txn, nullptr, 0, &m->dbi_);
    if (rc != 0) {
      mdb_txn_abort(txn);
      return m->lmdbError(rc, "mdb_dbi_open");
    }
    rc = mdb_txn_commit(txn);
    if (rc != 0) {
      return m->lmdbError(rc, "mdb_txn_commit");
    }
    return m;
  }

  ~Mirror() {
    if (env_ != nullptr) {
      mdb_env_sync(env_, 1);
      mdb_env_close(env_);
    }
  }

  // Calls fn(key, value) for every stored pair.
  template <typename Fn>
  Status forEach(Fn&& fn) {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
    if (rc != 0) {
      return lmdbError(rc, "mdb_txn_begin(read)");
    }
    MDB_cursor* cur = nullptr;
    rc = mdb_cursor_open(txn, dbi_, &cur);
    if (rc != 0) {
      mdb_txn_abort(txn);
      return lmdbError(rc, "mdb_cursor_open");
    }
    MDB_val k;
    MDB_val v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      fn(std::string_view(static_cast<const char*>(k.mv_data), k.mv_size),
         std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return rc == MDB_NOTFOUND ? Status::ok() : lmdbError(rc, "mdb_cursor_get");
  }

  // One write transaction: delete `erase`, then write `puts`. Empty keys are skipped (LMDB does
  // not allow them; the memory store still holds them).
  Status apply(std::span<const std::pair<std::string_view, std::string_view>> puts,
               std::span<const std::string> erase, bool dropAll = false) {
    if (puts.empty() && erase.empty() && !dropAll) {
      return Status::ok();
    }
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
    if (rc != 0) {
      return lmdbError(rc, "mdb_txn_begin(write)");
    }
    if (dropAll) {
      rc = mdb_drop(txn, dbi_, 0);
      if (rc != 0) {
        mdb_txn_abort(txn);
        return lmdbError(rc, "mdb_drop");
      }
    }
    for (const std::string& key : erase) {
      if (key.empty() || key.size() > maxKey()) {
        continue;
      }
      MDB_val k{key.size(), const_cast<char*>(key.data())};
      rc = mdb_del(txn, dbi_, &k, nullptr);
      if (rc != 0 && rc != MDB_NOTFOUND) {
        mdb_txn_abort(txn);
        return lmdbError(rc, "mdb_del");
      }
    }
    for (const auto& [key, value] : puts) {
      if (key.empty() || key.size() > maxKey()) {
        continue;
      }
      MDB_val k{key.size(), const_cast<char*>(key.data())};
      MDB_val v{value.size(), const_cast<char*>(value.data())};
      rc = mdb_put(txn, dbi_, &k, &v, 0);
      if (rc != 0) {
        mdb_txn_abort(txn);
        return lmdbError(rc, "mdb_put");
      }
    }
    rc = mdb_txn_commit(txn);
    return rc == 0 ? Status::ok() : lmdbError(rc, "mdb_txn_commit");
  }

  const std::string& path() const { return path_; }

  std::atomic<bool> reported{false};  // a write failure was logged (once per store)

 private:
  explicit Mirror(std::string path) : path_(std::move(path)) {}

  size_t maxKey() const { return static_cast<size_t>(mdb_env_get_maxkeysize(env_)); }

  Status lmdbError(int rc, const char* what) const {
    return BAGUA_ERROR(kSystemError, "LMDB %s on '%s' failed: %s", what, path_.c_str(),
                       mdb_strerror(rc));
  }

  std::string path_;
  MDB_env* env_ = nullptr;
  MDB_dbi dbi_ = 0;
};

#else  // !BAGUA_CACHE_HAVE_LMDB

bool persistenceAvailable() {
  return false;
}

// Never instantiated: create() refuses a persistence path in this build.
class EmbeddedStore::Mirror {
 public:
  template <typename Fn>
  Status forEach(Fn&&) {
    return Status::ok();
  }
  Status apply(std::span<const std::pair<std::string_view, std::string_view>>,
               std::span<const std::string>, bool = false) {
    return Status::ok();
  }
  const std::string& path() const { return path_; }

  std::atomic<bool> reported{false};

 private:
  std::string path_;
};

#endif  // BAGUA_CACHE_HAVE_LMDB

// ---- Shards ------------------------------------------------------------------------------------

namespace {

struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view k) const { return static_cast<size_t>(detail::hashKey(k)); }
};

}  // namespace

struct EmbeddedStore::Shard {
  struct Entry;
  using Map = std::unordered_map<std::string, Entry, KeyHash, std::equal_to<>>;
  using Node = Map::value_type;  // address stable until erased (node-based container)
  struct Entry {
    std::string value;
    std::list<Node*>::iterator lru;  // Eviction::kLru only
    size_t slot = 0;                 // Eviction::kRandom only: index in `slots`
  };

  std::mutex mu;
  Map map;
  std::list<Node*> lru;      // front: most recently used
  std::vector<Node*> slots;  // every node, for random picks
  std::mt19937_64 rng;
  uint64_t capacity = 0;
  uint64_t bytes = 0;
  uint64_t evictions = 0;
  uint64_t rejected = 0;
  uint64_t persistErrors = 0;
  Eviction eviction = Eviction::kLru;

  static uint64_t cost(size_t keyBytes, size_t valueBytes) {
    return keyBytes + valueBytes + kEntryOverhead;
  }

  void erase(Node* node) {
    bytes -= cost(node->first.size(), node->second.value.size());
    if (eviction == Eviction::kLru) {
      lru.erase(node->second.lru);
    } else if (eviction == Eviction::kRandom) {
      size_t slot = node->second.slot;
      slots[slot] = slots.back();
      slots[slot]->second.slot = slot;
      slots.pop_back();
    }
    auto it = map.find(std::string_view(node->first));
    map.erase(it);
  }

  Node* victim() {
    if (eviction == Eviction::kLru) {
      return lru.back();
    }
    std::uniform_int_distribution<size_t> pick(0, slots.size() - 1);
    return slots[pick(rng)];
  }
};

EmbeddedStore::EmbeddedStore(EmbeddedOptions options) : options_(std::move(options)) {
  const uint64_t perShard = options_.capacityBytes / static_cast<uint64_t>(options_.shards);
  for (int i = 0; i < options_.shards; ++i) {
    auto s = std::make_unique<Shard>();
    s->capacity = perShard;
    s->eviction = options_.eviction;
    s->rng.seed(options_.seed + static_cast<uint64_t>(i));
    shards_.push_back(std::move(s));
  }
}

EmbeddedStore::~EmbeddedStore() = default;

Result<std::unique_ptr<EmbeddedStore>> EmbeddedStore::create(EmbeddedOptions options) {
  if (options.shards < 1 || options.shards > 1024) {
    return BAGUA_ERROR(kInvalidArgument, "embedded cache: shards must be in [1, 1024], got %d",
                       options.shards);
  }
  if (options.capacityBytes / static_cast<uint64_t>(options.shards) < 2 * kEntryOverhead) {
    return BAGUA_ERROR(kInvalidArgument,
                       "embedded cache: capacity %llu bytes over %d shards leaves less than %llu "
                       "bytes per shard; raise the capacity or lower the shard count",
                       static_cast<unsigned long long>(options.capacityBytes), options.shards,
                       static_cast<unsigned long long>(2 * kEntryOverhead));
  }
  auto store = std::unique_ptr<EmbeddedStore>(new EmbeddedStore(std::move(options)));
  if (!store->options_.persistPath.empty()) {
#if BAGUA_CACHE_HAVE_LMDB
    // The file holds at most the capacity plus LMDB's page overhead; the map is sparse, so a
    // generous size costs no disk.
    uint64_t mapBytes = std::max<uint64_t>(store->options_.capacityBytes * 2, uint64_t{64} << 20);
    Result<std::unique_ptr<Mirror>> mirror = Mirror::open(store->options_.persistPath, mapBytes);
    if (!mirror.isOk()) {
      Status s = mirror.takeStatus();
      return std::move(s.withContext("embedded cache persistence").addFrame(__FILE__, __LINE__));
    }
    store->mirror_ = std::move(*mirror);
    BAGUA_RETURN_IF_ERROR(store->loadFromMirror());
    BAGUA_LOG_INFO(kCache, "embedded cache: loaded %llu entries from %s",
                   static_cast<unsigned long long>(store->loaded_),
                   store->options_.persistPath.c_str());
#else
    return BAGUA_ERROR(kFailedPrecondition,
                       "embedded cache: persistence to '%s' needs LMDB, and this build has none "
                       "(install liblmdb-dev and reconfigure), or unset BAGUA_CACHE_PERSIST_PATH",
                       store->options_.persistPath.c_str());
#endif
  }
  return store;
}

Status EmbeddedStore::loadFromMirror() {
  std::vector<std::string> dropped;
  BAGUA_RETURN_IF_ERROR(mirror_->forEach([&](std::string_view key, std::string_view value) {
    Shard& s = shardFor(detail::hashKey(key));
    std::lock_guard<std::mutex> lock(s.mu);
    size_t before = dropped.size();
    insertLocked(s, key, value, &dropped);
    // Keys evicted or refused while loading (the capacity shrank) leave the file too.
    if (s.map.find(key) != s.map.end()) {
      ++loaded_;
    } else if (dropped.size() == before) {
      dropped.emplace_back(key);
    }
  }));
  // Loading made no evictions in the user's sense.
  for (auto& s : shards_) {
    s->evictions = 0;
    s->rejected = 0;
  }
  loaded_ = 0;
  for (auto& s : shards_) {
    loaded_ += s->map.size();
  }
  return mirror_->apply({}, dropped);
}

EmbeddedStore::Shard& EmbeddedStore::shardFor(uint64_t hash) const {
  return *shards_[(hash >> 40) % shards_.size()];
}

void EmbeddedStore::insertLocked(Shard& s, std::string_view key, std::string_view value,
                                 std::vector<std::string>* evicted) {
  const uint64_t cost = Shard::cost(key.size(), value.size());
  auto it = s.map.find(key);
  if (it != s.map.end()) {
    if (s.eviction == Eviction::kLru) {
      s.lru.splice(s.lru.begin(), s.lru, it->second.lru);
    }
    const uint64_t old = Shard::cost(key.size(), it->second.value.size());
    if (s.bytes - old + cost <= s.capacity) {
      it->second.value.assign(value);
      s.bytes = s.bytes - old + cost;
      return;
    }
    // Does not fit in place: drop the old value and insert as new.
    s.erase(&*it);
    if (evicted != nullptr) {
      evicted->emplace_back(key);
    }
  }
  if (cost > s.capacity) {
    ++s.rejected;
    return;
  }
  while (s.bytes + cost > s.capacity) {
    if (s.eviction == Eviction::kNone || s.map.empty()) {
      ++s.rejected;
      return;
    }
    Shard::Node* v = s.victim();
    if (evicted != nullptr) {
      evicted->push_back(v->first);
    }
    s.erase(v);
    ++s.evictions;
  }
  auto [pos, inserted] = s.map.try_emplace(std::string(key));
  BAGUA_ASSERT(inserted, "key was erased above");
  Shard::Node* node = &*pos;
  node->second.value.assign(value);
  s.bytes += cost;
  if (s.eviction == Eviction::kLru) {
    s.lru.push_front(node);
    node->second.lru = s.lru.begin();
  } else if (s.eviction == Eviction::kRandom) {
    node->second.slot = s.slots.size();
    s.slots.push_back(node);
  }
}

Result<bool> EmbeddedStore::get(std::string_view key, std::string& value) {
  Shard& s = shardFor(detail::hashKey(key));
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(key);
  if (it == s.map.end()) {
    return false;
  }
  if (s.eviction == Eviction::kLru) {
    s.lru.splice(s.lru.begin(), s.lru, it->second.lru);
  }
  value.assign(it->second.value);
  return true;
}

Status EmbeddedStore::getMany(std::span<const std::string_view> keys,
                              std::vector<std::optional<std::string>>& values) {
  values.resize(keys.size());
  std::string tmp;
  for (size_t i = 0; i < keys.size(); ++i) {
    BAGUA_ASSIGN_OR_RETURN(bool hit, get(keys[i], tmp));
    if (hit) {
      values[i] = tmp;
    } else {
      values[i].reset();
    }
  }
  return Status::ok();
}

Status EmbeddedStore::put(std::string_view key, std::string_view value) {
  KeyValue kv{std::string(key), std::string(value)};
  return putMany(std::span<const KeyValue>(&kv, 1));
}

Status EmbeddedStore::putMany(std::span<const KeyValue> items) {
  if (items.empty()) {
    return Status::ok();
  }
  // Group by shard so each shard is locked once per batch.
  std::vector<std::pair<size_t, size_t>> order;  // (shard, item)
  order.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    order.emplace_back((detail::hashKey(items[i].key) >> 40) % shards_.size(), i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> evicted;
  std::vector<std::pair<std::string_view, std::string_view>> puts;
  for (size_t b = 0; b < order.size();) {
    size_t e = b;
    while (e < order.size() && order[e].first == order[b].first) {
      ++e;
    }
    Shard& s = *shards_[order[b].first];
    std::lock_guard<std::mutex> lock(s.mu);
    evicted.clear();
    puts.clear();
    for (size_t j = b; j < e; ++j) {
      const KeyValue& kv = items[order[j].second];
      insertLocked(s, kv.key, kv.value, mirror_ ? &evicted : nullptr);
      if (mirror_) {
        puts.emplace_back(kv.key, kv.value);
      }
    }
    if (mirror_) {
      // Entries of this batch may have been evicted by later ones or refused: write only what
      // the shard holds now, and delete the evicted ones.
      std::erase_if(puts, [&](const auto& kv) { return s.map.find(kv.first) == s.map.end(); });
      std::erase_if(evicted, [&](const std::string& k) { return s.map.find(k) != s.map.end(); });
      Status st = mirror_->apply(puts, evicted);
      if (!st.isOk()) {
        ++s.persistErrors;
        if (!mirror_->reported.exchange(true, std::memory_order_relaxed)) {
          BAGUA_LOG_WARN(kCache,
                         "embedded cache: persisting to %s failed, continuing in memory: %s",
                         mirror_->path().c_str(), st.toString().c_str());
        }
      }
    }
    b = e;
  }
  return Status::ok();
}

Result<uint64_t> EmbeddedStore::numKeys() {
  uint64_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    n += s->map.size();
  }
  return n;
}

Status EmbeddedStore::clear() {
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->map.clear();
    s->lru.clear();
    s->slots.clear();
    s->bytes = 0;
  }
  if (mirror_) {
    // Taken without a shard lock: a put racing with clear() may survive in the file, as it may
    // in memory.
    BAGUA_RETURN_IF_ERROR(mirror_->apply({}, {}, /*dropAll=*/true));
  }
  return Status::ok();
}

std::string EmbeddedStore::describe() const {
  return strPrintf("embedded %d shards, %s, %s%s%s", options_.shards,
                   formatBytes(options_.capacityBytes).c_str(), evictionName(options_.eviction),
                   options_.persistPath.empty() ? "" : ", persisted to ",
                   options_.persistPath.c_str());
}

EmbeddedStore::Usage EmbeddedStore::usage() const {
  Usage u;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    u.entries += s->map.size();
    u.bytes += s->bytes;
    u.evictions += s->evictions;
    u.rejected += s->rejected;
    u.persistErrors += s->persistErrors;
  }
  u.loaded = loaded_;
  return u;
}

}  // namespace bagua::cache
