// EmbeddedStore: the default cache backend. In-process, sharded by key hash, each shard with its
// own mutex, a byte budget (capacity / shards) and an eviction policy; optionally mirrored to an
// LMDB file so that a restarted job starts with the cache its previous run built.
//
// Accounting: an entry costs key.size() + value.size() + kEntryOverhead bytes. An entry larger
// than a whole shard is not stored (counted in Usage::rejected).
//
// Persistence: memory is authoritative; the LMDB file mirrors it (every write and every
// eviction is applied to the file in the same shard critical section, one transaction per
// batch). create() loads the file back, up to the capacity, dropping what does not fit. The file
// is written without fsync per transaction (MDB_NOSYNC) and synced in the destructor: a crash of
// the process loses nothing that reached the kernel; a crash of the machine may lose the tail.
// One store per file (an exclusive flock; a second create() fails with kFailedPrecondition). If the
// file cannot be written (disk full, map full), the store reports it once and carries on in memory.
//
// Thread model: every method may be called from any thread. A call locks one shard at a time
// (putMany locks the shards of its batch one after another, never two at once); the LMDB write
// lock is taken inside a shard lock, never the other way round. get() takes its shard's lock
// too (it sets the entry's referenced flag), held for the lookup and the copy of the value.
//
// Eviction kLru is CLOCK: a read marks the entry; when the shard is full, the oldest entry in
// insertion order is dropped unless marked, in which case it is unmarked and moved to the front
// (a second chance). An entry read since it last reached the back is never the victim.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/dataset_cache/backend.h"

namespace bagua::cache {

enum class Eviction {
  kLru,     // least recently used entry of the shard, approximated by CLOCK (second chance)
  kRandom,  // a random entry of the shard (Redis allkeys-random)
  kNone,    // refuse new entries when the shard is full
};

const char* evictionName(Eviction eviction);
Result<Eviction> parseEviction(std::string_view name);

struct EmbeddedOptions {
  uint64_t capacityBytes = uint64_t{1} << 30;
  int shards = 16;
  Eviction eviction = Eviction::kLru;
  std::string persistPath;  // empty: memory only
  uint64_t seed = 0x5eed;   // for Eviction::kRandom

  // Defaults from the catalogue (BAGUA_CACHE_CAPACITY, _SHARDS, _EVICTION, _PERSIST_PATH).
  static Result<EmbeddedOptions> fromParams();
};

class EmbeddedStore final : public CacheBackend {
 public:
  static constexpr uint64_t kEntryOverhead = 64;

  // Fails with kInvalidArgument on bad options and kFailedPrecondition when persistence is asked
  // for but the build has no LMDB, or the file cannot be opened.
  static Result<std::unique_ptr<EmbeddedStore>> create(EmbeddedOptions options);
  ~EmbeddedStore() override;

  Result<bool> get(std::string_view key, std::string& value) override;
  Status getMany(std::span<const std::string_view> keys,
                 std::vector<std::optional<std::string>>& values) override;
  Status put(std::string_view key, std::string_view value) override;
  Status putMany(std::span<const KeyValue> items) override;
  Result<uint64_t> numKeys() override;
  Status clear() override;
  Status ping() override { return Status::ok(); }
  std::string describe() const override;

  struct Usage {
    uint64_t entries = 0;
    uint64_t bytes = 0;          // as accounted above
    uint64_t evictions = 0;      // entries dropped to make room
    uint64_t rejected = 0;       // entries not stored (too large, or full with Eviction::kNone)
    uint64_t loaded = 0;         // entries loaded from the persistence file by create()
    uint64_t persistErrors = 0;  // failed LMDB transactions
  };
  Usage usage() const;
  const EmbeddedOptions& options() const { return options_; }

 private:
  struct Shard;
  class Mirror;

  explicit EmbeddedStore(EmbeddedOptions options);
  Shard& shardFor(uint64_t hash) const;
  // Inserts under the shard lock; appends evicted keys to `evicted` (for the mirror).
  void insertLocked(Shard& shard, std::string_view key, std::string_view value,
                    std::vector<std::string>* evicted);
  Status loadFromMirror();

  EmbeddedOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<Mirror> mirror_;
  uint64_t loaded_ = 0;
};

}  // namespace bagua::cache
