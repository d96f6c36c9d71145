// The core library's parameter catalogue: rendezvous (torchrun's variables), timeouts and the
// host backend's tuning knobs. Dump them with `bagua-params`.
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/base/secret_param.h"

namespace bagua::core {

// The core's knobs, each declared once (bagua/base/params.h): read them as
// coreParams().masterPort.get().
struct CoreParams : ParamCatalogue {
  CoreParams() : ParamCatalogue("core", "process groups, rendezvous, communicators, reducer") {}

  StringParam masterAddr{*this, "MASTER_ADDR", "127.0.0.1",
                         "env:// rendezvous: host of the TCP store (rank 0 hosts it)",
                         "a host name or IP address"};
  IntParam masterPort{
      *this, "MASTER_PORT", 29500, {1, 65535}, "env:// rendezvous: port of the TCP store"};
  IntParam rank{*this, "RANK", 0, {0, 1 << 20}, "env:// rendezvous: global rank of this process"};
  IntParam worldSize{
      *this, "WORLD_SIZE", 1, {1, 1 << 20}, "env:// rendezvous: number of processes in the job"};
  IntParam localRank{*this,
                     "LOCAL_RANK",
                     -1,
                     {-1, 1 << 20},
                     "rank within the node (-1: RANK modulo LOCAL_WORLD_SIZE)"};
  IntParam localWorldSize{*this,
                          "LOCAL_WORLD_SIZE",
                          -1,
                          {-1, 1 << 20},
                          "processes per node (-1: WORLD_SIZE, i.e. one node)"};
  SecretParam jobKey{
      *this, "BAGUA_JOB_KEY",
      "the job's secret: every TCP store request, host-backend connection set-up and heartbeat "
      "carries an HMAC-SHA256 under it, and a process without it is refused at its first frame. "
      "baguarun and python -m bagua.distributed.launch/run set a fresh one for a single-node job; "
      "for a job over several nodes started by other means, give every rank the same value (e.g. "
      "`openssl rand -hex 32`) or use BAGUA_JOB_KEY_FILE. Unset (and no key file): nothing is "
      "authenticated and rank 0 logs one warning",
      "empty, or at least 32 characters"};
  StringParam jobKeyFile{
      *this, "BAGUA_JOB_KEY_FILE", "",
      "a file holding the job's secret (its content, surrounding white space removed), instead of "
      "BAGUA_JOB_KEY: the same file on every node, readable by its owner only (chmod 600)",
      "a file path, or empty"};
  StringParam storeListenAddr{
      *this, "BAGUA_STORE_LISTEN_ADDR", "",
      "address rank 0's TCP store listens on; empty: MASTER_ADDR's, resolved to an address of "
      "this host (a host name that resolves to no address here fails naming it); 0.0.0.0 or :: "
      "listens on every interface, which lets any host that reaches the port try to connect",
      "an IP address, or empty"};
  IntParam rendezvousTimeoutMs{
      *this,
      "BAGUA_RENDEZVOUS_TIMEOUT_MS",
      60000,
      {100, 3600000},
      "how long rendezvous and connection set-up wait for the other ranks"};
  IntParam collectiveTimeoutMs{
      *this,
      "BAGUA_COLLECTIVE_TIMEOUT_MS",
      300000,
      {100, 86400000},
      "deadline of one communicator operation; past it the communicator fails"};
  IntParam peerTimeoutMs{
      *this,
      "BAGUA_PEER_TIMEOUT_MS",
      10000,
      {0, 3600000},
      "dead-peer bound: a host-backend peer on another host that sends no heartbeat for this "
      "long, or a TCP store server that acknowledges nothing for this long, is declared gone "
      "and the calls waiting on it fail naming its rank and host (heartbeat datagrams, "
      "TCP_USER_TIMEOUT and keepalive); 0 turns the heartbeat off and leaves TCP's defaults"};
  IntParam heartbeatIntervalMs{*this,
                               "BAGUA_HEARTBEAT_INTERVAL_MS",
                               1000,
                               {10, 600000},
                               "host backend: how often each rank sends a heartbeat datagram "
                               "to its peers on other hosts; at most BAGUA_PEER_TIMEOUT_MS / 3"};
  EnumParam hostAlgorithm{*this,
                          "BAGUA_HOST_ALGO",
                          "auto",
                          {{"auto", "tree below BAGUA_HOST_TREE_MAX_BYTES, ring above"},
                           {"ring", "always ring (bandwidth-optimal)"},
                           {"tree", "always recursive doubling / binomial tree (latency-optimal)"}},
                          "host backend: collective algorithm"};
  BytesParam hostTreeMaxBytes{*this,
                              "BAGUA_HOST_TREE_MAX_BYTES",
                              64 * 1024,
                              {0, uint64_t{1} << 40},
                              "host backend: largest message that uses the tree algorithms"};
  BytesParam hostSegmentBytes{*this,
                              "BAGUA_HOST_SEGMENT_BYTES",
                              256 * 1024,
                              {4096, uint64_t{1} << 30},
                              "host backend: pipeline segment; reduction of a segment overlaps the "
                              "transfer of the next"};
  IntParam hostReduceThreads{
      *this,
      "BAGUA_HOST_REDUCE_THREADS",
      0,
      {0, 256},
      "host backend: threads reducing one large segment (0: cores / ranks per host, 1 to 4)"};
  BytesParam hostSocketBuffer{*this,
                              "BAGUA_HOST_SOCKET_BUFFER",
                              4 << 20,
                              {0, uint64_t{1} << 30},
                              "host backend: SO_SNDBUF/SO_RCVBUF per connection (0: OS)"};
  StringParam hostListenAddr{*this, "BAGUA_HOST_LISTEN_ADDR", "",
                             "host backend: address to listen on and advertise (empty: "
                             "the address this process uses to reach the store)",
                             "an IPv4 address or empty"};
  BoolParam hostShm{*this, "BAGUA_HOST_SHM", true,
                    "host backend: ranks on the same host exchange data through "
                    "shared-memory rings instead of loopback TCP"};
  BytesParam hostShmRingBytes{
      *this,
      "BAGUA_HOST_SHM_RING_BYTES",
      1 << 20,
      {4096, uint64_t{1} << 30},
      "host backend: bytes of each shared-memory ring (one per ordered pair of "
      "local ranks, so n*(n-1) of them per host)"};
  EnumParam hostTransport{
      *this,
      "BAGUA_HOST_TRANSPORT",
      "auto",
      {{"auto",
        "shared memory when every rank of the group is on this host and BAGUA_HOST_SHM "
        "is on, else the Bagua-Net engine"},
       {"engine", "the Bagua-Net multi-stream TCP engine for every peer"}},
      "host backend: transport under the collectives; engine forces the engine between ranks of "
      "one host too"};
  EnumParam ncclStreamPriority{
      *this,
      "BAGUA_NCCL_STREAM_PRIORITY",
      "high",
      {{"high",
        "the device's highest stream priority: collectives' blocks are scheduled "
        "before pending compute blocks"},
       {"normal", "the default priority, as torch's ProcessGroupNCCL streams"}},
      "NCCL backend: priority of each communicator's stream"};
  IntParam hostNetStreams{*this,
                          "BAGUA_HOST_NET_STREAMS",
                          2,
                          {1, 64},
                          "host backend over the engine: data TCP streams per ordered pair "
                          "of ranks (each has a helper thread on both sides)"};
};
CoreParams& coreParams();

// The core's log categories (BAGUA_LOG_SUBSYS names): core (process groups, communicators,
// rendezvous) and bucket (the reducer's buckets).
inline const LogCategory kLogCore{"core"};
inline const LogCategory kLogBucket{"bucket"};

}  // namespace bagua::core
