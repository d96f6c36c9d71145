// Send and receive comms: request slots, helper threads, chunk scheduling.
//
// Thread model (per comm)
// -----------------------
// Caller thread: isend/irecv (single producer; writes a slot, then publishes `posted_`), test().
// Send side: one control thread (writes one control record per message, in order, plus the
// inline payload) and one thread per data stream. A data thread claims the next chunk under
// claimMu_ (a tiny critical section: bump a cursor) whenever its previous chunk was accepted by
// the kernel, so faster streams take more chunks (dynamic scheduling), then writes header+payload
// with one sendmsg straight from the caller's buffer.
// Receive side: one control thread (reads control records: real size, inline payload) and one
// thread per data stream (reads a chunk header, waits until the matching irecv is posted, reads
// the payload straight into the posted buffer at the chunk's offset).
// Completion: each slot has an atomic byte/token count; whichever thread makes it reach zero
// marks the slot done (release); test() observes it (acquire) and recycles the slot.
// Idle threads spin for spinUs, then park on waitCv_ with a bounded wait (20 ms re-check).
// Locks: claimMu_ (send data threads only), waitMu_ (parking), errorMu_ (first error). Never
// nested. Teardown: stop flag, shutdown(2) on every socket (wakes blocked I/O), notify, join.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/net/engine.h"
#include "socket.h"

namespace bagua::net {

inline constexpr int kSlots = 64;  // requests in flight per comm (>= kMinRequestsInFlight)
static_assert(kSlots >= kMinRequestsInFlight);

class CommCore;

// One request slot; a Request handed to the caller.
struct Slot : Request {
  CommCore* owner = nullptr;
  uint8_t* data = nullptr;
  uint64_t size = 0;      // send: message size; recv: capacity until done, then real size
  uint64_t capacity = 0;  // recv: posted capacity
  uint64_t seq = 0;
  uint64_t chunk = 0;  // send: chunk size (0 when inline)
  std::atomic<int64_t> remaining{0};
  std::atomic<uint64_t> stamp{0};  // seq + 1 while posted, 0 when free
  std::atomic<bool> done{false};
  uint64_t realSize = 0;  // recv: written by the control thread

  Status testSlot(bool* done, size_t* size);
};

// What send and receive comms share: sockets, threads, slots, errors, parking.
class CommCore {
 public:
  CommCore(Fd control, std::vector<Fd> data, const EngineOptions& options, SocketAddress peer,
           bool sender);
  virtual ~CommCore();
  CommCore(const CommCore&) = delete;
  CommCore& operator=(const CommCore&) = delete;

  Status testSlot(Slot* slot, bool* done, size_t* size);
  int nStreams() const { return static_cast<int>(data_.size()); }
  const SocketAddress& peer() const { return peer_; }

 protected:
  // Stops and joins the helper threads (called by the derived destructor first).
  void stopThreads();
  void fail(Status status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure();
  // Adds `delta` to the slot's remaining count; marks it done when it reaches zero.
  void contribute(Slot* slot, int64_t delta);
  // Waits until pred() holds or the comm stops; false when stopping.
  template <typename Pred>
  bool waitUntil(Pred pred);
  void wake();
  // Handles an I/O error of a helper thread: quiet while stopping, else fails the comm.
  void ioError(Status status, const char* where, int stream);

  EngineOptions options_;
  SocketAddress peer_;
  bool sender_;
  Fd control_;
  std::vector<Fd> data_;
  Slot slots_[kSlots];
  std::atomic<uint64_t> posted_{0};  // messages posted by the caller (next sequence)
  std::atomic<bool> stopping_{false};
  std::atomic<bool> failed_{false};
  std::atomic<int> closedStreams_{0};  // receive side: streams that ended cleanly
  std::mutex errorMu_;
  Status error_;  // guarded by errorMu_
  std::mutex waitMu_;
  std::condition_variable waitCv_;
  std::atomic<int> sleepers_{0};
  std::vector<std::jthread> threads_;
};

struct SendComm::Impl : public CommCore {
 public:
  Impl(Fd control, std::vector<Fd> data, const EngineOptions& options, SocketAddress peer);
  ~Impl() override;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Result<Request*> isend(const void* data, size_t size);

 private:
  void controlLoop();
  void dataLoop(int stream);
  // Claims the next chunk; false when none is available now.
  bool claim(Slot** slot, uint64_t* offset, uint32_t* length);

  std::mutex claimMu_;
  std::atomic<uint64_t> claimSeq_{0};  // written under claimMu_
  uint64_t claimOffset_ = 0;           // guarded by claimMu_
};

struct RecvComm::Impl : public CommCore {
 public:
  Impl(Fd control, std::vector<Fd> data, const EngineOptions& options, SocketAddress peer);
  ~Impl() override;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Result<Request*> irecv(void* data, size_t capacity);

 private:
  void controlLoop();
  void dataLoop(int stream);
  // Waits until the receive for `seq` is posted; nullptr when stopping.
  Slot* waitPosted(uint64_t seq);
  Status truncation(const Slot* slot, uint64_t needed, const char* what);
};

}  // namespace bagua::net
