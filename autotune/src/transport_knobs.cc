#include "bagua/autotune/transport_knobs.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "bagua/autotune/params.h"
#include "bagua/base/logging.h"
#include "bagua/core/host_tuning.h"

namespace bagua::autotune {

namespace {

// The plugin's exports, named once in bagua/net/live_abi.h.
constexpr const char* kSetSymbol = BAGUA_NET_LIVE_SET_SYMBOL;
constexpr const char* kGetSymbol = BAGUA_NET_LIVE_GET_SYMBOL;
constexpr auto kApplyTimeout = std::chrono::milliseconds(300000);

int collectPlugins(dl_phdr_info* info, size_t /*size*/, void* data) {
  auto* paths = static_cast<std::vector<std::string>*>(data);
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libnccl-net") != nullptr) {
    paths->emplace_back(info->dlpi_name);
  }
  return 0;
}

// The host backend's state when the group runs on it with more than one rank, else why not.
Result<core::HostTuningState> hostState(core::ProcessGroup& group) {
  if (group.options().backend != core::Backend::kHost) {
    return BAGUA_ERROR(kNotFound, "the group does not use the host backend");
  }
  if (group.size() < 2) {
    return BAGUA_ERROR(kNotFound, "a group of one rank moves no data");
  }
  return core::hostTuning(group);
}

void skip(const char* knob, const std::string& why) {
  BAGUA_LOG_INFO(kLogTune, "autotune: knob %s not offered: %s", knob, why.c_str());
}

}  // namespace

// ---- NetPluginLive -----------------------------------------------------------------------------

Result<std::unique_ptr<NetPluginLive>> NetPluginLive::find() {
  std::vector<std::string> paths;
  dl_iterate_phdr(collectPlugins, &paths);
  if (paths.empty()) {
    return BAGUA_ERROR(kNotFound,
                       "Bagua-Net is not the loaded NCCL net plugin: no libnccl-net module is "
                       "loaded in this process (NCCL loads it at its first communicator; set "
                       "NCCL_NET_PLUGIN=bagua and put libnccl-net.so on LD_LIBRARY_PATH)");
  }
  std::string others;
  for (const std::string& p : paths) {
    void* h = dlopen(p.c_str(), RTLD_NOLOAD | RTLD_LAZY);
    if (h == nullptr) {
      continue;
    }
    void* set = dlsym(h, kSetSymbol);
    void* get = dlsym(h, kGetSymbol);
    if (set == nullptr || get == nullptr) {
      dlclose(h);
      others += (others.empty() ? "" : ", ") + p;
      continue;
    }
    std::unique_ptr<NetPluginLive> live(new NetPluginLive());
    live->path_ = p;
    live->handle_ = h;
    live->set_ = reinterpret_cast<baguaNetSetLive_v1_t>(set);
    live->get_ = reinterpret_cast<baguaNetGetLive_v1_t>(get);
    return live;
  }
  return BAGUA_ERROR(kNotFound,
                     "Bagua-Net is not the loaded NCCL net plugin: %s does not export %s (another "
                     "plugin or an older Bagua-Net)",
                     others.empty() ? paths.front().c_str() : others.c_str(), kSetSymbol);
}

NetPluginLive::~NetPluginLive() {
  if (handle_ != nullptr) {
    dlclose(handle_);  // drops the reference RTLD_NOLOAD took; NCCL keeps its own
  }
}

Status NetPluginLive::set(const Values& v) {
  const int rc = set_(v.activeStreams, v.minChunkBytes, v.maxChunkBytes);
  if (rc != BAGUA_NET_LIVE_OK) {
    return BAGUA_ERROR(kInvalidArgument,
                       "%s refused active streams %d, chunk %llu..%llu (ncclResult_t %d; ranges in "
                       "net_plugin/README.md)",
                       path_.c_str(), v.activeStreams,
                       static_cast<unsigned long long>(v.minChunkBytes),
                       static_cast<unsigned long long>(v.maxChunkBytes), rc);
  }
  return Status::ok();
}

Result<NetPluginLive::Values> NetPluginLive::get() const {
  Values v;
  const int rc = get_(&v.activeStreams, &v.minChunkBytes, &v.maxChunkBytes);
  if (rc != BAGUA_NET_LIVE_OK) {
    return BAGUA_ERROR(kInternal, "%s: %s failed (ncclResult_t %d)", path_.c_str(), kGetSymbol, rc);
  }
  return v;
}

// ---- knobs -------------------------------------------------------------------------------------

std::string hostGroupResource(const core::ProcessGroup& group, const std::string& knob) {
  return strPrintf("host-group@%p/%s", static_cast<const void*>(&group), knob.c_str());
}

std::string netPluginResource(int rank, const std::string& knob) {
  return strPrintf("bagua-net-plugin/rank%d/%s", rank, knob.c_str());
}

std::optional<Knob> hostSegmentKnob(core::ProcessGroup& group, const TransportKnobRanges& r) {
  Result<core::HostTuningState> st = hostState(group);
  if (!st.isOk()) {
    skip("host_segment_bytes", st.status().message());
    return std::nullopt;
  }
  Knob k;
  k.dimension = Dimension::logInteger("host_segment_bytes", static_cast<int64_t>(r.minSegmentBytes),
                                      static_cast<int64_t>(r.maxSegmentBytes));
  k.initial = std::clamp(static_cast<int64_t>(st->segmentBytes), k.dimension.lo, k.dimension.hi);
  k.apply = [&group](int64_t v) {
    core::HostTuning t;
    t.segmentBytes = static_cast<size_t>(v);
    return core::setHostTuning(group, t, kApplyTimeout);
  };
  k.resource = hostGroupResource(group, k.dimension.name);
  return k;
}

std::optional<Knob> netStreamsKnob(core::ProcessGroup& group, const TransportKnobRanges& r) {
  Result<core::HostTuningState> st = hostState(group);
  if (st.isOk()) {
    if (st->establishedStreams == 0) {
      skip("net_streams",
           "the host backend runs over the socket/shared-memory transport, not the "
           "engine (BAGUA_HOST_TRANSPORT=engine)");
      return std::nullopt;
    }
    Knob k;
    k.dimension = Dimension::integer("net_streams", 1, st->establishedStreams);
    k.initial = st->activeStreams;
    k.apply = [&group](int64_t v) {
      core::HostTuning t;
      t.engineStreams = static_cast<int>(v);
      return core::setHostTuning(group, t, kApplyTimeout);
    };
    k.resource = hostGroupResource(group, k.dimension.name);
    return k;
  }
  if (group.options().backend != core::Backend::kNccl) {
    skip("net_streams", st.status().message());
    return std::nullopt;
  }
  Result<std::unique_ptr<NetPluginLive>> live = NetPluginLive::find();
  if (!live.isOk()) {
    skip("net_streams", live.status().message());
    return std::nullopt;
  }
  std::shared_ptr<NetPluginLive> plugin(std::move(*live));
  Knob k;
  k.dimension = Dimension::integer("net_streams", 1, std::max(1, r.maxPluginStreams));
  k.initial = k.dimension.hi;
  k.apply = [plugin](int64_t v) -> Status {
    BAGUA_ASSIGN_OR_RETURN(NetPluginLive::Values cur, plugin->get());
    cur.activeStreams = static_cast<int>(v);
    return plugin->set(cur);
  };
  k.resource = netPluginResource(group.rank(), k.dimension.name);
  return k;
}

std::optional<Knob> netChunkKnob(core::ProcessGroup& group, const TransportKnobRanges& r) {
  const auto lo = static_cast<int64_t>(r.minChunkBytes);
  const auto hi = static_cast<int64_t>(r.maxChunkBytes);
  Result<core::HostTuningState> st = hostState(group);
  if (st.isOk()) {
    if (st->establishedStreams == 0) {
      skip("net_chunk_bytes",
           "the host backend runs over the socket/shared-memory transport, "
           "not the engine (BAGUA_HOST_TRANSPORT=engine)");
      return std::nullopt;
    }
    Knob k;
    k.dimension = Dimension::logInteger("net_chunk_bytes", lo, hi);
    // What is in force: the live chunk, else the engine's rule for a segment-sized piece.
    k.initial = static_cast<int64_t>(
        st->engineChunkBytes > 0
            ? st->engineChunkBytes
            : core::engineDefaultChunkBytes(*st, st->segmentBytes, st->activeStreams));
    k.initial = std::clamp(k.initial, lo, hi);
    k.apply = [&group](int64_t v) {
      core::HostTuning t;
      t.engineChunkBytes = static_cast<size_t>(v);
      return core::setHostTuning(group, t, kApplyTimeout);
    };
    k.resource = hostGroupResource(group, k.dimension.name);
    return k;
  }
  if (group.options().backend != core::Backend::kNccl) {
    skip("net_chunk_bytes", st.status().message());
    return std::nullopt;
  }
  Result<std::unique_ptr<NetPluginLive>> live = NetPluginLive::find();
  if (!live.isOk()) {
    skip("net_chunk_bytes", live.status().message());
    return std::nullopt;
  }
  std::shared_ptr<NetPluginLive> plugin(std::move(*live));
  Knob k;
  k.dimension = Dimension::logInteger("net_chunk_bytes", lo, hi);
  k.initial = std::clamp<int64_t>(1 << 20, lo, hi);  // BAGUA_NET_MAX_CHUNKSIZE's default
  k.apply = [plugin](int64_t v) -> Status {
    BAGUA_ASSIGN_OR_RETURN(NetPluginLive::Values cur, plugin->get());
    cur.minChunkBytes = static_cast<uint64_t>(v);
    cur.maxChunkBytes = static_cast<uint64_t>(v);
    return plugin->set(cur);
  };
  k.resource = netPluginResource(group.rank(), k.dimension.name);
  return k;
}

std::vector<Knob> transportKnobs(core::ProcessGroup& group, const TransportKnobRanges& r) {
  std::vector<Knob> out;
  for (auto* make : {&hostSegmentKnob, &netStreamsKnob, &netChunkKnob}) {
    if (std::optional<Knob> k = make(group, r)) {
      out.push_back(std::move(*k));
    }
  }
  return out;
}

}  // namespace bagua::autotune
