// The datasets the loader reads: bagua::Dataset (base/include/bagua/base/dataset.h: index ->
// sample bytes, get() thread-safe), and two implementations for samples in memory or made by a
// function. A cached dataset (bagua::cache::CachedDataset) is a bagua::Dataset too.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "bagua/base/dataset.h"
#include "bagua/base/status.h"

namespace bagua::loader {

using bagua::Dataset;
using bagua::Sample;

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
