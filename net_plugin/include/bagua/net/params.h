// The Bagua-Net engine's knobs (BAGUA_NET_*, NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY) and its log
// category. `bagua-params` dumps them; EngineOptions::fromParams() reads them. The tuner's knobs
// live with the tuner (net_plugin/src/tuner.h).
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"

namespace bagua::net {

// Data streams per connection are clamped to [1, kMaxStreams].
inline constexpr int kMaxStreams = 64;

// NCCL_SOCKET_FAMILY's syntax: empty, AF_INET or AF_INET6.
Status validateAddressFamily(const std::string& value);

struct NetParams : ParamCatalogue {
  NetParams() : ParamCatalogue("net", "Bagua-Net TCP engine and NCCL net plugin") {}

  IntParam nStreams{*this,
                    "BAGUA_NET_NSTREAMS",
                    8,
                    {1, kMaxStreams},
                    "Data TCP streams per connection (Bagua-Net's knob). Each stream has "
                    "its own helper thread on each side; chunks of a message are "
                    "scheduled dynamically over them."};
  EnumParam chunkPolicy{
      *this,
      "BAGUA_NET_CHUNK_POLICY",
      "adaptive",
      {{"adaptive",
        "each message's chunk size and the streams it wakes chosen when it is posted, from the "
        "comm's measured wake-up time and stream rates and the bytes queued before it"},
       {"fixed", "the static rule: ceil(size/streams) clamped to [MIN_CHUNKSIZE, MAX_CHUNKSIZE]"}},
      "How messages are cut into chunks. Adaptive takes the bytes a stream moves in one helper-"
      "thread wake-up as the smallest chunk, between 64 KiB and MIN_CHUNKSIZE: on a host with "
      "idle cores a lone mid-sized message spreads over many streams at once, on a busy one it "
      "keeps MIN_CHUNKSIZE, as does a message queued behind unclaimed bytes; a lone one-chunk "
      "message up to 256 KiB that costs less to copy than a wake-up is written by the caller "
      "itself. Setting MIN_CHUNKSIZE or LONE_CHUNKSIZE by hand selects fixed unless this is set "
      "too; fixed is for comparisons and for hosts where the measurements mislead."};
  BytesParam minChunk{*this,
                      "BAGUA_NET_MIN_CHUNKSIZE",
                      256 * 1024,
                      {4096, uint64_t{1} << 30},
                      "Smallest chunk a message is cut into on the data streams (Bagua-Net's "
                      "knob). Fixed policy: a message is split into ceil(size/nstreams) chunks "
                      "clamped to [MIN_CHUNKSIZE, MAX_CHUNKSIZE]. Adaptive: the largest floor "
                      "(a busy host's, a queued message's, and every message's until the comm "
                      "has measured its streams). Set it by hand to pin one floor for every "
                      "message (e.g. 64K where one message must spread over many capped flows)."};
  BytesParam loneChunk{*this,
                       "BAGUA_NET_LONE_CHUNKSIZE",
                       0,
                       {0, uint64_t{1} << 30},
                       "Fixed policy: smallest chunk of a message posted with nothing queued "
                       "before it, if below MIN_CHUNKSIZE; 0: off. Setting it selects the fixed "
                       "policy (unless BAGUA_NET_CHUNK_POLICY is set): a pinned pair of floors, "
                       "one for lone messages and one for queued ones."};
  BytesParam maxChunk{*this,
                      "BAGUA_NET_MAX_CHUNKSIZE",
                      1024 * 1024,
                      {4096, uint64_t{1} << 30},
                      "Largest chunk: big messages are cut into many chunks of at most "
                      "this size so that fast streams take more of them."};
  BytesParam inlineBytes{*this,
                         "BAGUA_NET_INLINE_BYTES",
                         64 * 1024,
                         {0, 4 * 1024 * 1024},
                         "Messages up to this size travel inline on the control stream, "
                         "written by the caller's isend and read by the receiver's test() "
                         "(no helper-thread wake-up: ~12 us round trip at 2 KiB against "
                         "~0.6 ms through a data stream on a 32-core host). Set the same "
                         "value on every rank (a receiver refuses larger inline payloads). "
                         "An inline message takes one TCP flow, not the data streams: raise "
                         "it only where CPU, not the link, is the limit (several ranks on "
                         "one host)."};
  BytesParam socketBuffer{*this,
                          "BAGUA_NET_SOCKET_BUFFER",
                          4 << 20,
                          {0, uint64_t{1} << 30},
                          "SO_SNDBUF/SO_RCVBUF of every data and control socket; 0 keeps the "
                          "kernel's default (and its auto-tuning)."};
  BytesParam notSentLowat{*this,
                          "BAGUA_NET_NOTSENT_LOWAT",
                          0,
                          {0, uint64_t{1} << 30},
                          "TCP_NOTSENT_LOWAT of every stream: a data thread's send returns only "
                          "when at most this much of its stream is still unsent, so a slow "
                          "stream claims its next chunk late and the dynamic schedule sees real "
                          "progress instead of a full socket buffer. 0: the kernel's default "
                          "(unbounded), except on connections over several interfaces "
                          "(BAGUA_NET_DEVICES=fused), whose senders use 256 KiB (links of R "
                          "and R/4: 1.15 R against 0.69 R unbounded)."};
  IntParam timeoutMs{*this,
                     "BAGUA_NET_TIMEOUT_MS",
                     30000,
                     {100, 3600 * 1000},
                     "Dead-peer bound: TCP_USER_TIMEOUT and keepalive are set so that a "
                     "peer that vanished without closing fails requests within about this "
                     "time. A peer that closes or resets fails them at once."};
  IntParam spinUs{*this,
                  "BAGUA_NET_SPIN_US",
                  0,
                  {0, 100000},
                  "Helper threads spin this long looking for work before parking on a "
                  "condition variable. Default 0: in the NCCL all-reduce on a 32-core "
                  "host spinning cost 10-15% bandwidth (it steals CPU from NCCL's "
                  "proxy threads and the kernel's TCP work)."};
  IntParam helloTimeoutMs{*this,
                          "BAGUA_NET_HELLO_TIMEOUT_MS",
                          10000,
                          {10, 600 * 1000},
                          "An accepted socket that does not send a complete hello within this "
                          "time is dropped."};
  IntParam speedMbps{*this,
                     "BAGUA_NET_SPEED_MBPS",
                     0,
                     {0, 10 * 1000 * 1000},
                     "Port speed reported to NCCL (Mbps); 0 = read "
                     "/sys/class/net/<if>/speed, else (lo, virtual NICs) 400000. NCCL "
                     "sizes its channel count from it: on loopback 400 Gbps gives 4 "
                     "channels and +60% all-reduce bandwidth over 100 Gbps (2 channels)."};
  EnumParam devices{*this,
                    "BAGUA_NET_DEVICES",
                    "per-interface",
                    {{"per-interface",
                      "one NCCL device per interface NCCL_SOCKET_IFNAME selects; NCCL places "
                      "its channels on them, as with its Socket transport"},
                     {"fused",
                      "one device spanning every selected interface (at most 9; IPv4 after "
                      "the first): each connection spreads its data streams over all of "
                      "them and the dynamic schedule gives a faster link more chunks"}},
                    "How the plugin presents several interfaces to NCCL. NCCL can also fuse "
                    "per-interface devices itself (makeVDevice, NCCL_NET_MERGE_LEVEL)."};
  StringParam ifname{*this, "NCCL_SOCKET_IFNAME", "",
                     "Interfaces to use, NCCL's syntax: comma-separated prefixes, "
                     "'^' to exclude, '=' for exact names (e.g. 'eth', '^docker,lo', "
                     "'=lo'). Empty: every interface except lo/docker/virbr, else "
                     "docker, else lo.",
                     "NCCL_SOCKET_IFNAME syntax"};
  StringParam family{*this,
                     "NCCL_SOCKET_FAMILY",
                     "",
                     "Address family to use: AF_INET or AF_INET6; empty for both "
                     "(IPv4 preferred).",
                     "empty, AF_INET or AF_INET6",
                     validateAddressFamily};
  BytesParam slowStreamRate{*this,
                            "BAGUA_NET_SLOW_STREAM_RATE",
                            0,
                            {0, uint64_t{1} << 40},
                            "Fault injection for benchmarks: pace data stream 0 of every "
                            "send comm to this many bytes/s (SO_MAX_PACING_RATE), one slow "
                            "flow among fast ones. 0 (default): off."};
  IntParam sendRateMbps{*this,
                        "BAGUA_NET_SEND_RATE_MBPS",
                        0,
                        {0, 10 * 1000 * 1000},
                        "Link emulation for benchmarks: every send comm of this process "
                        "together sends at most this many Mbit/s of payload (one pacing "
                        "clock per process, i.e. per rank: a slow NIC). 0 (default): off."};
};
NetParams& netParams();

// The engine's and the plugin's log category (BAGUA_LOG_SUBSYS name "net").
inline const LogCategory kLogNet{"net"};

}  // namespace bagua::net
