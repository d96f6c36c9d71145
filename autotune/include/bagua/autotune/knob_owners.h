// Which tuner owns each shared knob resource in this process.
//
// Most knobs act on state private to one reducer (its bucket layout, its algorithm's
// hierarchical mode). The transport knobs act on shared state: the host route on a process
// group's communicators, the NCCL route on the loaded Bagua-Net plugin's process-wide live
// settings. Two tuners that both tuned such a knob would overwrite each other's values and
// measure each other's settings. A knob therefore names the resource it acts on
// (Knob::resource; empty: private), and Autotuner::create claims those resources here: the
// first live tuner that claims a resource owns it until it is destroyed or stops tuning for good;
// a later tuner drops the knob (autotune/README.md, "Several reducers in one process").
//
// Thread safety: every member may be called from any thread; one mutex guards the map (held
// only for the map operation, never while calling out). Copy/move: not copyable (the process-wide
// instance is a function-local static; tests make their own).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bagua::autotune {

class KnobOwners {
 public:
  // The registry Autotuner uses.
  static KnobOwners& process();
  // A fresh owner id, unique in the process (never 0).
  static uint64_t newOwnerId();

  KnobOwners() = default;
  KnobOwners(const KnobOwners&) = delete;
  KnobOwners& operator=(const KnobOwners&) = delete;

  // Claims `resource` for `owner` (an id from newOwnerId()), whose `model` name is kept for
  // messages. Returns std::nullopt when `owner` holds it now (also when it already did), else the
  // model name of the owner that holds it (nothing is recorded then). An empty resource is a
  // private knob: always granted, never recorded.
  std::optional<std::string> claim(const std::string& resource, uint64_t owner,
                                   const std::string& model);
  // Releases every resource `owner` holds; returns them (sorted). Unknown owners: nothing.
  std::vector<std::string> releaseAll(uint64_t owner);
  // The model name of the resource's owner, if any.
  std::optional<std::string> holder(const std::string& resource) const;
  // Resources held, by anyone.
  size_t size() const;

 private:
  struct Holder {
    uint64_t owner = 0;
    std::string model;
  };
  mutable std::mutex mu_;
  std::map<std::string, Holder> held_;
};

}  // namespace bagua::autotune
