#include "bagua/core/process_group.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <random>

#include "backend/host/host_communicator.h"
#include "bagua/base/logging.h"
#include "bagua/core/params.h"
#include "bagua_config.h"
#include "cuda_backend.h"
#include "liveness.h"

namespace bagua::core {

namespace {

std::string ownToken() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  return strPrintf("%s:pid%d:%08x", host, static_cast<int>(::getpid()), rd());
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) {
    s += strPrintf("%s%d", i ? "," : "", ranks[i]);
  }
  if (ranks.size() > 16) {
    s += strPrintf(",... (%zu in all)", ranks.size());
  }
  return s;
}

}  // namespace

Status rendezvous(Store& store, int rank, int worldSize, std::chrono::milliseconds timeout) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    return BAGUA_ERROR(kInvalidArgument, "rendezvous: rank %d is outside WORLD_SIZE=%d", rank,
                       worldSize);
  }
  const std::string mine = std::to_string(worldSize);
  BAGUA_ASSIGN_OR_RETURN(Bytes ws, store.compareSet("rdzv/world_size", {}, toBytes(mine)));
  if (toString(ws) != mine) {
    return BAGUA_ERROR(kInvalidArgument,
                       "rendezvous: rank %d was started with WORLD_SIZE=%d but the ranks that "
                       "joined first use WORLD_SIZE=%s; start every rank with the same value",
                       rank, worldSize, toString(ws).c_str());
  }
  const std::string token = ownToken();
  BAGUA_ASSIGN_OR_RETURN(Bytes owner,
                         store.compareSet(strPrintf("rdzv/rank/%d", rank), {}, toBytes(token)));
  if (toString(owner) != token) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "rendezvous: rank %d is already taken by %s (this process is %s); two "
                       "processes were started with RANK=%d",
                       rank, toString(owner).c_str(), token.c_str(), rank);
  }
  std::vector<std::string> keys;
  for (int i = 0; i < worldSize; ++i) {
    keys.push_back(strPrintf("rdzv/rank/%d", i));
  }
  Status s = store.wait(keys, timeout);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    std::vector<int> missing;
    for (int i = 0; i < worldSize; ++i) {
      Result<bool> there = store.check(keys[i]);
      if (there.isOk() && !*there) {
        missing.push_back(i);
      }
    }
    return BAGUA_ERROR(kDeadlineExceeded,
                       "rendezvous: rank %d waited %lld ms but ranks [%s] of WORLD_SIZE=%d never "
                       "joined (not started, crashed, or pointed at another MASTER_ADDR/PORT)",
                       rank, static_cast<long long>(timeout.count()), rankList(missing).c_str(),
                       worldSize);
  }
  return s;
}

Result<std::unique_ptr<Communicator>> createCommunicator(Backend backend, Store& store, int rank,
                                                         int size,
                                                         const ProcessGroupOptions& options) {
  if (backend == Backend::kNccl) {
    // The CUDA half of core (cuda_backend.h), loaded on this first use where core is shared.
    BAGUA_ASSIGN_OR_RETURN(CudaBackend * cuda, cudaBackend());
    return cuda->createNcclCommunicator(store, rank, size, options);
  }
  BAGUA_ASSIGN_OR_RETURN(Liveness live, livenessFromParams());
  host::HostTransportOptions ht;
  host::SocketTransportOptions& to = ht.socket;
  to.connectTimeout = options.rendezvousTimeout;
  to.deadPeerTimeout = live.timeout;
  BAGUA_ASSIGN_OR_RETURN(uint64_t buf, coreParams().hostSocketBuffer.get());
  to.socketBuffer = buf;
  BAGUA_ASSIGN_OR_RETURN(to.listenAddress, coreParams().hostListenAddr.get());
  if (options.hostSharedMemory.has_value()) {
    to.sharedMemory = *options.hostSharedMemory;
  } else {
    BAGUA_ASSIGN_OR_RETURN(to.sharedMemory, coreParams().hostShm.get());
  }
  BAGUA_ASSIGN_OR_RETURN(uint64_t ring, coreParams().hostShmRingBytes.get());
  to.sharedMemoryRingBytes = ring;
  host::EngineTransportOptions& te = ht.engine;
  te.connectTimeout = to.connectTimeout;
  te.socketBuffer = to.socketBuffer;
  te.listenAddress = to.listenAddress;
  BAGUA_ASSIGN_OR_RETURN(int64_t streams, coreParams().hostNetStreams.get());
  te.streams = static_cast<int>(streams);
  BAGUA_ASSIGN_OR_RETURN(uint64_t piece, coreParams().hostSegmentBytes.get());
  te.pieceBytes = piece;
  if (options.hostTransport.has_value()) {
    ht.kind = *options.hostTransport == HostTransport::kEngine   ? host::TransportKind::kEngine
              : *options.hostTransport == HostTransport::kSocket ? host::TransportKind::kSocket
                                                                 : host::TransportKind::kAuto;
  } else {
    BAGUA_ASSIGN_OR_RETURN(std::string kind, coreParams().hostTransport.get());
    ht.kind = kind == "engine" ? host::TransportKind::kEngine : host::TransportKind::kAuto;
  }
  BAGUA_ASSIGN_OR_RETURN(auto transport, host::connectHostTransport(store, rank, size, ht));
  BAGUA_ASSIGN_OR_RETURN(
      host::HostOptions ho,
      host::hostOptionsFromParams(
          options.collectiveTimeout,
          std::min(size, options.localWorldSize > 0 ? options.localWorldSize : size)));
  auto comm = std::make_unique<host::HostCommunicator>(std::move(transport), ho);
  if (live.on() && size > 1) {
    host::PeerMonitorOptions mo;
    mo.timeout = live.timeout;
    mo.interval = live.interval;
    mo.setupTimeout = options.rendezvousTimeout;
    mo.bindAddress = to.listenAddress;
    BAGUA_RETURN_IF_ERROR(comm->startPeerMonitor(store, mo));
  }
  return std::unique_ptr<Communicator>(std::move(comm));
}

Result<std::unique_ptr<ProcessGroup>> ProcessGroup::create(std::shared_ptr<Store> store,
                                                           const ProcessGroupOptions& options) {
  // Logging reads its parameters lazily and can only warn about a bad value; initialisation is
  // where a bad BAGUA_LOG_* must stop the job, as a bad value of any other knob does.
  BAGUA_RETURN_IF_ERROR(baseParams().loadAll());
  ProcessGroupOptions o = options;
  if (o.rendezvousTimeout.count() <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, coreParams().rendezvousTimeoutMs.get());
    o.rendezvousTimeout = std::chrono::milliseconds(t);
  }
  if (o.collectiveTimeout.count() <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, coreParams().collectiveTimeoutMs.get());
    o.collectiveTimeout = std::chrono::milliseconds(t);
  }
  if (o.localWorldSize <= 0) {
    o.localWorldSize = o.worldSize;
  }
  if (o.worldSize < 1 || o.rank < 0 || o.rank >= o.worldSize) {
    return BAGUA_ERROR(kInvalidArgument, "process group: RANK=%d is outside WORLD_SIZE=%d", o.rank,
                       o.worldSize);
  }
  if (o.worldSize % o.localWorldSize != 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "process group: WORLD_SIZE=%d is not a multiple of LOCAL_WORLD_SIZE=%d "
                       "(every node must run the same number of ranks)",
                       o.worldSize, o.localWorldSize);
  }
  const int expectLocal = o.rank % o.localWorldSize;
  if (o.localRank < 0) {
    o.localRank = expectLocal;
  } else if (o.localRank != expectLocal) {
    return BAGUA_ERROR(kInvalidArgument,
                       "process group: LOCAL_RANK=%d but RANK=%d with LOCAL_WORLD_SIZE=%d implies "
                       "%d (ranks must be laid out node by node)",
                       o.localRank, o.rank, o.localWorldSize, expectLocal);
  }
  auto scoped = std::make_shared<PrefixStore>("pg/" + o.name, store);
  BAGUA_RETURN_IF_ERROR(rendezvous(*scoped, o.rank, o.worldSize, o.rendezvousTimeout));

  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->options_ = o;
  pg->store_ = store;
  {
    PrefixStore s("global", scoped);
    BAGUA_ASSIGN_OR_RETURN(pg->global_, createCommunicator(o.backend, s, o.rank, o.worldSize, o));
  }
  if (o.hierarchical) {
    const int node = o.rank / o.localWorldSize;
    PrefixStore si(strPrintf("intra/%d", node), scoped);
    BAGUA_ASSIGN_OR_RETURN(pg->intra_,
                           createCommunicator(o.backend, si, o.localRank, o.localWorldSize, o));
    PrefixStore se(strPrintf("inter/%d", o.localRank), scoped);
    BAGUA_ASSIGN_OR_RETURN(
        pg->inter_, createCommunicator(o.backend, se, node, o.worldSize / o.localWorldSize, o));
  }
  BAGUA_LOG_INFO(kLogInit, "process group '%s': rank %d of %d (local %d of %d), backend %s",
                 o.name.c_str(), o.rank, o.worldSize, o.localRank, o.localWorldSize,
                 pg->global_->backendName().c_str());
  return pg;
}

Result<EnvInit> readEnvInit() {
  EnvInit e;
  BAGUA_ASSIGN_OR_RETURN(e.masterAddr, coreParams().masterAddr.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t port, coreParams().masterPort.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t rank, coreParams().rank.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t world, coreParams().worldSize.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t localRank, coreParams().localRank.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t localWorld, coreParams().localWorldSize.get());
  e.masterPort = static_cast<int>(port);
  e.rank = static_cast<int>(rank);
  e.worldSize = static_cast<int>(world);
  e.localWorldSize = localWorld < 0 ? e.worldSize : static_cast<int>(localWorld);
  e.localRank = localRank < 0 ? e.rank % e.localWorldSize : static_cast<int>(localRank);
  if (e.rank >= e.worldSize) {
    return BAGUA_ERROR(kInvalidArgument, "RANK=%d is not below WORLD_SIZE=%d", e.rank, e.worldSize);
  }
  if (e.localWorldSize < 1 || e.localRank >= e.localWorldSize) {
    return BAGUA_ERROR(kInvalidArgument, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
                       e.localRank, e.localWorldSize);
  }
  return e;
}

Result<std::unique_ptr<ProcessGroup>> ProcessGroup::initFromEnv(ProcessGroupOptions options) {
  BAGUA_ASSIGN_OR_RETURN(EnvInit e, readEnvInit());
  options.rank = e.rank;
  options.worldSize = e.worldSize;
  options.localRank = e.localRank;
  options.localWorldSize = e.localWorldSize;
  if (options.rendezvousTimeout.count() <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, coreParams().rendezvousTimeoutMs.get());
    options.rendezvousTimeout = std::chrono::milliseconds(t);
  }
  std::unique_ptr<TcpStoreServer> server;
  if (e.rank == 0) {
    // On MASTER_ADDR's interface, never every interface unless BAGUA_STORE_LISTEN_ADDR asks.
    BAGUA_ASSIGN_OR_RETURN(std::string host, storeListenAddress(e.masterAddr));
    BAGUA_ASSIGN_OR_RETURN(server, TcpStoreServer::start(host, e.masterPort));
  }
  TcpStoreOptions so;
  so.host = e.masterAddr;
  so.port = e.masterPort;
  so.connectTimeout = options.rendezvousTimeout;
  BAGUA_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> client, TcpStore::connect(so));
  std::shared_ptr<Store> store(std::move(client));
  BAGUA_ASSIGN_OR_RETURN(auto pg, create(store, options));
  pg->server_ = std::move(server);
  return pg;
}

ProcessGroup::~ProcessGroup() {
  // Communicators first (they may still talk), the store server last so that peers still
  // rendezvousing get a clean error rather than a reset.
  inter_.reset();
  intra_.reset();
  global_.reset();
  store_.reset();
  server_.reset();
}

CommStats ProcessGroup::stats() const {
  CommStats total;
  for (const Communicator* c : {global_.get(), intra_.get(), inter_.get()}) {
    if (c != nullptr) {
      CommStats s = c->stats();
      total.bytesSent += s.bytesSent;
      total.bytesReceived += s.bytesReceived;
      total.operations += s.operations;
    }
  }
  return total;
}

void ProcessGroup::abort(const std::string& why) {
  for (Communicator* c : {global_.get(), intra_.get(), inter_.get()}) {
    if (c != nullptr) {
      c->abort(why);
    }
  }
}

}  // namespace bagua::core
