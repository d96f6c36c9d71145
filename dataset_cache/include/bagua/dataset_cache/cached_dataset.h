// Datasets and their cached wrappers (Bagua's CachedDataset).
//
// Dataset: bagua::Dataset (base/include/bagua/base/dataset.h), index -> sample bytes, the
// interface the loader reads too. CachedDataset(source, backend, name, writerBufferSize) serves
// sample i from the cache under key "{name}_{i}" and falls through to source.get(i) on a miss,
// writing back in batches (see CacheLoader for batching, faults and counters); it is itself a
// bagua::Dataset, so it goes straight into a bagua::loader::DataLoader.
//
// TypedDataset<T> / TypedCachedDataset<T>: the same for typed samples, with a Serializer<T>
// (encode to bytes, decode with validation). A cached value that fails to decode is a miss and is
// reported (CacheStats::corrupt). Serializers are provided for std::string and for std::vector of
// arithmetic types; specialise Serializer<T> for your own sample types.
//
// Cache only the deterministic preprocessing: random augmentation belongs after the cache
// (Bagua's tutorial advice), or every epoch would see the first epoch's random draws.
//
// Thread model: get() may be called from several threads at once (the loader's workers) when the
// source's get() may; nothing else is locked beyond CacheLoader's write queue.
//
// Ownership: the source is borrowed and must outlive the cached dataset; the backend is shared
// (several datasets may use one). A null backend disables caching (every read from the source).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "bagua/base/dataset.h"
#include "bagua/base/status.h"
#include "bagua/dataset_cache/backend.h"
#include "bagua/dataset_cache/cache_loader.h"

namespace bagua::cache {

using bagua::Dataset;
using bagua::Sample;

class CachedDataset final : public Dataset {
 public:
  CachedDataset(const Dataset& source, std::shared_ptr<CacheBackend> backend,
                std::string datasetName, size_t writerBufferSize = 20);
  CachedDataset(const Dataset& source, std::shared_ptr<CacheBackend> backend,
                CacheLoaderOptions options);

  size_t size() const override { return source_.size(); }
  // kInvalidArgument for an index out of range; the source's error (with context) on a miss
  // that the source cannot serve. Never fails because of the cache.
  Status get(size_t index, Sample& sample) const override;

  // Many samples with one backend round trip per server (for a loader that knows its batch):
  // samples[j] is sample indices[j]; misses come from the source in order.
  Status getMany(std::span<const size_t> indices, std::vector<Sample>& samples) const;

  Status flush() { return loader_.flush(); }
  CacheStats stats() const { return loader_.stats(); }
  CacheLoader& loader() { return loader_; }

 private:
  const Dataset& source_;
  mutable CacheLoader loader_;  // thread-safe
};

// ---- Typed samples -----------------------------------------------------------------------------

// Specialise for a sample type: static void encode(const T&, std::string& out) appends the
// bytes; static Result<T> decode(std::string_view bytes) validates and rebuilds.
template <typename T>
struct Serializer;

template <>
struct Serializer<std::string> {
  static void encode(const std::string& v, std::string& out) { out.append(v); }
  static Result<std::string> decode(std::string_view bytes) { return std::string(bytes); }
};

// Layout: "BGV1", element size (uint32), element count (uint64), the elements (native byte
// order: a cache is not an exchange format).
template <typename E>
requires std::is_arithmetic_v<E>
struct Serializer<std::vector<E>> {
  static constexpr char kMagic[4] = {'B', 'G', 'V', '1'};
  static constexpr size_t kHeader = 16;

  static void encode(const std::vector<E>& v, std::string& out) {
    const uint32_t elem = sizeof(E);
    const uint64_t count = v.size();
    const size_t at = out.size();
    out.resize(at + kHeader + v.size() * sizeof(E));
    std::memcpy(out.data() + at, kMagic, 4);
    std::memcpy(out.data() + at + 4, &elem, 4);
    std::memcpy(out.data() + at + 8, &count, 8);
    if (!v.empty()) {
      std::memcpy(out.data() + at + kHeader, v.data(), v.size() * sizeof(E));
    }
  }

  static Result<std::vector<E>> decode(std::string_view bytes) {
    if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, 4) != 0) {
      return BAGUA_ERROR(kInvalidArgument, "not a serialized vector (%zu bytes, bad header)",
                         bytes.size());
    }
    uint32_t elem = 0;
    uint64_t count = 0;
    std::memcpy(&elem, bytes.data() + 4, 4);
    std::memcpy(&count, bytes.data() + 8, 8);
    if (elem != sizeof(E)) {
      return BAGUA_ERROR(kInvalidArgument, "serialized vector has %u-byte elements, expected %zu",
                         elem, sizeof(E));
    }
    if (count > (bytes.size() - kHeader) / sizeof(E) ||
        bytes.size() - kHeader != count * sizeof(E)) {
      return BAGUA_ERROR(kInvalidArgument,
                         "serialized vector claims %llu elements but holds %zu payload bytes",
                         static_cast<unsigned long long>(count), bytes.size() - kHeader);
    }
    std::vector<E> v(count);
    if (count > 0) {
      std::memcpy(v.data(), bytes.data() + kHeader, count * sizeof(E));
    }
    return v;
  }
};

template <typename T>
class TypedDataset {
 public:
  TypedDataset() = default;
  TypedDataset(const TypedDataset&) = delete;
  TypedDataset& operator=(const TypedDataset&) = delete;
  virtual ~TypedDataset() = default;

  virtual size_t size() const = 0;
  virtual Result<T> get(size_t index) = 0;
};

template <typename T, typename Ser = Serializer<T>>
class TypedCachedDataset final : public TypedDataset<T> {
 public:
  TypedCachedDataset(TypedDataset<T>& source, std::shared_ptr<CacheBackend> backend,
                     CacheLoaderOptions options)
      : source_(source), loader_(std::move(backend), std::move(options)) {}
  TypedCachedDataset(TypedDataset<T>& source, std::shared_ptr<CacheBackend> backend,
                     std::string datasetName, size_t writerBufferSize = 20)
      : TypedCachedDataset(source, std::move(backend),
                           CacheLoaderOptions{std::move(datasetName), writerBufferSize}) {}

  size_t size() const override { return source_.size(); }

  Result<T> get(size_t index) override {
    if (index >= source_.size()) {
      return BAGUA_ERROR(kInvalidArgument, "sample %zu out of range (dataset '%s' has %zu)", index,
                         loader_.options().datasetName.c_str(), source_.size());
    }
    char key[24];
    auto [end, ec] = std::to_chars(key, key + sizeof(key), index);
    (void)ec;
    thread_local std::string bytes;
    std::optional<T> out;
    auto load = [&](std::string_view, std::string& value) -> Status {
      Result<T> v = source_.get(index);
      if (!v.isOk()) {
        return v.takeStatus();
      }
      value.clear();
      Ser::encode(*v, value);
      out.emplace(std::move(*v));
      return Status::ok();
    };
    auto check = [&](std::string_view value) -> Status {
      Result<T> v = Ser::decode(value);
      if (!v.isOk()) {
        return v.takeStatus();
      }
      out.emplace(std::move(*v));
      return Status::ok();
    };
    BAGUA_RETURN_IF_ERROR(
        loader_.get(std::string_view(key, static_cast<size_t>(end - key)), bytes, load, check));
    return std::move(*out);
  }

  Status flush() { return loader_.flush(); }
  CacheStats stats() const { return loader_.stats(); }
  CacheLoader& loader() { return loader_; }

 private:
  TypedDataset<T>& source_;
  CacheLoader loader_;
};

}  // namespace bagua::cache
