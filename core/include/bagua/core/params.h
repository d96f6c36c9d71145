// The core library's parameter catalogue: rendezvous (torchrun's variables), timeouts and the
// host backend's tuning knobs. Dump them with `bagua-params`.
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/params.h"

namespace bagua::core {

ParamCatalogue& coreParams();

// Typed accessors for the catalogue's entries (each returns the parsed value or the error that
// names the key and the bad value).
struct CoreParams {
  static Param<std::string>& masterAddr();       // MASTER_ADDR
  static Param<int64_t>& masterPort();           // MASTER_PORT
  static Param<int64_t>& rank();                 // RANK
  static Param<int64_t>& worldSize();            // WORLD_SIZE
  static Param<int64_t>& localRank();            // LOCAL_RANK (-1: same as RANK)
  static Param<int64_t>& localWorldSize();       // LOCAL_WORLD_SIZE (-1: same as WORLD_SIZE)
  static Param<int64_t>& rendezvousTimeoutMs();  // BAGUA_RENDEZVOUS_TIMEOUT_MS
  static Param<int64_t>& collectiveTimeoutMs();  // BAGUA_COLLECTIVE_TIMEOUT_MS
  static Param<std::string>& hostAlgorithm();    // BAGUA_HOST_ALGO: auto, ring, tree
  static Param<uint64_t>& hostTreeMaxBytes();    // BAGUA_HOST_TREE_MAX_BYTES
  static Param<uint64_t>& hostSegmentBytes();    // BAGUA_HOST_SEGMENT_BYTES
  static Param<int64_t>& hostReduceThreads();    // BAGUA_HOST_REDUCE_THREADS
  static Param<uint64_t>& hostSocketBuffer();    // BAGUA_HOST_SOCKET_BUFFER
  static Param<std::string>& hostListenAddr();   // BAGUA_HOST_LISTEN_ADDR
  static Param<bool>& hostShm();                 // BAGUA_HOST_SHM
  static Param<uint64_t>& hostShmRingBytes();    // BAGUA_HOST_SHM_RING_BYTES
  static Param<std::string>& hostTransport();    // BAGUA_HOST_TRANSPORT: auto, engine, socket
  static Param<int64_t>& hostNetStreams();       // BAGUA_HOST_NET_STREAMS
};

}  // namespace bagua::core
