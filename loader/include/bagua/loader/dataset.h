// The dataset interface the loader reads from: "index -> sample".
//
// A sample is an opaque byte string (what a cache stores and what a collate function packs into
// a batch). Any indexable source fits: an in-memory vector, files on disk, or a caching wrapper
// such as bagua::cache's dataset (wired by the lead; the loader does not depend on it).
//
// Contract for implementations:
//   - size() is constant for the dataset's lifetime (the samplers assume it, as Bagua does).
//   - get() may be called concurrently from several loader worker threads, for any index in
//     [0, size()); it must be thread-safe. It fills `out` (replacing its contents; the loader
//     reuses the vector's capacity) or returns an error with context (which index, why).
//   - Errors are not retried by the loader; it hands the first one to the caller of next().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::loader {

using Sample = std::vector<uint8_t>;

class Dataset {
 public:
  Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  virtual ~Dataset() = default;

  virtual size_t size() const = 0;
  // Thread-safe. Fills `out` with sample `index`.
  [[nodiscard]] virtual Status get(size_t index, Sample& out) const = 0;
};

// A dataset held in memory (tests, benchmarks, small corpora). Thread-safe for get().
class VectorDataset final : public Dataset {
 public:
  explicit VectorDataset(std::vector<Sample> samples) : samples_(std::move(samples)) {}

  size_t size() const override { return samples_.size(); }
  Status get(size_t index, Sample& out) const override;

 private:
  std::vector<Sample> samples_;
};

// A dataset defined by a function (synthetic data, adapters). The function must be thread-safe.
class FunctionDataset final : public Dataset {
 public:
  using GetFn = std::function<Status(size_t index, Sample& out)>;
  FunctionDataset(size_t size, GetFn fn) : size_(size), fn_(std::move(fn)) {}

  size_t size() const override { return size_; }
  Status get(size_t index, Sample& out) const override;

 private:
  size_t size_;
  GetFn fn_;
};

}  // namespace bagua::loader
