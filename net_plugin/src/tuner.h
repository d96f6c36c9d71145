// The tuner's policy: which protocols and how many channels NCCL should use for a collective when
// its traffic goes over Bagua-Net. Version-neutral; abi_tuner.cc adapts it to NCCL's tuner ABI.
//
// Why: NCCL's cost model sees a fast port (400 Gbps reported for loopback and virtual NICs) and
// prices it like an RDMA NIC, so it picks the LL protocol on 4 channels up to 1 MiB. Over TCP,
// LL's 8-byte flag lines double the bytes and cut each step into many small messages: on
// 2 x H200 over loopback (NCCL 2.28.9) a 1 MiB all-reduce took 766 us with LL on 4 channels,
// 327 us with Simple on 4 and 228 us with Simple on 2, while 64 MiB and above need all 4
// channels. So: LL only up to BAGUA_NET_TUNER_LL_MAX, and at most
// max(MIN_CHANNELS, ceil(bytes / CHANNEL_BYTES)) channels.
//
// Thread model: a Policy is built in init and then only read (getCollInfo may run on any of
// NCCL's threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bagua/base/status.h"

namespace bagua::net::tuner {

enum class Mode { kAuto, kOn, kOff };

struct TunerConfig {
  Mode mode = Mode::kAuto;
  uint64_t llMaxBytes = 128 * 1024;
  uint64_t channelBytes = 2 << 20;  // 0: no channel cap
  int minChannels = 2;
  bool p2pDisabled = false;  // NCCL_P2P_DISABLE, as NCCL reads it
  bool shmDisabled = false;  // NCCL_SHM_DISABLE

  // From the net catalogue (BAGUA_NET_TUNER*, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE).
  static Result<TunerConfig> fromParams();
};

class Policy {
 public:
  Policy(const TunerConfig& config, size_t nRanks, size_t nNodes);

  bool active() const { return active_; }
  // One line for the log: active or not, and why.
  const std::string& summary() const { return summary_; }

  // Adjusts NCCL's cost table (row-major [numAlgo][numProto], microseconds, negative entries
  // ignored) in place and returns a channel cap (0: leave it to NCCL). Never removes the last
  // usable entry, so a user's NCCL_PROTO=LL still holds.
  int apply(int collType, size_t nBytes, float* table, int numAlgo, int numProto) const;

 private:
  TunerConfig config_;
  bool active_ = false;
  std::string summary_;
};

}  // namespace bagua::net::tuner
