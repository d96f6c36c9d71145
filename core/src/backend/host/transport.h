// The seam between the host collectives and the bytes on the wire: connect to every peer
// through the store, then move bytes to and from peer ranks. The collectives only see this
// interface: the Bagua-Net multi-stream engine (engine_transport.cc, TCP) or our own socket mesh
// with shared-memory rings between ranks of one host (socket_transport.cc).
//
// Model: a batch of sends and receives is posted at once and progressed together until all
// complete, the deadline passes, or the transport is aborted. Ops to the same peer in the same
// direction complete in order. Receives report completed segments through a callback while the
// rest of the batch is still in flight, which is how reduction overlaps transfer.
//
// Thread safety: exchange() is called by one thread at a time (the communicator's worker);
// abort() and the counters may be called from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/store.h"

namespace bagua::core::host {

using Deadline = std::chrono::steady_clock::time_point;

struct SendOp {
  int peer = 0;
  const void* data = nullptr;
  size_t len = 0;
  // When set, only the first *ready bytes may be sent yet; the caller raises it (from a
  // receive's onSegment in the same exchange) as data becomes available. This is how a ring
  // forwards a chunk while it is still arriving.
  const size_t* ready = nullptr;
};

struct RecvOp {
  int peer = 0;
  void* data = nullptr;
  size_t len = 0;
  // When nonzero, onSegment(offset, length) runs (on the calling thread) each time another
  // `segment` bytes (or the tail) have arrived.
  size_t segment = 0;
  std::function<void(size_t offset, size_t length)> onSegment;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Progresses every op to completion. Self ops (peer == rank) are matched in order and copied.
  virtual Status exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs,
                          Deadline deadline) = 0;
  // Makes the current and every later exchange fail with Aborted (promptly: within ~50 ms).
  virtual void abort(const std::string& why) = 0;
  virtual uint64_t bytesSent() const = 0;
  virtual uint64_t bytesReceived() const = 0;

  // Live tuning, called by the communicator's worker between exchanges (never during one), at the
  // same point of the operation sequence on every rank (HostCommunicator::setTuning checks it).
  // The size messages are cut into where the transport cuts them (the engine: both ends of a
  // pair must agree); a no-op for transports that do not cut.
  virtual void setPieceBytes(size_t /*bytes*/) {}
  // Data streams per connection that the transport established (0: it has no streams to tune),
  // how many of them carry new messages (1..established) and the chunk size set live (0: the
  // engine's parameters) and the parameters' smallest chunk (BAGUA_NET_MIN_CHUNKSIZE).
  // setEngineLive: 0 keeps a value; sender side only.
  virtual int establishedStreams() const { return 0; }
  virtual int activeStreams() const { return 0; }
  virtual uint64_t engineChunkBytes() const { return 0; }
  virtual uint64_t engineMinChunkBytes() const { return 0; }
  [[nodiscard]] virtual Status setEngineLive(int streams, uint64_t chunkBytes) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "engine streams (%d) / chunk size (%llu) can only be set on the engine "
                       "transport (BAGUA_HOST_TRANSPORT=engine)",
                       streams, static_cast<unsigned long long>(chunkBytes));
  }
};

// What the transports share: identity, traffic counters, the abort state and the exchange
// skeleton. abort() of a derived transport starts with markAborted(why), then wakes its own I/O;
// exchange() starts with startExchange() and then runs a batch of its own over remoteSends_ /
// remoteRecvs_ through runBatch(), which owns the progress / abort / deadline loop.
class TransportBase : public Transport {
 public:
  int rank() const final { return rank_; }
  int size() const final { return size_; }
  uint64_t bytesSent() const final { return sent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const final { return received_.load(std::memory_order_relaxed); }

 protected:
  TransportBase(int rank, int size) : rank_(rank), size_(size) {}

  // The top of abort(): records the reason (the latest wins) before raising the flag, so that
  // whoever sees the flag (acquire) reads the reason.
  void markAborted(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(abortMu_);
      abortWhy_ = why;
    }
    aborted_.store(true, std::memory_order_release);
  }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  Status abortedStatus() const {
    std::lock_guard<std::mutex> lock(abortMu_);
    return BAGUA_ERROR(kAborted, "rank %d: transport aborted: %s", rank_, abortWhy_.c_str());
  }

  // What every exchange() does first: fails with Aborted after abort() and with InvalidArgument
  // on a peer outside the group; matches the self ops in order (same count and lengths, else
  // Internal), copies them and reports their segments; and leaves in remoteSends_ /
  // remoteRecvs_ the ops to other ranks that have bytes to move, in the caller's order. A
  // receive of 0 bytes from another rank is complete at once (no segment to report).
  [[nodiscard]] Status startExchange(std::span<const SendOp> sends, std::span<RecvOp> recvs);

  // The loop every exchange runs once startExchange() succeeded, for a transport's batch (the
  // state of one exchange's remote ops), which provides:
  //   Status step(bool* progress)  moves what can move now without blocking; sets *progress when
  //                                 anything moved; an error ends the exchange (pass it through
  //                                 unlessAborted() so that an abort reads as one)
  //   bool finished() const        every op is complete
  //   bool waitingOn(int peer) const  an op with `peer` is unfinished (for the deadline's error)
  //   Status wait(Deadline until)  sleeps until something may move, at most until `until`
  // Steps until finished; after a step without progress, fails on abort or past the deadline,
  // else waits at most kWaitSlice, so abort() and the deadline are seen within that.
  template <typename Batch>
  [[nodiscard]] Status runBatch(Batch& batch, Deadline deadline) {
    while (!batch.finished()) {
      bool progress = false;
      BAGUA_RETURN_IF_ERROR(batch.step(&progress));
      if (batch.finished()) {
        break;
      }
      if (aborted()) {
        return abortedStatus();
      }
      if (progress) {
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return transferDeadline([&](int p) { return batch.waitingOn(p); });
      }
      BAGUA_RETURN_IF_ERROR(batch.wait(std::min(deadline, now + kWaitSlice)));
    }
    return Status::ok();
  }
  static constexpr std::chrono::milliseconds kWaitSlice{50};

  // A transfer's failure as the caller should see it: Aborted when abort() caused it (a closed
  // socket, a failed request), else `s`.
  Status unlessAborted(Status s) const { return aborted() ? abortedStatus() : std::move(s); }

  // The error of an exchange whose deadline passed, naming the peers for which
  // `waitingOn(peer)` is true.
  template <typename WaitingOn>
  Status transferDeadline(WaitingOn waitingOn) const {
    std::string waiting;
    for (int p = 0; p < size_; ++p) {
      if (waitingOn(p)) {
        waiting += strPrintf("%s%d", waiting.empty() ? "" : ",", p);
      }
    }
    return BAGUA_ERROR(kDeadlineExceeded,
                       "rank %d: transfer did not complete before the collective deadline; "
                       "still waiting on ranks [%s] (a peer is stuck or issued a different "
                       "collective)",
                       rank_, waiting.c_str());
  }

  // Calls op.onSegment for every segment (op.segment bytes, or the tail) that `arrived` bytes,
  // received contiguously from offset 0, complete beyond *reported, and advances *reported.
  static void reportSegments(RecvOp& op, size_t arrived, size_t* reported);

  const int rank_;
  const int size_;
  std::atomic<uint64_t> sent_{0};      // payload bytes (relaxed: statistics only)
  std::atomic<uint64_t> received_{0};  // payload bytes (relaxed: statistics only)
  // Filled by startExchange; exchange()'s thread only. Members so that an exchange does not
  // allocate once they have grown.
  std::vector<const SendOp*> remoteSends_;
  std::vector<RecvOp*> remoteRecvs_;

 private:
  std::vector<const SendOp*> selfSends_;
  std::vector<RecvOp*> selfRecvs_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abortMu_;
  std::string abortWhy_;  // guarded by abortMu_
};

struct SocketTransportOptions {
  std::chrono::milliseconds connectTimeout{60000};
  size_t socketBuffer = 4 << 20;
  // Address to listen on and publish; empty: the store's localAddress().
  std::string listenAddress;
  // Ranks on the same host exchange data through shared-memory rings (shm_mesh.h).
  bool sharedMemory = true;
  size_t sharedMemoryRingBytes = 1 << 20;
  // TCP_USER_TIMEOUT + keepalive on every connection (liveness.h); 0: TCP's defaults.
  std::chrono::milliseconds deadPeerTimeout{0};
  // Hellos are authenticated under this key; nullopt: the process's (jobKeyFromParams()).
  std::optional<JobKey> key;
  // An accepted connection that has not sent a valid hello this long after it was accepted is
  // dropped (the set-up goes on).
  std::chrono::milliseconds helloTimeout{5000};
};

// A full mesh of TCP connections (one per peer pair; the higher rank connects to the lower and
// opens with an authenticated hello, control_wire.h), addresses and listener nonces exchanged
// through `store` under "addr/<rank>". Connections are accepted concurrently; a bad, idle or
// duplicate one is dropped with a log line naming its address, never failing the set-up. With
// options.sharedMemory, the data of peers on the same host goes through shared-memory rings
// instead; their TCP connection then only carries wake-up bytes and reports the peer's death.
Result<std::unique_ptr<Transport>> connectSocketTransport(Store& store, int rank, int size,
                                                          const SocketTransportOptions& options);

struct EngineTransportOptions {
  std::chrono::milliseconds connectTimeout{60000};
  size_t socketBuffer = 4 << 20;
  std::string listenAddress;  // empty: the store's localAddress()
  int streams = 2;            // data TCP streams per ordered pair of ranks
  // Messages are cut into pieces of this size (the unit of pipelining); same on every rank.
  size_t pieceBytes = 256 * 1024;
  // Each new engine connection proves this key before data moves; nullopt: the process's.
  std::optional<JobKey> key;
};

// The Bagua-Net engine (net_plugin's multi-stream TCP engine): one connection per ordered pair,
// handles exchanged through `store` under "eng/<receiver>/<sender>".
Result<std::unique_ptr<Transport>> connectEngineTransport(Store& store, int rank, int size,
                                                          const EngineTransportOptions& options);

enum class TransportKind {
  kAuto,    // every rank on this host and shared memory on: socket (shm rings); else engine
  kEngine,  // the Bagua-Net engine for every peer
  kSocket,  // our own TCP mesh (+ shm rings between local ranks when enabled)
};

struct HostTransportOptions {
  TransportKind kind = TransportKind::kAuto;
  SocketTransportOptions socket;
  EngineTransportOptions engine;
};

// Picks and connects the transport (collective: every rank must pass the same kind).
Result<std::unique_ptr<Transport>> connectHostTransport(Store& store, int rank, int size,
                                                        const HostTransportOptions& options);

// This machine's identity (host name and boot id): ranks with equal identities share memory.
std::string hostIdentity();

}  // namespace bagua::core::host
