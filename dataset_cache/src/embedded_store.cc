#include "bagua/dataset_cache/embedded_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <utility>

#if BAGUA_CACHE_HAVE_LMDB
#include <fcntl.h>
#include <lmdb.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
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
  BAGUA_ASSIGN_OR_RETURN(o.capacityBytes, cacheParams().capacity.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t shards, cacheParams().shards.get());
  o.shards = static_cast<int>(shards);
  BAGUA_ASSIGN_OR_RETURN(std::string eviction, cacheParams().eviction.get());
  BAGUA_ASSIGN_OR_RETURN(o.eviction, parseEviction(eviction));
  BAGUA_ASSIGN_OR_RETURN(o.persistPath, cacheParams().persistPath.get());
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
    // One store per file: memory is authoritative, so two stores on one file would undo each
    // other's evictions (and LMDB forbids opening one environment twice in a process). An
    // exclusive flock on the data file (LMDB's own locks live in the -lock file) enforces it.
    m->ownerFd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (m->ownerFd_ < 0) {
      return BAGUA_ERRNO(errno, strPrintf("open '%s'", path.c_str()));
    }
    if (::flock(m->ownerFd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return BAGUA_ERROR(kFailedPrecondition,
                           "'%s' is already used by another embedded cache (in this or another "
                           "process); give each job its own BAGUA_CACHE_PERSIST_PATH",
                           path.c_str());
      }
      return BAGUA_ERRNO(errno, strPrintf("flock '%s'", path.c_str()));
    }
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
    if (ownerFd_ >= 0) {
      ::close(ownerFd_);  // releases the flock
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
  int ownerFd_ = -1;
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

// Note [Shard layout]: each entry is one allocation, a small header followed by the key and
// the value bytes, so a hit touches the table slot, then one contiguous block whose first line
// holds the key and the start of the value. The table is open-addressed (linear probing, load
// at most 1/2, backward-shift deletion) and stores the full hash next to the pointer, so a probe
// rarely dereferences a non-matching entry. std::unordered_map + std::list would touch the
// bucket, the predecessor node, the node, the value buffer and the list neighbours: five or six
// cache misses per hit, against two here (get rates: bench/RESULTS.md, "Dataset cache").
//
// "lru" is approximated by CLOCK (second chance), as Redis approximates its LRU: a hit only sets
// the entry's referenced flag (in the entry's own first cache line); eviction looks at the back
// of the shard's insertion-ordered list and gives a referenced entry a second chance (flag
// cleared, moved to the front) until it finds an unreferenced one. So hits never touch other
// entries' memory, and an entry read since it last reached the back is never the victim.
struct EmbeddedStore::Shard {
  struct Item {
    Item* prev;
    Item* next;
    uint64_t hash;
    size_t index;  // position in `items` (kRandom)
    uint32_t keyBytes;
    uint32_t referenced;  // read since it last reached the back of the list (kLru)
    size_t valueBytes;

    char* data() { return reinterpret_cast<char*>(this + 1); }
    std::string_view key() { return {data(), keyBytes}; }
    std::string_view value() { return {data() + keyBytes, valueBytes}; }
  };
  struct Slot {
    uint64_t hash = 0;
    Item* item = nullptr;
  };
  static constexpr size_t kNpos = ~size_t{0};

  std::mutex mu;
  std::vector<Slot> table = std::vector<Slot>(16);
  size_t count = 0;
  Item head{};               // sentinel of the circular list (kLru); head.next = newest
  std::vector<Item*> items;  // every entry, for random picks (kRandom)
  std::mt19937_64 rng;
  uint64_t capacity = 0;
  uint64_t bytes = 0;
  uint64_t evictions = 0;
  uint64_t rejected = 0;
  uint64_t persistErrors = 0;
  Eviction eviction = Eviction::kLru;

  Shard() { head.prev = head.next = &head; }
  ~Shard() { clear(); }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  static uint64_t cost(size_t keyBytes, size_t valueBytes) {
    return keyBytes + valueBytes + kEntryOverhead;
  }
  static uint64_t cost(Item* it) { return cost(it->keyBytes, it->valueBytes); }

  size_t mask() const { return table.size() - 1; }

  size_t findSlot(std::string_view key, uint64_t h) const {
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const Slot& slot = table[i];
      if (slot.item == nullptr) {
        return kNpos;
      }
      if (slot.hash == h && slot.item->key() == key) {
        return i;
      }
    }
  }

  Item* find(std::string_view key, uint64_t h) const {
    size_t i = findSlot(key, h);
    return i == kNpos ? nullptr : table[i].item;
  }

  void placeInTable(uint64_t h, Item* item) {
    size_t i = h & mask();
    while (table[i].item != nullptr) {
      i = (i + 1) & mask();
    }
    table[i] = Slot{h, item};
  }

  void grow() {
    std::vector<Slot> old(table.size() * 2);
    old.swap(table);
    for (const Slot& slot : old) {
      if (slot.item != nullptr) {
        placeInTable(slot.hash, slot.item);
      }
    }
  }

  // Backward-shift deletion keeps every probe chain intact without tombstones.
  void removeSlot(size_t i) {
    size_t j = i;
    while (true) {
      table[i].item = nullptr;
      while (true) {
        j = (j + 1) & mask();
        if (table[j].item == nullptr) {
          return;
        }
        size_t home = table[j].hash & mask();
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
          break;
        }
      }
      table[i] = table[j];
      i = j;
    }
  }

  void linkFront(Item* it) {
    it->next = head.next;
    it->prev = &head;
    head.next->prev = it;
    head.next = it;
  }
  static void unlink(Item* it) {
    it->prev->next = it->next;
    it->next->prev = it->prev;
  }

  static void touch(Item* it) {
    if (it->referenced == 0) {  // no store when already set: the line stays clean
      it->referenced = 1;
    }
  }

  Item* allocate(std::string_view key, std::string_view value, uint64_t h) {
    void* mem = ::operator new(sizeof(Item) + key.size() + value.size());
    Item* it = new (mem) Item{};
    it->hash = h;
    it->keyBytes = static_cast<uint32_t>(key.size());
    it->valueBytes = value.size();
    std::memcpy(it->data(), key.data(), key.size());
    if (!value.empty()) {
      std::memcpy(it->data() + key.size(), value.data(), value.size());
    }
    return it;
  }

  void add(Item* it) {
    if ((count + 1) * 2 > table.size()) {
      grow();
    }
    placeInTable(it->hash, it);
    ++count;
    bytes += cost(it);
    if (eviction == Eviction::kLru) {
      linkFront(it);
    } else if (eviction == Eviction::kRandom) {
      it->index = items.size();
      items.push_back(it);
    }
  }

  void erase(Item* it) {
    size_t i = it->hash & mask();
    while (table[i].item != it) {
      i = (i + 1) & mask();
    }
    removeSlot(i);
    --count;
    bytes -= cost(it);
    if (eviction == Eviction::kLru) {
      unlink(it);
    } else if (eviction == Eviction::kRandom) {
      items[it->index] = items.back();
      items[it->index]->index = it->index;
      items.pop_back();
    }
    it->~Item();
    ::operator delete(it);
  }

  Item* victim() {
    if (eviction == Eviction::kLru) {
      // Terminates: every pass over a referenced entry clears its flag.
      while (head.prev->referenced != 0) {
        Item* it = head.prev;
        it->referenced = 0;
        unlink(it);
        linkFront(it);
      }
      return head.prev;
    }
    std::uniform_int_distribution<size_t> pick(0, items.size() - 1);
    return items[pick(rng)];
  }

  void clear() {
    for (Slot& slot : table) {
      if (slot.item != nullptr) {
        slot.item->~Item();
        ::operator delete(slot.item);
        slot.item = nullptr;
      }
    }
    table.assign(16, Slot{});
    count = 0;
    bytes = 0;
    items.clear();
    head.prev = head.next = &head;
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
    BAGUA_LOG_INFO(kLogCache, "embedded cache: loaded %llu entries from %s",
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
    const uint64_t h = detail::hashKey(key);
    Shard& s = shardFor(h);
    std::lock_guard<std::mutex> lock(s.mu);
    insertLocked(s, key, value, &dropped);
    // Keys refused while loading (the capacity shrank) leave the file too; evicted ones are
    // already in `dropped`.
    if (s.find(key, h) == nullptr) {
      dropped.emplace_back(key);
    }
  }));
  // Loading made no evictions in the user's sense.
  loaded_ = 0;
  for (auto& s : shards_) {
    s->evictions = 0;
    s->rejected = 0;
    loaded_ += s->count;
  }
  return mirror_->apply({}, dropped);
}

EmbeddedStore::Shard& EmbeddedStore::shardFor(uint64_t hash) const {
  return *shards_[(hash >> 40) % shards_.size()];
}

void EmbeddedStore::insertLocked(Shard& s, std::string_view key, std::string_view value,
                                 std::vector<std::string>* evicted) {
  const uint64_t h = detail::hashKey(key);
  const uint64_t cost = Shard::cost(key.size(), value.size());
  if (Shard::Item* old = s.find(key, h); old != nullptr) {
    // Replaced by a new block; the old one leaves first so the budget check below is exact.
    s.erase(old);
    if (evicted != nullptr) {
      evicted->emplace_back(key);  // the mirror drops it unless the new value is stored
    }
  }
  if (cost > s.capacity || key.size() > UINT32_MAX) {
    ++s.rejected;
    return;
  }
  while (s.bytes + cost > s.capacity) {
    if (s.eviction == Eviction::kNone || s.count == 0) {
      ++s.rejected;
      return;
    }
    Shard::Item* v = s.victim();
    if (evicted != nullptr) {
      evicted->emplace_back(v->key());
    }
    s.erase(v);
    ++s.evictions;
  }
  s.add(s.allocate(key, value, h));
}

Result<bool> EmbeddedStore::get(std::string_view key, std::string& value) {
  const uint64_t h = detail::hashKey(key);
  Shard& s = shardFor(h);
  std::lock_guard<std::mutex> lock(s.mu);
  Shard::Item* it = s.find(key, h);
  if (it == nullptr) {
    return false;
  }
  s.touch(it);
  value.assign(it->value());
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
      auto holds = [&](std::string_view k) { return s.find(k, detail::hashKey(k)) != nullptr; };
      std::erase_if(puts, [&](const auto& kv) { return !holds(kv.first); });
      std::erase_if(evicted, [&](const std::string& k) { return holds(k); });
      Status st = mirror_->apply(puts, evicted);
      if (!st.isOk()) {
        ++s.persistErrors;
        if (!mirror_->reported.exchange(true, std::memory_order_relaxed)) {
          BAGUA_LOG_WARN(kLogCache,
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
    n += s->count;
  }
  return n;
}

Status EmbeddedStore::clear() {
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->clear();
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
    u.entries += s->count;
    u.bytes += s->bytes;
    u.evictions += s->evictions;
    u.rejected += s->rejected;
    u.persistErrors += s->persistErrors;
  }
  u.loaded = loaded_;
  return u;
}

}  // namespace bagua::cache
