// In-memory and prefix stores.
#include <algorithm>
#include <cstring>

#include "bagua/core/store.h"

namespace bagua::core {

Bytes toBytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string toString(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

namespace {

std::string joinMissing(const std::vector<std::string>& keys, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < limit; ++i) {
    out += (i ? ", " : "") + keys[i];
  }
  if (keys.size() > limit) {
    out += strPrintf(" and %zu more", keys.size() - limit);
  }
  return out;
}

Result<int64_t> parseCounter(const std::string& key, const Bytes& b) {
  if (b.empty()) {
    return int64_t{0};
  }
  std::string s = toString(b);
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') {
    return BAGUA_ERROR(kInvalidArgument, "store key '%s' holds '%s', not an integer counter",
                       key.c_str(), s.c_str());
  }
  return static_cast<int64_t>(v);
}

}  // namespace

Status InMemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
  return Status::ok();
}

Result<Bytes> InMemoryStore::get(const std::string& key, Millis timeout) {
  BAGUA_RETURN_IF_ERROR(wait({key}, timeout));
  std::lock_guard<std::mutex> lock(mu_);
  return data_.at(key);
}

Status InMemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& k : keys) {
      if (data_.find(k) == data_.end()) {
        m.push_back(k);
      }
    }
    return m;
  };
  if (!cv_.wait_for(lock, timeout, [&] { return missing().empty(); })) {
    return BAGUA_ERROR(kDeadlineExceeded, "store: waited %lld ms for keys that never appeared: %s",
                       static_cast<long long>(timeout.count()), joinMissing(missing()).c_str());
  }
  return Status::ok();
}

Result<int64_t> InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      BAGUA_ASSIGN_OR_RETURN(v, parseCounter(key, it->second));
    }
    v += delta;
    data_[key] = toBytes(std::to_string(v));
  }
  cv_.notify_all();
  return v;
}

Result<Bytes> InMemoryStore::compareSet(const std::string& key, const Bytes& expected,
                                        const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    const Bytes current = it == data_.end() ? Bytes{} : it->second;
    if (current == expected) {
      data_[key] = desired;
      result = desired;
    } else {
      result = current;
    }
  }
  cv_.notify_all();
  return result;
}

Result<bool> InMemoryStore::check(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.find(key) != data_.end();
}

Status PrefixStore::set(const std::string& key, const Bytes& value) {
  return base_->set(prefix_ + key, value);
}
Result<Bytes> PrefixStore::get(const std::string& key, Millis timeout) {
  return base_->get(prefix_ + key, timeout);
}
Status PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> k;
  k.reserve(keys.size());
  for (const auto& key : keys) {
    k.push_back(prefix_ + key);
  }
  return base_->wait(k, timeout);
}
Result<int64_t> PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(prefix_ + key, delta);
}
Result<Bytes> PrefixStore::compareSet(const std::string& key, const Bytes& expected,
                                      const Bytes& desired) {
  return base_->compareSet(prefix_ + key, expected, desired);
}
Result<bool> PrefixStore::check(const std::string& key) {
  return base_->check(prefix_ + key);
}

}  // namespace bagua::core
