#include "bagua/core/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace bagua::core {

namespace {

std::vector<std::vector<int>> assign(const std::vector<TensorRef>& tensors,
                                     const std::vector<int>& order,
                                     const std::vector<size_t>& limits, bool sortByMin) {
  struct Open {
    std::vector<int> members;
    size_t bytes = 0;
    size_t limitIndex = 0;
  };
  using Key = std::tuple<int, int, int>;
  std::map<Key, Open> open;
  std::vector<Key> keyOrder;
  std::vector<std::vector<int>> out;
  for (int pos : order) {
    const TensorRef& t = tensors[pos];
    Key key{static_cast<int>(t.dtype), static_cast<int>(t.device.type), t.device.index};
    auto [it, inserted] = open.try_emplace(key);
    if (inserted) {
      keyOrder.push_back(key);
    }
    Open& b = it->second;
    b.members.push_back(pos);
    b.bytes += t.bytes();
    const size_t limit = limits.empty() ? 0 : limits[std::min(b.limitIndex, limits.size() - 1)];
    if (b.bytes >= limit) {
      out.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      ++b.limitIndex;
    }
  }
  for (const Key& k : keyOrder) {
    if (!open[k].members.empty()) {
      out.push_back(std::move(open[k].members));
    }
  }
  if (sortByMin) {
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return *std::min_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
    });
  }
  return out;
}

}  // namespace

BucketOptions limitsForModel(const BucketOptions& options, size_t totalBytes) {
  BucketOptions o = options;
  if (totalBytes < kMinBuckets * options.firstBucketBytes) {
    const size_t share = std::max(kMinBucketBytes, (totalBytes + kMinBuckets - 1) / kMinBuckets);
    o.firstBucketBytes = std::min(o.firstBucketBytes, share);
    o.bucketCapBytes = std::min(o.bucketCapBytes, share);
  }
  return o;
}

std::vector<std::vector<int>> computeBucketAssignmentBySize(const std::vector<TensorRef>& tensors,
                                                            const std::vector<size_t>& limits) {
  std::vector<int> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = static_cast<int>(i);
  }
  return assign(tensors, order, limits, true);
}

std::vector<std::vector<int>> computeBucketAssignmentInOrder(const std::vector<TensorRef>& tensors,
                                                             const std::vector<int>& order,
                                                             const std::vector<size_t>& limits) {
  return assign(tensors, order, limits, false);
}

}  // namespace bagua::core
