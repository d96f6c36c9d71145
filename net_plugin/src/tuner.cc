#include "tuner.h"

#include <algorithm>
#include <cstdlib>

#include "bagua/base/logging.h"
#include "nccl_tuner_abi.h"

namespace bagua::net::tuner {

namespace {

// NCCL reads its integer variables with strtoll: any non-zero number means "set".
bool ncclFlag(const std::string& v) {
  return !v.empty() && std::strtoll(v.c_str(), nullptr, 0) != 0;
}

bool isCollective(int collType) {
  return collType >= ncclFuncBroadcast && collType <= ncclFuncAllReduce;
}

}  // namespace

TunerParams& tunerParams() {
  static TunerParams params;
  return params;
}

Result<TunerConfig> TunerConfig::fromParams() {
  TunerParams& p = tunerParams();
  TunerConfig c;
  BAGUA_ASSIGN_OR_RETURN(std::string mode, p.tuner.get());
  c.mode = mode == "on" ? Mode::kOn : mode == "off" ? Mode::kOff : Mode::kAuto;
  BAGUA_ASSIGN_OR_RETURN(c.llMaxBytes, p.tunerLlMax.get());
  BAGUA_ASSIGN_OR_RETURN(c.channelBytes, p.tunerChannelBytes.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t minChannels, p.tunerMinChannels.get());
  c.minChannels = static_cast<int>(minChannels);
  BAGUA_ASSIGN_OR_RETURN(std::string p2p, p.ncclP2pDisable.get());
  BAGUA_ASSIGN_OR_RETURN(std::string shm, p.ncclShmDisable.get());
  c.p2pDisabled = ncclFlag(p2p);
  c.shmDisabled = ncclFlag(shm);
  return c;
}

Policy::Policy(const TunerConfig& config, size_t nRanks, size_t nNodes) : config_(config) {
  const char* why = "";
  if (nRanks < 2) {
    why = "one rank";
  } else if (config.mode == Mode::kOff) {
    why = "BAGUA_NET_TUNER=off";
  } else if (config.mode == Mode::kOn) {
    active_ = true;
    why = "BAGUA_NET_TUNER=on";
  } else if (nNodes > 1) {
    active_ = true;
    why = "the communicator spans nodes";
  } else if (config.p2pDisabled && config.shmDisabled) {
    active_ = true;
    why = "NCCL_P2P_DISABLE and NCCL_SHM_DISABLE send this node's traffic over the network";
  } else {
    why = "one node with P2P or SHM: the network is not on the data path";
  }
  if (active_) {
    summary_ = strPrintf(
        "active for %zu ranks on %zu nodes (%s): LL up to %llu bytes, channels capped at "
        "max(%d, bytes/%llu)",
        nRanks, nNodes, why, static_cast<unsigned long long>(config.llMaxBytes), config.minChannels,
        static_cast<unsigned long long>(config.channelBytes));
  } else {
    summary_ = strPrintf("inactive for %zu ranks on %zu nodes (%s): NCCL's own choices stand",
                         nRanks, nNodes, why);
  }
}

int Policy::apply(int collType, size_t nBytes, float* table, int numAlgo, int numProto) const {
  if (!active_ || !isCollective(collType) || table == nullptr || numProto <= NCCL_PROTO_SIMPLE) {
    return 0;
  }
  // Small collectives keep NCCL's choices (LL and its channel count, which may be below ours).
  if (nBytes <= config_.llMaxBytes) {
    return 0;
  }
  // LL off where it loses over TCP, unless it is all the user allowed (NCCL_PROTO=LL).
  bool otherUsable = false;
  for (int a = 0; a < numAlgo; ++a) {
    for (int p = 0; p < numProto; ++p) {
      otherUsable = otherUsable || (p != NCCL_PROTO_LL && table[a * numProto + p] >= 0.0f);
    }
  }
  if (otherUsable) {
    for (int a = 0; a < numAlgo; ++a) {
      table[a * numProto + NCCL_PROTO_LL] = NCCL_ALGO_PROTO_IGNORE;
    }
  }
  if (config_.channelBytes == 0) {
    return 0;
  }
  uint64_t want = (static_cast<uint64_t>(nBytes) + config_.channelBytes - 1) / config_.channelBytes;
  if (want >= 64) {
    return 0;  // beyond any channel count NCCL builds: its own choice
  }
  return std::max(config_.minChannels, static_cast<int>(want));
}

}  // namespace bagua::net::tuner
