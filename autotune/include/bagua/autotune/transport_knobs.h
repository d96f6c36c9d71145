// Ready-made transport knobs for AutotuneOptions::knobs, applied live at the switch iteration on
// every rank, and the helper that reaches the Bagua-Net NCCL plugin loaded in this process.
//
//   "host_segment_bytes" (log scale)  host backend: BAGUA_HOST_SEGMENT_BYTES through
//                                     core::setHostTuning (a checked collective)
//   "net_streams"                     active data streams per connection: the host backend's
//                                     engine transport (core::setHostTuning), or Bagua-Net as the
//                                     NCCL net plugin (baguaNetSetLive_v1)
//   "net_chunk_bytes" (log scale)     the engine's chunk size (min = max chunk), same two routes
//
// They act on state shared in the process, so each knob names its resource (Knob::resource):
// the host route the group's communicators (hostGroupResource: this ProcessGroup object), the
// NCCL route the plugin's process-wide settings, per rank of the process (netPluginResource). Of
// several tuners in one process that are given the same resource, the first live one tunes it
// and the others drop it (KnobOwners, Autotuner::create). Build the knobs right before create():
// `initial` is what is in force then (possibly what an earlier owner left).
//
// Each factory returns std::nullopt, with an INFO line saying why, when the run does not use that
// transport (e.g. the host backend over shared memory, or NCCL without Bagua-Net), so a training
// script can ask for all of them and get those that apply.
//
// Thread safety: the knobs' apply functions run on the trainer's thread (Autotuner::
// onIterationEnd); the host ones issue a collective on the group's communicators, which is safe
// there because every rank applies the same value at the same iteration, between the reducer's
// collectives (core/include/bagua/core/host_tuning.h states the contract). NetPluginLive may be
// used from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bagua/autotune/autotuner.h"
#include "bagua/base/status.h"
#include "bagua/core/process_group.h"
#include "bagua/net/live_abi.h"

namespace bagua::autotune {

// The live settings entry of a Bagua-Net NCCL plugin that NCCL has ALREADY loaded into this
// process (found with dl_iterate_phdr for a module path containing "libnccl-net", then
// dlopen(RTLD_NOLOAD) + dlsym; it never loads a plugin itself: that would be a second copy of
// the engine, not the one NCCL uses). Values as net::LiveSettings (0: not set).
class NetPluginLive {
 public:
  struct Values {
    int activeStreams = 0;
    uint64_t minChunkBytes = 0;
    uint64_t maxChunkBytes = 0;
  };
  // NotFound, with the reason, when no libnccl-net module is loaded or the loaded one is not
  // Bagua-Net (no baguaNetSetLive_v1).
  static Result<std::unique_ptr<NetPluginLive>> find();
  ~NetPluginLive();
  NetPluginLive(const NetPluginLive&) = delete;
  NetPluginLive& operator=(const NetPluginLive&) = delete;

  const std::string& path() const { return path_; }
  // The plugin's process-wide settings; InvalidArgument for values it refuses.
  [[nodiscard]] Status set(const Values& values);
  Result<Values> get() const;

 private:
  NetPluginLive() = default;
  std::string path_;
  void* handle_ = nullptr;
  baguaNetSetLive_v1_t set_ = nullptr;
  baguaNetGetLive_v1_t get_ = nullptr;
};

struct TransportKnobRanges {
  uint64_t minSegmentBytes = 16 << 10;
  uint64_t maxSegmentBytes = 4 << 20;
  uint64_t minChunkBytes = 16 << 10;
  uint64_t maxChunkBytes = 4 << 20;
  int maxPluginStreams = 8;  // NCCL route: the plugin's stream count is not visible from here
};

// "host-group@<address of the ProcessGroup>/<knob>": unique per group object while it lives (a
// tuner cannot outlive the group its reducer runs on).
std::string hostGroupResource(const core::ProcessGroup& group, const std::string& knob);
// "bagua-net-plugin/rank<rank>/<knob>": the loaded plugin's settings as seen by one rank (ranks as
// threads of one test process each own their rank's; two tuners of one rank conflict).
std::string netPluginResource(int rank, const std::string& knob);

std::optional<Knob> hostSegmentKnob(core::ProcessGroup& group, const TransportKnobRanges& r = {});
std::optional<Knob> netStreamsKnob(core::ProcessGroup& group, const TransportKnobRanges& r = {});
std::optional<Knob> netChunkKnob(core::ProcessGroup& group, const TransportKnobRanges& r = {});
// Every one of the three that applies to this run.
std::vector<Knob> transportKnobs(core::ProcessGroup& group, const TransportKnobRanges& r = {});

}  // namespace bagua::autotune
