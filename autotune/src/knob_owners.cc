#include "bagua/autotune/knob_owners.h"

#include <atomic>

namespace bagua::autotune {

KnobOwners& KnobOwners::process() {
  static KnobOwners owners;
  return owners;
}

uint64_t KnobOwners::newOwnerId() {
  static std::atomic<uint64_t> next{1};
  // Only uniqueness matters; no other memory is published through the counter.
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::optional<std::string> KnobOwners::claim(const std::string& resource, uint64_t owner,
                                             const std::string& model) {
  if (resource.empty()) {
    return std::nullopt;  // a private knob: nothing to share
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = held_.try_emplace(resource, Holder{owner, model});
  if (inserted || it->second.owner == owner) {
    return std::nullopt;
  }
  return it->second.model;
}

std::vector<std::string> KnobOwners::releaseAll(uint64_t owner) {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.owner == owner) {
      out.push_back(it->first);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::optional<std::string> KnobOwners::holder(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(resource);
  if (it == held_.end()) {
    return std::nullopt;
  }
  return it->second.model;
}

size_t KnobOwners::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

}  // namespace bagua::autotune
