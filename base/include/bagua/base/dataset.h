// The dataset interface of the whole toolkit: index -> sample bytes. The dataset cache
// (bagua::cache::CachedDataset) is one and reads another; the loader (bagua::loader::DataLoader)
// reads any, so a cached dataset goes straight into a loader.
//
// Contract for implementations:
//   - size() is constant for the dataset's lifetime (the samplers assume it, as Bagua does).
//   - get() may be called concurrently from several threads (the loader's workers), for any
//     index in [0, size()); it fills `out` (replacing its contents; callers reuse its capacity)
//     or returns an error with context (which index, why). Callers do not retry errors.
#pragma once

#include <cstddef>
#include <string>

#include "bagua/base/status.h"

namespace bagua {

// A sample: opaque bytes (what a cache stores and what a collate function packs into a batch).
using Sample = std::string;

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

}  // namespace bagua
