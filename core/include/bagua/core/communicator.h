// The communicator interface: collectives and point-to-point on typed buffers, asynchronous.
//
// Every call enqueues the operation and returns a Work handle at once. Operations of one
// communicator run in the order they were issued (one worker per communicator), so every rank
// must issue the same collectives in the same order (as with NCCL). Buffers are borrowed: they
// must stay valid and untouched until the Work completes.
//
// Errors: a failed operation (peer closed, deadline, abort) completes its Work with the error
// and marks the communicator broken: later operations complete at once with an error that
// names the first failure. A rank that dies therefore surfaces as RemoteError on its peers,
// never as a hang; every operation is bounded by the collective timeout.
//
// Thread safety: the issuing methods may be called from any thread, but the order of issue
// defines the order of execution, so concurrent issuers must agree on an order themselves.
// Work handles may be waited on from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bagua/base/status.h"
#include "bagua/core/types.h"

// The CUDA runtime's handle types (cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*),
// declared so that this header needs no CUDA headers.
struct CUstream_st;
struct CUevent_st;

namespace bagua::core {

class Work {
 public:
  virtual ~Work() = default;
  // True once the operation has finished (successfully or not).
  virtual bool test() = 0;
  // Waits up to `timeout` for completion. DeadlineExceeded if still running (the operation
  // continues; wait again or abort the communicator), else the operation's status.
  virtual Status wait(std::chrono::milliseconds timeout) = 0;
  // The operation's status once finished; FailedPrecondition while running.
  virtual Status status() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// Traffic counters of one communicator (payload bytes, excluding headers).
struct CommStats {
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  uint64_t operations = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backendName() const = 0;

  // recv = op over ranks of send (count elements). send == recv is in place.
  virtual WorkPtr allReduce(const void* send, void* recv, size_t count, DataType dtype,
                            ReduceOp op) = 0;
  // Root's recv = op over ranks of send; recv is ignored on other ranks (may be null there).
  virtual WorkPtr reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                         int root) = 0;
  // send holds size()*count elements; rank r receives block r of the reduction (count).
  virtual WorkPtr reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                ReduceOp op) = 0;
  // recv (size()*count elements) block r = rank r's send (count elements).
  virtual WorkPtr allGather(const void* send, void* recv, size_t count, DataType dtype) = 0;
  // buffer on every rank = root's buffer.
  virtual WorkPtr broadcast(void* buffer, size_t count, DataType dtype, int root) = 0;
  // send and recv hold size()*count elements; block j of my send goes to rank j, block j of my
  // recv comes from rank j.
  virtual WorkPtr allToAll(const void* send, void* recv, size_t count, DataType dtype) = 0;
  // Point to point. Matched in issue order per pair of ranks. Two ranks that send to each other
  // must use sendRecv (or issue one send and one recv in opposite orders) to avoid deadlock.
  virtual WorkPtr send(const void* buffer, size_t count, DataType dtype, int peer) = 0;
  virtual WorkPtr recv(void* buffer, size_t count, DataType dtype, int peer) = 0;
  virtual WorkPtr sendRecv(const void* send, size_t sendCount, int sendPeer, void* recv,
                           size_t recvCount, int recvPeer, DataType dtype) = 0;
  virtual WorkPtr barrier() = 0;

  // Fails every pending and future operation with Aborted and unblocks the worker promptly.
  virtual void abort(const std::string& why) = 0;
  virtual CommStats stats() const = 0;

  // ---- Stream ordering (device communicators; host ones answer FailedPrecondition) ----
  // The device-side ordering torch DDP uses, so that neither side waits on the host:
  // afterEvent() makes this communicator's next operations start only once `event` (recorded
  // on another stream, e.g. "the bucket's gradients are copied") has completed;
  // orderStream() makes `stream` (e.g. the trainer's) run its later work only after every
  // operation issued so far has completed. Both return at once. Either may be called from any
  // thread; like an issue, each takes its place in the order of issue.
  virtual Status afterEvent(CUevent_st* /*event*/) {
    return BAGUA_ERROR(kFailedPrecondition, "%s communicators have no device stream",
                       backendName().c_str());
  }
  virtual Status orderStream(CUstream_st* /*stream*/) {
    return BAGUA_ERROR(kFailedPrecondition, "%s communicators have no device stream",
                       backendName().c_str());
  }
};

// A Work that is already complete (errors found before enqueueing, size-0 no-ops).
WorkPtr completedWork(Status status);

}  // namespace bagua::core
