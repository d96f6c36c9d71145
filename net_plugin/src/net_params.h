// Typed access to the engine's parameter catalogue (netParams()).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/params.h"

namespace bagua::net {

struct NetParams {
  Param<int64_t>& nStreams;
  Param<uint64_t>& minChunk;
  Param<uint64_t>& maxChunk;
  Param<uint64_t>& inlineBytes;
  Param<uint64_t>& socketBuffer;
  Param<int64_t>& timeoutMs;
  Param<int64_t>& spinUs;
  Param<int64_t>& helloTimeoutMs;
  Param<int64_t>& speedMbps;
  Param<std::string>& schedule;
  Param<std::string>& ifname;
  Param<std::string>& family;
  Param<uint64_t>& slowStreamRate;
  // The tuner (tuner.h).
  Param<std::string>& tuner;
  Param<uint64_t>& tunerLlMax;
  Param<uint64_t>& tunerChannelBytes;
  Param<int64_t>& tunerMinChannels;
  Param<std::string>& ncclP2pDisable;
  Param<std::string>& ncclShmDisable;
};

// The catalogue's parameters by name (built on first call together with netParams()).
NetParams& netParamRefs();

}  // namespace bagua::net
