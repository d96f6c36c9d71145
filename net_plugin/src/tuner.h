// The tuner's policy: which protocols and how many channels NCCL should use for a collective when
// its traffic goes over Bagua-Net. Version-neutral; abi_tuner.cc adapts it to NCCL's tuner ABI.
//
// Why: NCCL's cost model sees a fast port (400 Gbps reported for loopback and virtual NICs) and
// prices it like an RDMA NIC, so it picks the LL protocol on 4 channels up to 1 MiB. Over TCP,
// LL's 8-byte flag lines double the bytes and cut each step into many small messages, so a
// 1 MiB all-reduce over loopback takes about 2.6x as long with NCCL's choice as with Simple on
// fewer channels (bench/RESULTS.md, "Latency and the tuner"), while 64 MiB and above need all 4
// channels. So: LL only up to BAGUA_NET_TUNER_LL_MAX, and at most
// max(MIN_CHANNELS, ceil(bytes / CHANNEL_BYTES)) channels.
//
// Thread model: a Policy is built in init and then only read (getCollInfo may run on any of
// NCCL's threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bagua/base/params.h"
#include "bagua/base/status.h"

namespace bagua::net::tuner {

// The tuner's knobs (its own catalogue: the engine does not read them).
struct TunerParams : ParamCatalogue {
  TunerParams() : ParamCatalogue("net-tuner", "Bagua-Net's NCCL tuner (NCCL_TUNER_PLUGIN)") {}

  EnumParam tuner{*this,
                  "BAGUA_NET_TUNER",
                  "auto",
                  {{"auto",
                    "on when the communicator spans nodes, or NCCL_P2P_DISABLE and "
                    "NCCL_SHM_DISABLE both force GPUs of one host onto the network"},
                   {"on", "always"},
                   {"off", "never: NCCL's own model decides"}},
                  "The tuner exported from the same library (NCCL loads it when "
                  "NCCL_TUNER_PLUGIN is unset). NCCL's cost model prices a 400 Gbps port as an "
                  "RDMA NIC and picks LL up to 1 MiB; over TCP LL's flag lines cost 2.3x Simple "
                  "at 1 MiB. The tuner keeps LL to small messages and caps channels for "
                  "mid-sized ones."};
  BytesParam tunerLlMax{*this,
                        "BAGUA_NET_TUNER_LL_MAX",
                        128 * 1024,
                        {0, uint64_t{1} << 30},
                        "Largest collective (bytes) for which the tuner lets NCCL "
                        "choose the LL protocol."};
  BytesParam tunerChannelBytes{*this,
                               "BAGUA_NET_TUNER_CHANNEL_BYTES",
                               2 << 20,
                               {0, uint64_t{1} << 40},
                               "The tuner gives a collective at most max(MIN_CHANNELS, "
                               "ceil(bytes / this)) channels (fewer, larger messages per TCP "
                               "connection for mid sizes); 0 leaves the channel count to NCCL."};
  IntParam tunerMinChannels{
      *this, "BAGUA_NET_TUNER_MIN_CHANNELS", 2, {1, 64}, "Fewest channels the tuner's cap allows."};
  StringParam ncclP2pDisable{*this, "NCCL_P2P_DISABLE", "",
                             "NCCL's own variable, read (never changed) by the tuner's auto "
                             "mode: non-zero means GPUs of one host do not use P2P.",
                             "an integer, as NCCL reads it"};
  StringParam ncclShmDisable{*this, "NCCL_SHM_DISABLE", "",
                             "NCCL's own variable, read (never changed) by the tuner's auto "
                             "mode: non-zero means GPUs of one host do not use shared memory.",
                             "an integer, as NCCL reads it"};
};
TunerParams& tunerParams();

enum class Mode { kAuto, kOn, kOff };

struct TunerConfig {
  Mode mode = Mode::kAuto;
  uint64_t llMaxBytes = 128 * 1024;
  uint64_t channelBytes = 2 << 20;  // 0: no channel cap
  int minChannels = 2;
  bool p2pDisabled = false;  // NCCL_P2P_DISABLE, as NCCL reads it
  bool shmDisabled = false;  // NCCL_SHM_DISABLE

  // From tunerParams() (BAGUA_NET_TUNER*, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE).
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
