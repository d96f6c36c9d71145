// Process groups: rendezvous through a Store, a global communicator, and the hierarchical
// sub-groups Bagua uses (intra-node: the ranks of my node; inter-node: the ranks of every node
// with my local rank, so local rank 0 of each node forms the leaders' group).
//
// Ranks are assumed to be laid out node by node (rank = node * localWorldSize + localRank), as
// torchrun and baguarun do.
//
// Rendezvous checks, each a clear error within the rendezvous timeout: two processes claiming
// the same rank (FailedPrecondition naming the rank), ranks disagreeing on the world size
// (InvalidArgument naming both values), missing ranks (DeadlineExceeded listing them), an
// unreachable master (Unavailable naming host:port).
//
// Thread safety: a ProcessGroup's accessors are thread-safe; creating groups is collective and
// every rank must create them in the same order.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/communicator.h"
#include "bagua/core/store.h"

namespace bagua::core {

class TcpStoreServer;

enum class Backend { kHost, kNccl };

// What the host backend's collectives run over (BAGUA_HOST_TRANSPORT: auto or engine).
enum class HostTransport {
  kAuto,    // shared memory when every rank of the group is on this host, else kEngine
  kEngine,  // the Bagua-Net multi-stream TCP engine (net_plugin)
  // The socket mesh that kAuto uses for shared memory, forced: with shared memory off, our own
  // single-socket TCP mesh between every pair. A comparison point for tests and benchmarks
  // (bagua-allreduce-bench --transports socket); no parameter selects it.
  kSocket,
};

struct ProcessGroupOptions {
  int rank = 0;
  int worldSize = 1;
  int localRank = -1;       // -1: rank % localWorldSize
  int localWorldSize = -1;  // -1: worldSize (one node)
  Backend backend = Backend::kHost;
  // Build the intra-node and inter-node sub-groups (costs one more mesh of connections each).
  bool hierarchical = true;
  std::chrono::milliseconds rendezvousTimeout{0};  // 0: BAGUA_RENDEZVOUS_TIMEOUT_MS
  std::chrono::milliseconds collectiveTimeout{0};  // 0: BAGUA_COLLECTIVE_TIMEOUT_MS
  // Name of this group's keys in the store; groups sharing a store need distinct names.
  std::string name = "default";
  int cudaDevice = -1;  // NCCL backend: -1 means localRank
  // Host backend: shared memory between ranks of one host (unset: BAGUA_HOST_SHM).
  std::optional<bool> hostSharedMemory;
  // Host backend: transport (unset: BAGUA_HOST_TRANSPORT).
  std::optional<HostTransport> hostTransport;
};

// What env:// initialisation read (torchrun's variables through coreParams()).
struct EnvInit {
  std::string masterAddr;
  int masterPort = 0;
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
};
Result<EnvInit> readEnvInit();

class ProcessGroup {
 public:
  // Rendezvous on `store` and connect the communicators.
  static Result<std::unique_ptr<ProcessGroup>> create(std::shared_ptr<Store> store,
                                                      const ProcessGroupOptions& options);
  // env://: reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE;
  // rank 0 hosts the TCP store server on MASTER_PORT; everyone connects to it.
  static Result<std::unique_ptr<ProcessGroup>> initFromEnv(ProcessGroupOptions options = {});

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.worldSize; }
  int localRank() const { return options_.localRank; }
  int localSize() const { return options_.localWorldSize; }
  int nodeRank() const { return options_.rank / options_.localWorldSize; }
  int numNodes() const { return options_.worldSize / options_.localWorldSize; }
  const ProcessGroupOptions& options() const { return options_; }

  Communicator& global() { return *global_; }
  // Null unless options.hierarchical.
  Communicator* intraNode() { return intra_.get(); }
  Communicator* interNode() { return inter_.get(); }
  std::shared_ptr<Store> store() { return store_; }

  // Sum of the traffic of every communicator of the group.
  CommStats stats() const;
  // Aborts every communicator (peers see errors, nothing hangs).
  void abort(const std::string& why);

 private:
  ProcessGroup() = default;

  ProcessGroupOptions options_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 under env://
  std::shared_ptr<Store> store_;
  std::unique_ptr<Communicator> global_;
  std::unique_ptr<Communicator> intra_;
  std::unique_ptr<Communicator> inter_;
};

// Joins the rendezvous of `worldSize` ranks under `store` (keys "rdzv/..."): claims the rank,
// checks the world size against the others', waits for everyone.
Status rendezvous(Store& store, int rank, int worldSize, std::chrono::milliseconds timeout);

// Creates a communicator of `backend` for (rank, size) with connections set up through store.
Result<std::unique_ptr<Communicator>> createCommunicator(Backend backend, Store& store, int rank,
                                                         int size,
                                                         const ProcessGroupOptions& options);

}  // namespace bagua::core
