#include "bagua/core/params.h"

namespace bagua::core {

namespace {

ParamCatalogue& rawCatalogue() {
  static ParamCatalogue catalogue("core", "process groups, rendezvous, communicators, reducer");
  return catalogue;
}

struct Entries {
  Param<std::string>* masterAddr;
  Param<int64_t>* masterPort;
  Param<int64_t>* rank;
  Param<int64_t>* worldSize;
  Param<int64_t>* localRank;
  Param<int64_t>* localWorldSize;
  Param<int64_t>* rendezvousTimeoutMs;
  Param<int64_t>* collectiveTimeoutMs;
  Param<std::string>* hostAlgorithm;
  Param<uint64_t>* hostTreeMaxBytes;
  Param<uint64_t>* hostSegmentBytes;
  Param<int64_t>* hostReduceThreads;
  Param<uint64_t>* hostSocketBuffer;
  Param<std::string>* hostListenAddr;
  Param<bool>* hostShm;
  Param<uint64_t>* hostShmRingBytes;
  Param<std::string>* hostTransport;
  Param<int64_t>* hostNetStreams;
};

Entries& entries() {
  static Entries e = [] {
    ParamCatalogue& c = rawCatalogue();
    Entries x{};
    x.masterAddr = &c.addString("MASTER_ADDR", "127.0.0.1",
                                "env:// rendezvous: host of the TCP store (rank 0 hosts it)",
                                "a host name or IP address");
    x.masterPort =
        &c.addInt("MASTER_PORT", 29500, 1, 65535, "env:// rendezvous: port of the TCP store");
    x.rank = &c.addInt("RANK", 0, 0, 1 << 20, "env:// rendezvous: global rank of this process");
    x.worldSize =
        &c.addInt("WORLD_SIZE", 1, 1, 1 << 20, "env:// rendezvous: number of processes in the job");
    x.localRank = &c.addInt("LOCAL_RANK", -1, -1, 1 << 20,
                            "rank within the node (-1: RANK modulo LOCAL_WORLD_SIZE)");
    x.localWorldSize = &c.addInt("LOCAL_WORLD_SIZE", -1, -1, 1 << 20,
                                 "processes per node (-1: WORLD_SIZE, i.e. one node)");
    x.rendezvousTimeoutMs =
        &c.addInt("BAGUA_RENDEZVOUS_TIMEOUT_MS", 60000, 100, 3600000,
                  "how long rendezvous and connection set-up wait for the other ranks");
    x.collectiveTimeoutMs =
        &c.addInt("BAGUA_COLLECTIVE_TIMEOUT_MS", 300000, 100, 86400000,
                  "deadline of one communicator operation; past it the communicator fails");
    x.hostAlgorithm =
        &c.addEnum("BAGUA_HOST_ALGO", "auto",
                   {{"auto", "tree below BAGUA_HOST_TREE_MAX_BYTES, ring above"},
                    {"ring", "always ring (bandwidth-optimal)"},
                    {"tree", "always recursive doubling / binomial tree (latency-optimal)"}},
                   "host backend: collective algorithm");
    x.hostTreeMaxBytes = &c.addBytes("BAGUA_HOST_TREE_MAX_BYTES", 64 * 1024, 0, uint64_t{1} << 40,
                                     "host backend: largest message that uses the tree algorithms");
    x.hostSegmentBytes =
        &c.addBytes("BAGUA_HOST_SEGMENT_BYTES", 256 * 1024, 4096, uint64_t{1} << 30,
                    "host backend: pipeline segment; reduction of a segment overlaps the "
                    "transfer of the next");
    x.hostReduceThreads = &c.addInt(
        "BAGUA_HOST_REDUCE_THREADS", 0, 0, 256,
        "host backend: threads reducing one large segment (0: cores / ranks per host, 1 to 4)");
    x.hostSocketBuffer = &c.addBytes("BAGUA_HOST_SOCKET_BUFFER", 4 << 20, 0, uint64_t{1} << 30,
                                     "host backend: SO_SNDBUF/SO_RCVBUF per connection (0: OS)");
    x.hostListenAddr = &c.addString("BAGUA_HOST_LISTEN_ADDR", "",
                                    "host backend: address to listen on and advertise (empty: "
                                    "the address this process uses to reach the store)",
                                    "an IPv4 address or empty");
    x.hostShm = &c.addBool("BAGUA_HOST_SHM", true,
                           "host backend: ranks on the same host exchange data through "
                           "shared-memory rings instead of loopback TCP");
    x.hostShmRingBytes =
        &c.addBytes("BAGUA_HOST_SHM_RING_BYTES", 1 << 20, 4096, uint64_t{1} << 30,
                    "host backend: bytes of each shared-memory ring (one per ordered pair of "
                    "local ranks, so n*(n-1) of them per host)");
    x.hostTransport = &c.addEnum(
        "BAGUA_HOST_TRANSPORT", "auto",
        {{"auto",
          "shared memory when every rank of the group is on this host and BAGUA_HOST_SHM "
          "is on, else the Bagua-Net engine"},
         {"engine", "the Bagua-Net multi-stream TCP engine for every peer"},
         {"socket",
          "our own single-socket TCP mesh (with shm rings between local ranks when "
          "BAGUA_HOST_SHM is on); for comparison"}},
        "host backend: transport under the collectives");
    x.hostNetStreams = &c.addInt("BAGUA_HOST_NET_STREAMS", 2, 1, 64,
                                 "host backend over the engine: data TCP streams per ordered pair "
                                 "of ranks (each has a helper thread on both sides)");
    return x;
  }();
  return e;
}

}  // namespace

ParamCatalogue& coreParams() {
  entries();  // registers every entry on first use
  return rawCatalogue();
}

namespace {
Entries& e() {
  return entries();
}
}  // namespace

Param<std::string>& CoreParams::masterAddr() {
  return *e().masterAddr;
}
Param<int64_t>& CoreParams::masterPort() {
  return *e().masterPort;
}
Param<int64_t>& CoreParams::rank() {
  return *e().rank;
}
Param<int64_t>& CoreParams::worldSize() {
  return *e().worldSize;
}
Param<int64_t>& CoreParams::localRank() {
  return *e().localRank;
}
Param<int64_t>& CoreParams::localWorldSize() {
  return *e().localWorldSize;
}
Param<int64_t>& CoreParams::rendezvousTimeoutMs() {
  return *e().rendezvousTimeoutMs;
}
Param<int64_t>& CoreParams::collectiveTimeoutMs() {
  return *e().collectiveTimeoutMs;
}
Param<std::string>& CoreParams::hostAlgorithm() {
  return *e().hostAlgorithm;
}
Param<uint64_t>& CoreParams::hostTreeMaxBytes() {
  return *e().hostTreeMaxBytes;
}
Param<uint64_t>& CoreParams::hostSegmentBytes() {
  return *e().hostSegmentBytes;
}
Param<int64_t>& CoreParams::hostReduceThreads() {
  return *e().hostReduceThreads;
}
Param<uint64_t>& CoreParams::hostSocketBuffer() {
  return *e().hostSocketBuffer;
}
Param<std::string>& CoreParams::hostListenAddr() {
  return *e().hostListenAddr;
}

Param<bool>& CoreParams::hostShm() {
  return *e().hostShm;
}
Param<uint64_t>& CoreParams::hostShmRingBytes() {
  return *e().hostShmRingBytes;
}
Param<std::string>& CoreParams::hostTransport() {
  return *e().hostTransport;
}
Param<int64_t>& CoreParams::hostNetStreams() {
  return *e().hostNetStreams;
}

}  // namespace bagua::core
