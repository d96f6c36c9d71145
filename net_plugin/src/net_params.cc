#include "net_params.h"

#include <sys/socket.h>

#include "bagua/net/engine.h"

namespace bagua::net {

namespace {

struct Holder {
  ParamCatalogue catalogue{"net", "Bagua-Net TCP engine and NCCL net plugin"};
  NetParams refs;

  Holder()
      : refs{
            catalogue.addInt("BAGUA_NET_NSTREAMS", 8, 1, kMaxStreams,
                             "Data TCP streams per connection (Bagua-Net's knob). Each stream has "
                             "its own helper thread on each side; chunks of a message are "
                             "scheduled dynamically over them."),
            catalogue.addBytes("BAGUA_NET_MIN_CHUNKSIZE", 64 * 1024, 4096, uint64_t{1} << 30,
                               "Smallest chunk a message is cut into on the data streams "
                               "(Bagua-Net's knob). A message is split into ceil(size/nstreams) "
                               "chunks, clamped to [MIN_CHUNKSIZE, MAX_CHUNKSIZE]. Messages "
                               "that leave streams idle showed 2-3x longer round trips on "
                               "loopback, hence a small default."),
            catalogue.addBytes("BAGUA_NET_MAX_CHUNKSIZE", 1024 * 1024, 4096, uint64_t{1} << 30,
                               "Largest chunk: big messages are cut into many chunks of at most "
                               "this size so that fast streams take more of them."),
            catalogue.addBytes("BAGUA_NET_INLINE_BYTES", 64 * 1024, 0, 64 * 1024,
                               "Messages up to this size travel inline on the control stream, "
                               "written by the caller's isend and read by the receiver's test() "
                               "(no helper-thread wake-up: ~12 us round trip at 2 KiB against "
                               "~0.6 ms through a data stream on a 32-core host)."),
            catalogue.addBytes("BAGUA_NET_SOCKET_BUFFER", 4 << 20, 0, uint64_t{1} << 30,
                               "SO_SNDBUF/SO_RCVBUF of every data and control socket; 0 keeps the "
                               "kernel's default (and its auto-tuning)."),
            catalogue.addInt("BAGUA_NET_TIMEOUT_MS", 30000, 100, 3600 * 1000,
                             "Dead-peer bound: TCP_USER_TIMEOUT and keepalive are set so that a "
                             "peer that vanished without closing fails requests within about this "
                             "time. A peer that closes or resets fails them at once."),
            catalogue.addInt("BAGUA_NET_SPIN_US", 0, 0, 100000,
                             "Helper threads spin this long looking for work before parking on a "
                             "condition variable. Default 0: in the NCCL all-reduce on a 32-core "
                             "host spinning cost 10-15% bandwidth (it steals CPU from NCCL's "
                             "proxy threads and the kernel's TCP work)."),
            catalogue.addInt("BAGUA_NET_HELLO_TIMEOUT_MS", 10000, 10, 600 * 1000,
                             "An accepted socket that does not send a complete hello within this "
                             "time is dropped."),
            catalogue.addInt("BAGUA_NET_SPEED_MBPS", 0, 0, 10 * 1000 * 1000,
                             "Port speed reported to NCCL (Mbps); 0 = read "
                             "/sys/class/net/<if>/speed, else (lo, virtual NICs) 400000. NCCL "
                             "sizes its channel count from it: on loopback 400 Gbps gives 4 "
                             "channels and +60% all-reduce bandwidth over 100 Gbps (2 channels)."),
            catalogue.addEnum("BAGUA_NET_SCHEDULE", "dynamic",
                              {{"dynamic", "the next chunk goes to whichever stream has room"},
                               {"roundrobin",
                                "chunk k to stream k mod N with an equal split (what NCCL Socket "
                                "and the original Bagua-Net do); for comparison"}},
                              "How chunks are spread over the data streams."),
            catalogue.addString("NCCL_SOCKET_IFNAME", "",
                                "Interfaces to use, NCCL's syntax: comma-separated prefixes, "
                                "'^' to exclude, '=' for exact names (e.g. 'eth', '^docker,lo', "
                                "'=lo'). Empty: every interface except lo/docker/virbr, else "
                                "docker, else lo.",
                                "NCCL_SOCKET_IFNAME syntax"),
            catalogue.addString("NCCL_SOCKET_FAMILY", "",
                                "Address family to use: AF_INET or AF_INET6; empty for both "
                                "(IPv4 preferred).",
                                "empty, AF_INET or AF_INET6",
                                [](const std::string& v) -> Status {
                                  Result<int> f = parseAddressFamily(v);
                                  return f.isOk() ? Status::ok() : f.status();
                                }),
            catalogue.addBytes("BAGUA_NET_SLOW_STREAM_RATE", 0, 0, uint64_t{1} << 40,
                               "Fault injection for benchmarks: pace data stream 0 of every "
                               "send comm to this many bytes/s (SO_MAX_PACING_RATE), one slow "
                               "flow among fast ones. 0 (default): off."),
            catalogue.addEnum(
                "BAGUA_NET_TUNER", "auto",
                {{"auto",
                  "on when the communicator spans nodes, or NCCL_P2P_DISABLE and "
                  "NCCL_SHM_DISABLE both force GPUs of one host onto the network"},
                 {"on", "always"},
                 {"off", "never: NCCL's own model decides"}},
                "The tuner exported from the same library (NCCL loads it when "
                "NCCL_TUNER_PLUGIN is unset). NCCL's cost model prices a 400 Gbps port as an "
                "RDMA NIC and picks LL up to 1 MiB; over TCP LL's flag lines cost 2.3x Simple "
                "at 1 MiB. The tuner keeps LL to small messages and caps channels for "
                "mid-sized ones."),
            catalogue.addBytes("BAGUA_NET_TUNER_LL_MAX", 128 * 1024, 0, uint64_t{1} << 30,
                               "Largest collective (bytes) for which the tuner lets NCCL "
                               "choose the LL protocol."),
            catalogue.addBytes("BAGUA_NET_TUNER_CHANNEL_BYTES", 2 << 20, 0, uint64_t{1} << 40,
                               "The tuner gives a collective at most max(MIN_CHANNELS, "
                               "ceil(bytes / this)) channels (fewer, larger messages per TCP "
                               "connection for mid sizes); 0 leaves the channel count to NCCL."),
            catalogue.addInt("BAGUA_NET_TUNER_MIN_CHANNELS", 2, 1, 64,
                             "Fewest channels the tuner's cap allows."),
            catalogue.addString("NCCL_P2P_DISABLE", "",
                                "NCCL's own variable, read (never changed) by the tuner's auto "
                                "mode: non-zero means GPUs of one host do not use P2P.",
                                "an integer, as NCCL reads it"),
            catalogue.addString("NCCL_SHM_DISABLE", "",
                                "NCCL's own variable, read (never changed) by the tuner's auto "
                                "mode: non-zero means GPUs of one host do not use shared memory.",
                                "an integer, as NCCL reads it"),
        } {}
};

Holder& holder() {
  static Holder h;
  return h;
}

}  // namespace

ParamCatalogue& netParams() {
  return holder().catalogue;
}

NetParams& netParamRefs() {
  return holder().refs;
}

Result<EngineOptions> EngineOptions::fromParams() {
  NetParams& p = netParamRefs();
  EngineOptions o;
  BAGUA_ASSIGN_OR_RETURN(int64_t streams, p.nStreams.get());
  o.nStreams = static_cast<int>(streams);
  BAGUA_ASSIGN_OR_RETURN(o.minChunkBytes, p.minChunk.get());
  BAGUA_ASSIGN_OR_RETURN(o.maxChunkBytes, p.maxChunk.get());
  BAGUA_ASSIGN_OR_RETURN(o.inlineBytes, p.inlineBytes.get());
  BAGUA_ASSIGN_OR_RETURN(o.socketBufferBytes, p.socketBuffer.get());
  BAGUA_ASSIGN_OR_RETURN(o.timeoutMs, p.timeoutMs.get());
  BAGUA_ASSIGN_OR_RETURN(o.spinUs, p.spinUs.get());
  BAGUA_ASSIGN_OR_RETURN(o.helloTimeoutMs, p.helloTimeoutMs.get());
  BAGUA_ASSIGN_OR_RETURN(std::string schedule, p.schedule.get());
  o.schedule = schedule == "roundrobin" ? Schedule::kRoundRobin : Schedule::kDynamic;
  BAGUA_ASSIGN_OR_RETURN(o.slowStreamBytesPerSec, p.slowStreamRate.get());
  BAGUA_RETURN_IF_ERROR(o.validate());
  return o;
}

Status EngineOptions::validate() const {
  if (nStreams < 1 || nStreams > kMaxStreams) {
    return BAGUA_ERROR(kInvalidArgument, "nStreams %d outside 1..%d", nStreams, kMaxStreams);
  }
  if (minChunkBytes < 1 || maxChunkBytes < minChunkBytes) {
    return BAGUA_ERROR(
        kInvalidArgument,
        "chunk sizes: min %llu must be >= 1 and <= max %llu (BAGUA_NET_MIN_CHUNKSIZE "
        "<= BAGUA_NET_MAX_CHUNKSIZE)",
        static_cast<unsigned long long>(minChunkBytes),
        static_cast<unsigned long long>(maxChunkBytes));
  }
  if (maxChunkBytes > (uint64_t{1} << 30)) {
    return BAGUA_ERROR(kInvalidArgument, "max chunk %llu above 1 GiB",
                       static_cast<unsigned long long>(maxChunkBytes));
  }
  if (inlineBytes > 64 * 1024) {
    return BAGUA_ERROR(kInvalidArgument, "inline limit %llu above 64 KiB",
                       static_cast<unsigned long long>(inlineBytes));
  }
  if (timeoutMs < 1 || helloTimeoutMs < 1 || spinUs < 0) {
    return BAGUA_ERROR(kInvalidArgument, "timeouts must be positive and spin non-negative");
  }
  return Status::ok();
}

}  // namespace bagua::net
