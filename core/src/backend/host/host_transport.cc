// Transport selection: shared memory where every rank of the group is on this host (it beats
// loopback TCP by 2x and more, bench/RESULTS.md "Host backend"), the Bagua-Net engine otherwise.
#include "backend/host/transport.h"
#include "bagua/base/logging.h"
#include "bagua/core/params.h"

namespace bagua::core::host {

namespace {

// True when every rank of the group runs on this host. Collective over the store.
Result<bool> allOnThisHost(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  const std::string me = hostIdentity();
  BAGUA_RETURN_IF_ERROR(store.set(strPrintf("where/%d", rank), toBytes(me)));
  bool all = true;
  for (int r = 0; r < size; ++r) {
    BAGUA_ASSIGN_OR_RETURN(Bytes b, store.get(strPrintf("where/%d", r), timeout));
    all = all && toString(b) == me;
  }
  return all;
}

}  // namespace

Result<std::unique_ptr<Transport>> connectHostTransport(Store& store, int rank, int size,
                                                        const HostTransportOptions& options) {
  TransportKind kind = options.kind;
  if (kind == TransportKind::kAuto) {
    kind = TransportKind::kEngine;
    if (size > 1 && options.socket.sharedMemory) {
      BAGUA_ASSIGN_OR_RETURN(bool local,
                             allOnThisHost(store, rank, size, options.socket.connectTimeout));
      if (local) {
        kind = TransportKind::kSocket;
      }
    }
  }
  BAGUA_LOG_DEBUG(kLogCore, "rank %d of %d: host transport %s", rank, size,
                  kind == TransportKind::kEngine ? "engine (TCP)" : "socket mesh + shm");
  if (kind == TransportKind::kEngine) {
    return connectEngineTransport(store, rank, size, options.engine);
  }
  return connectSocketTransport(store, rank, size, options.socket);
}

}  // namespace bagua::core::host
