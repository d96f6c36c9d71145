// FusedOptimizer::saveState / loadState: step counts, states and master weights of every managed
// parameter in a versioned little-endian byte format ("BAGUAOPT", version 1), checked against the
// names, sizes, dtypes and rule on load before anything changes (fused_parts.h).
#include <cstring>
#include <string>
#include <vector>

#include "fused_parts.h"

namespace bagua::optim {

namespace {

constexpr char kMagic[8] = {'B', 'A', 'G', 'U', 'A', 'O', 'P', 'T'};
constexpr uint32_t kFormatVersion = 1;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), b, b + sizeof v);
}

void putString(std::vector<uint8_t>& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <class T>
  Status get(T* v, const char* what) {
    if (b_.size() - pos_ < sizeof(T)) {
      return BAGUA_ERROR(kInvalidArgument, "optimizer state: truncated at %s (offset %zu)", what,
                         pos_);
    }
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }
  Status bytes(void* dst, size_t n, const char* what) {
    if (b_.size() - pos_ < n) {
      return BAGUA_ERROR(kInvalidArgument, "optimizer state: truncated in %s (need %zu bytes)",
                         what, n);
    }
    std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
    return Status::ok();
  }
  Status string(std::string* s, const char* what) {
    uint32_t n = 0;
    BAGUA_RETURN_IF_ERROR(get(&n, what));
    s->resize(n);
    return bytes(s->data(), n, what);
  }
  bool atEnd() const { return pos_ == b_.size(); }
  const uint8_t* here() const { return b_.data() + pos_; }
  Status skip(size_t n, const char* what) {
    if (b_.size() - pos_ < n) {
      return BAGUA_ERROR(kInvalidArgument, "optimizer state: truncated in %s", what);
    }
    pos_ += n;
    return Status::ok();
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::vector<uint8_t>> FusedOptimizer::saveState() const {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof kMagic);
  put<uint32_t>(out, kFormatVersion);
  putString(out, ruleName());
  put<uint32_t>(out, static_cast<uint32_t>(numStates()));
  put<uint64_t>(out, slots_.size());
  for (const auto& s : slots_) {
    putString(out, params_[s->param].name);
    put<uint64_t>(out, s->numel);
    put<uint32_t>(out, static_cast<uint32_t>(s->storage));
    put<int64_t>(out, effectiveStep(*s));
    unsigned mask = 0;
    for (int k = 0; k < numStates(); ++k) {
      mask |= s->state[k] != nullptr ? (1u << k) : 0u;
    }
    put<uint32_t>(out, mask);
    put<uint8_t>(out, s->master != nullptr ? 1 : 0);
    const size_t ses = detail::stateElemSize(s->storage);
    for (int k = 0; k < numStates(); ++k) {
      if (s->state[k] != nullptr) {
        const size_t at = out.size();
        out.resize(at + s->numel * ses);
        BAGUA_RETURN_IF_ERROR(
            detail::toHost(s->device, out.data() + at, s->state[k], s->numel * ses));
      }
    }
    if (s->master != nullptr) {
      const size_t at = out.size();
      out.resize(at + s->numel * 4);
      BAGUA_RETURN_IF_ERROR(detail::toHost(s->device, out.data() + at, s->master, s->numel * 4));
    }
  }
  return out;
}

Status FusedOptimizer::loadState(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  char magic[sizeof kMagic];
  BAGUA_RETURN_IF_ERROR(r.bytes(magic, sizeof magic, "magic"));
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: not a bagua optimizer state");
  }
  uint32_t version = 0;
  BAGUA_RETURN_IF_ERROR(r.get(&version, "version"));
  if (version != kFormatVersion) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: format version %u, expected %u", version,
                       kFormatVersion);
  }
  std::string rule;
  BAGUA_RETURN_IF_ERROR(r.string(&rule, "rule"));
  if (rule != ruleName()) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: saved by '%s', loading into '%s'",
                       rule.c_str(), ruleName());
  }
  uint32_t nstates = 0;
  uint64_t nslots = 0;
  BAGUA_RETURN_IF_ERROR(r.get(&nstates, "state count"));
  BAGUA_RETURN_IF_ERROR(r.get(&nslots, "parameter count"));
  if (nstates != static_cast<uint32_t>(numStates()) || nslots != slots_.size()) {
    return BAGUA_ERROR(kInvalidArgument,
                       "optimizer state: %llu parameters with %u states saved, this optimizer "
                       "has %zu with %d",
                       static_cast<unsigned long long>(nslots), nstates, slots_.size(),
                       numStates());
  }
  // Validate everything before changing anything.
  struct Pending {
    int64_t step;
    std::vector<const uint8_t*> states;
    const uint8_t* master;
  };
  std::vector<Pending> pending;
  for (const auto& s : slots_) {
    std::string name;
    uint64_t numel = 0;
    uint32_t storage = 0, mask = 0;
    int64_t step = 0;
    uint8_t hasMaster = 0;
    BAGUA_RETURN_IF_ERROR(r.string(&name, "name"));
    BAGUA_RETURN_IF_ERROR(r.get(&numel, "numel"));
    BAGUA_RETURN_IF_ERROR(r.get(&storage, "dtype"));
    BAGUA_RETURN_IF_ERROR(r.get(&step, "step"));
    BAGUA_RETURN_IF_ERROR(r.get(&mask, "mask"));
    BAGUA_RETURN_IF_ERROR(r.get(&hasMaster, "master flag"));
    const std::string& want = params_[s->param].name;
    unsigned haveMask = 0;
    for (int k = 0; k < numStates(); ++k) {
      haveMask |= s->state[k] != nullptr ? (1u << k) : 0u;
    }
    if (name != want || numel != s->numel || storage != static_cast<uint32_t>(s->storage) ||
        mask != haveMask || (hasMaster != 0) != (s->master != nullptr) || step < 0) {
      return BAGUA_ERROR(kInvalidArgument,
                         "optimizer state: entry '%s' (%llu elements, dtype %u, states 0x%x) "
                         "does not match parameter '%s' (%zu elements, dtype %d, states 0x%x)",
                         name.c_str(), static_cast<unsigned long long>(numel), storage, mask,
                         want.c_str(), s->numel, static_cast<int>(s->storage), haveMask);
    }
    Pending p{step, std::vector<const uint8_t*>(kMaxStates, nullptr), nullptr};
    const size_t ses = detail::stateElemSize(s->storage);
    for (int k = 0; k < numStates(); ++k) {
      if (s->state[k] != nullptr) {
        p.states[k] = r.here();
        BAGUA_RETURN_IF_ERROR(r.skip(s->numel * ses, "state"));
      }
    }
    if (s->master != nullptr) {
      p.master = r.here();
      BAGUA_RETURN_IF_ERROR(r.skip(s->numel * 4, "master weights"));
    }
    pending.push_back(std::move(p));
  }
  if (!r.atEnd()) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: trailing bytes");
  }
  dropPlan();  // the step counts change: runs are split by them
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    s.step = pending[i].step;
    const size_t ses = detail::stateElemSize(s.storage);
    for (int k = 0; k < numStates(); ++k) {
      if (s.state[k] != nullptr) {
        BAGUA_RETURN_IF_ERROR(
            detail::fromHost(s.device, s.state[k], pending[i].states[k], s.numel * ses));
      }
    }
    if (s.master != nullptr) {
      BAGUA_RETURN_IF_ERROR(detail::fromHost(s.device, s.master, pending[i].master, s.numel * 4));
    }
  }
  return Status::ok();
}

}  // namespace bagua::optim
