// The host (CPU) communicator: collectives over the Transport seam, run in issue order by one
// worker thread ("bagua-host-comm").
//
// Algorithms: ring reduce-scatter + all-gather for large all-reduces (bandwidth optimal), with
// each received segment reduced while the next is in flight; recursive doubling for small ones
// (latency optimal; non-powers of two fold the extra ranks in first); binomial tree broadcast
// for small messages, scatter + ring all-gather for large; ring all-gather and reduce-scatter;
// all-to-all as one batch of n-1 concurrent exchanges.
//
// Files: host_communicator.cc (queue and worker), host_collectives.cc (entry points and
// algorithms), host_tuning.cc (live tuning).
//
// Thread model: callers enqueue (mutex-protected queue) and get a Work; the worker pops in FIFO
// order and runs each operation under the collective deadline. Locks: queueMu_ (queue and
// broken state) is never held while an operation runs. abort() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/host/peer_monitor.h"
#include "backend/host/reduce_kernels.h"
#include "backend/host/transport.h"
#include "bagua/core/communicator.h"
#include "bagua/core/host_tuning.h"

namespace bagua::core::host {

struct HostOptions {
  std::chrono::milliseconds timeout{300000};
  enum class Algo { kAuto, kRing, kTree } algo = Algo::kAuto;
  size_t treeMaxBytes = 64 * 1024;
  size_t segmentBytes = 256 * 1024;
  int reduceThreads = 1;
};

// How a collective cuts a buffer into one chunk per rank: byte offset and length of chunk i.
struct Chunks {
  std::vector<size_t> offsets;
  std::vector<size_t> lengths;
};
// `count` elements of `elementSize` bytes over `n` ranks, back to back; the first count % n
// chunks hold one element more (the ring all-reduce's and the scatter's layout, the same on every
// rank). Chunks may be empty when count < n.
Chunks splitCount(size_t count, int n, size_t elementSize);
// `n` chunks of `bytes` each, back to back (the all-gather's layout).
Chunks equalChunks(int n, size_t bytes);

// Reads the BAGUA_HOST_* parameters (and BAGUA_COLLECTIVE_TIMEOUT_MS when timeout is 0).
// `ranksPerHost` sizes the automatic number of reduction threads.
Result<HostOptions> hostOptionsFromParams(std::chrono::milliseconds timeout, int ranksPerHost);

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(std::unique_ptr<Transport> transport, const HostOptions& options);
  ~HostCommunicator() override;
  HostCommunicator(const HostCommunicator&) = delete;
  HostCommunicator& operator=(const HostCommunicator&) = delete;

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  std::string backendName() const override { return "host"; }

  WorkPtr allReduce(const void* send, void* recv, size_t count, DataType dtype,
                    ReduceOp op) override;
  WorkPtr reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                 int root) override;
  WorkPtr reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                        ReduceOp op) override;
  WorkPtr allGather(const void* send, void* recv, size_t count, DataType dtype) override;
  WorkPtr broadcast(void* buffer, size_t count, DataType dtype, int root) override;
  WorkPtr allToAll(const void* send, void* recv, size_t count, DataType dtype) override;
  WorkPtr send(const void* buffer, size_t count, DataType dtype, int peer) override;
  WorkPtr recv(void* buffer, size_t count, DataType dtype, int peer) override;
  WorkPtr sendRecv(const void* send, size_t sendCount, int sendPeer, void* recv, size_t recvCount,
                   int recvPeer, DataType dtype) override;
  WorkPtr barrier() override;
  void abort(const std::string& why) override;
  CommStats stats() const override;

  // Live tuning (bagua/core/host_tuning.h; the free setHostTuning waits for it). A collective:
  // the values of every rank are exchanged and compared on the worker; *verdict gets the outcome
  // (InvalidArgument on a mismatch or a bad value, applied nowhere), the Work fails only when the
  // exchange itself fails.
  WorkPtr setTuning(const HostTuning& tuning, std::shared_ptr<Status> verdict);
  HostTuningState tuning() const;

  // Collective: heartbeats with the peers on other hosts (peer_monitor.h); a lost peer aborts
  // this communicator, naming it. Called once, right after construction, by every rank.
  Status startPeerMonitor(Store& store, const PeerMonitorOptions& options);

 private:
  class HostWork;
  struct Item {
    std::string name;
    std::function<Status(Deadline)> run;
    std::shared_ptr<HostWork> work;
  };

  WorkPtr enqueue(std::string name, std::function<Status(Deadline)> run);
  void workerLoop(std::stop_token stop);

  // Algorithms (worker thread only).
  Status allReduceImpl(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       Deadline dl);
  Status ringAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op, Deadline dl);
  Status doublingAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op, Deadline dl);
  // Ring all-gather over n arbitrary chunks of data; on entry chunk `have` is present locally,
  // on exit all are.
  Status ringAllGather(uint8_t* data, const Chunks& chunks, int have, Deadline dl);
  Status treeBroadcast(uint8_t* data, size_t bytes, int root, Deadline dl);
  bool useTree(size_t bytes) const;
  uint8_t* scratch(size_t bytes);

  std::unique_ptr<Transport> transport_;
  HostOptions options_;
  ReduceEngine reducer_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> scratch2_;

  mutable std::mutex queueMu_;
  std::condition_variable_any queueCv_;
  std::deque<Item> queue_;
  Status broken_;  // guarded by queueMu_
  std::atomic<uint64_t> operations_{0};
  std::atomic<size_t> segmentNow_{0};  // options_.segmentBytes as last applied, for tuning()
  std::jthread worker_;
  std::unique_ptr<PeerMonitor> monitor_;  // null: heartbeat off or every peer on this host
};

}  // namespace bagua::core::host
