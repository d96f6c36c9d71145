#include "bagua/dataset_cache/cached_dataset.h"

#include <array>
#include <utility>

namespace bagua::cache {

CachedDataset::CachedDataset(const Dataset& source, std::shared_ptr<CacheBackend> backend,
                             std::string datasetName, size_t writerBufferSize)
    : CachedDataset(source, std::move(backend),
                    CacheLoaderOptions{std::move(datasetName), writerBufferSize}) {}

CachedDataset::CachedDataset(const Dataset& source, std::shared_ptr<CacheBackend> backend,
                             CacheLoaderOptions options)
    : source_(source), loader_(std::move(backend), std::move(options)) {}

Status CachedDataset::get(size_t index, Sample& sample) const {
  if (index >= source_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "sample %zu out of range (dataset '%s' has %zu)", index,
                       loader_.options().datasetName.c_str(), source_.size());
  }
  char key[24];
  auto [end, ec] = std::to_chars(key, key + sizeof(key), index);
  (void)ec;
  return loader_.get(
      std::string_view(key, static_cast<size_t>(end - key)), sample,
      [&](std::string_view, std::string& value) { return source_.get(index, value); });
}

Status CachedDataset::getMany(std::span<const size_t> indices, std::vector<Sample>& samples) const {
  std::vector<std::array<char, 24>> buf(indices.size());
  std::vector<std::string_view> keys(indices.size());
  for (size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] >= source_.size()) {
      return BAGUA_ERROR(kInvalidArgument, "sample %zu out of range (dataset '%s' has %zu)",
                         indices[j], loader_.options().datasetName.c_str(), source_.size());
    }
    auto [end, ec] = std::to_chars(buf[j].data(), buf[j].data() + buf[j].size(), indices[j]);
    (void)ec;
    keys[j] = std::string_view(buf[j].data(), static_cast<size_t>(end - buf[j].data()));
  }
  return loader_.getMany(
      keys, samples, [&](size_t j, std::string& value) { return source_.get(indices[j], value); });
}

}  // namespace bagua::cache
