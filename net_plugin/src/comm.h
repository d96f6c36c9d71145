// Send and receive comms: request slots, helper threads, chunk scheduling. Implemented in
// live_cell.cc (LiveSettings, LiveCell), comm.cc (CommCore, Notifier), send_comm.cc and
// recv_comm.cc (the two sides and their public wrappers).
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
// Idle threads spin for spinUs, then park (Park: condition variable, bounded re-check every
// parkRecheckMs, 20 ms).
// Chunk policy (bagua/net/chunk_policy.h): isend gathers what the comm sees (unclaimed bytes,
// messages in flight, each stream's measured rate, the measured wake-up of a parked stream) and
// cuts the message as planChunks says; data threads keep the measurements (relaxed atomics).
// Live settings (LiveSettings): isend takes one snapshot (LiveCell, a seqlock over atomics) of
// the comm's and the process's settings and records the active stream count and chunk size in
// the slot; a send data thread only claims chunks of a message whose active count exceeds its
// stream index (claims stay in message order, so a stream beyond the count waits until the
// cursor reaches a message it may serve). Each send data thread parks on its own Park, so isend
// wakes only parked streams among [0, active), and no more of them than the message has chunks.
// isend wakes the send data threads only for messages with chunks, and the control thread only
// when the caller could not write the control record itself (small messages go out from the
// caller's thread and, on the receiver, are read by test(): no helper-thread hop). The receive
// control thread polls the control stream only when the caller's test() has not looked at it
// for kCallerGrace, or when a Notifier is set (a caller that sleeps until signalled).
// Locks: ctrlMu_ (control stream state; the caller only try_locks it), StreamTx::mu (one per send
// data stream: its writer, the thread or a caller-sent chunk's isend, which only try_locks it),
// claimMu_ (the chunk cursor), Park::mu (parking), errorMu_ (first error), LiveCell::mu_ (writers
// of live settings only). The one nesting: StreamTx::mu, then claimMu_. Teardown: stop flag,
// shutdown(2) on every socket (wakes blocked I/O), notify, join.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
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

// One spin-wait step: tells the core (and a hyper-thread sibling) that this thread is polling.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Live settings readable without a lock: a sequence lock over atomic fields. Writers (rare: the
// tuner between iterations) serialise on mu_; readers (every isend) retry while a write is in
// progress. Not copyable.
class LiveCell {
 public:
  LiveCell() = default;
  LiveCell(const LiveCell&) = delete;
  LiveCell& operator=(const LiveCell&) = delete;

  void store(const LiveSettings& settings);
  LiveSettings load() const;

 private:
  std::mutex mu_;
  std::atomic<uint64_t> seq_{0};  // odd while a write is in progress
  std::atomic<int> active_{0};
  std::atomic<uint64_t> minChunk_{0};
  std::atomic<uint64_t> maxChunk_{0};
};

// The process-wide cell (setProcessLiveSettings).
LiveCell& processLiveCell();

// Where idle helper threads park: a condition variable with a sleeper count, so that wakers skip
// the lock when nobody sleeps.
struct Park {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};

  void wakeAll();
};

// One request slot; a Request handed to the caller.
struct Slot : Request {
  CommCore* owner = nullptr;
  uint8_t* data = nullptr;
  uint64_t size = 0;      // send: message size; recv: capacity until done, then real size
  uint64_t capacity = 0;  // recv: posted capacity
  uint64_t seq = 0;
  uint64_t chunk = 0;    // send: chunk size (0 when inline)
  uint64_t nChunks = 0;  // send: chunks of the message
  uint64_t rrBase = 0;   // send, round-robin schedule: global index of the first chunk
  int64_t postNs = 0;    // send: steady clock at isend (the wake-up measurement's start)
  // send, dynamic schedule: streams [0, active) may claim its chunks. Atomic because idle data
  // threads peek at it (unlocked) in their wake-up predicate while the caller may reuse the slot.
  std::atomic<int> active{0};
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
  // Progress the caller's thread may make on the control stream inside test() (non-blocking),
  // while the request is not done.
  virtual void callerProgress() {}
  // Every test(), before any progress: the caller is polling.
  virtual void callerPolled() {}
  int nStreams() const { return static_cast<int>(data_.size()); }
  const SocketAddress& peer() const { return peer_; }
  // getpeername of every data stream.
  std::vector<SocketAddress> dataPeers() const;
  void setNotifier(Notifier* notifier) { notifier_.store(notifier, std::memory_order_release); }
  // Fails the comm with `status` and shuts its sockets down (threads keep running until the
  // destructor; they see errors or end of stream and stop on their own).
  void abortNow(Status status);

 protected:
  // Starts the helper threads: controlLoop() on bagua-net-{s,r}c and dataLoop(i) on
  // bagua-net-{s,r}i for every data stream. Called last in the derived constructor (the loops
  // are the derived class's).
  void startThreads();
  // Stops and joins the helper threads (called by the derived destructor first, so that no loop
  // runs on a half-destroyed comm).
  void stopThreads();
  virtual void controlLoop() = 0;
  virtual void dataLoop(int stream) = 0;
  void fail(Status status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure();
  // Adds `delta` to the slot's remaining count; marks it done when it reaches zero.
  void contribute(Slot* slot, int64_t delta);
  // Waits until pred() holds or the comm stops; false when stopping.
  template <typename Pred>
  bool waitUntil(Pred pred, Park& park);
  // Wakes every parked thread (new receive posted, failure, stop).
  void wake();
  // Bumps the caller's Notifier, if any (a request completed, the comm failed, a stream closed).
  void signal() {
    if (Notifier* n = notifier_.load(std::memory_order_acquire)) {
      n->notify();
    }
  }
  // Handles an I/O error of a helper thread: quiet while stopping, else fails the comm.
  void ioError(Status status, const char* where, int stream);

  EngineOptions options_;
  SocketAddress peer_;
  bool sender_;
  Fd control_;
  std::vector<Fd> data_;
  Slot slots_[kSlots];
  std::atomic<uint64_t> posted_{0};     // messages posted by the caller (next sequence)
  std::atomic<uint64_t> completed_{0};  // requests that reached done (contribute)
  std::atomic<bool> stopping_{false};
  std::atomic<bool> failed_{false};
  std::atomic<int> closedStreams_{0};  // receive side: streams that ended cleanly
  std::mutex errorMu_;
  Status error_;  // guarded by errorMu_
  Park park_;     // control thread; receive threads waiting for an irecv
  // Send data threads waiting for chunks, one Park per stream (so that isend wakes only the
  // active ones); stop and failure wake them all.
  std::unique_ptr<Park[]> dataParks_;
  void wakeDataParks();
  std::vector<std::jthread> threads_;
  std::atomic<Notifier*> notifier_{nullptr};
};

// Spins for spinUs, then parks on `park` (bounded re-checks every parkRecheckMs: a missed wake-up
// costs at most that).
template <typename Pred>
bool CommCore::waitUntil(Pred pred, Park& park) {
  if (pred()) {
    return true;
  }
  auto spinEnd = std::chrono::steady_clock::now() + std::chrono::microseconds(options_.spinUs);
  int spins = 0;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (pred()) {
      return true;
    }
    cpuRelax();
    if (++spins % 64 == 0 && std::chrono::steady_clock::now() >= spinEnd) {
      break;
    }
  }
  std::unique_lock<std::mutex> lock(park.mu);
  park.sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (!pred() && !stopping_.load(std::memory_order_seq_cst)) {
    park.cv.wait_for(lock, std::chrono::milliseconds(options_.parkRecheckMs));
  }
  park.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return !stopping_.load(std::memory_order_acquire);
}

struct SendComm::Impl : public CommCore {
 public:
  Impl(Fd control, std::vector<Fd> data, const EngineOptions& options, SocketAddress peer);
  ~Impl() override;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Result<Request*> isend(const void* data, size_t size);
  std::vector<uint64_t> bytesPerStream() const;
  std::vector<uint64_t> chunksPerStream() const;
  uint64_t chunksPosted() const { return rrCursor_; }
  const MessagePlan& lastPlan() const { return lastPlan_; }
  void seedMeasurements(double wakeSeconds, double streamBytesPerSecond);
  Status setLive(const LiveSettings& settings);
  // The comm's, else the process's, else the options' values; activeStreams in [1, nStreams()].
  // *floorSet (optional): a live minimum chunk is set (it pins the fixed chunk rule).
  LiveSettings resolveLive(bool* floorSet = nullptr) const;

 private:
  void controlLoop() override;
  void dataLoop(int stream) override;
  void roundRobinLoop(int stream);
  // Sends one chunk on `stream`, counts its bytes and contributes them to the slot; false after a
  // failure (reported through ioError).
  bool sendChunk(int stream, Slot* slot, uint64_t offset, uint32_t length);
  // A chunk fully sent on `stream`: the rate sample (t0: when its send began, 0 for none), the
  // per-stream counters, and the slot's bytes (after which the slot may be recycled).
  void chunkSent(int stream, Slot* slot, uint32_t length, int64_t t0);
  // Chunk policy rule 7 (plan.callerSends): isend claims the message's chunk for a parked stream
  // among [0, active) whose lock it gets, and sends what the socket takes without blocking; the
  // stream's thread sends the rest. False when no such stream was free (the caller wakes one).
  bool callerSend(int active);
  // Finishes the chunk a caller left on `stream` (blocking); requires its StreamTx::mu.
  bool finishPending(int stream);
  // Claims the next chunk for `stream`; false when none is available to it now (no message, or
  // the message at the cursor has fewer active streams than stream + 1).
  bool claim(int stream, Slot** slot, uint64_t* offset, uint32_t* length);
  // Unlocked hint for a parked data thread: the cursor's message has a chunk `stream` may claim.
  bool claimable(int stream) const;
  // What the comm sees now for a message of `size` over `active` streams (the chunk policy's
  // input): unclaimed bytes, messages in flight, the measured rates and wake-up time.
  CommLoad observe(uint64_t size, int active, uint64_t seq) const;
  // Estimates the data threads keep (relaxed: a lost update only delays them). average: the mean
  // of the last ~8 samples. decayingMax: the largest recent sample, shrinking by a tenth per
  // sample, so a sample slowed by the thread being descheduled mid-send hardly moves it while a
  // stream slow for ~20 chunks in a row (paced, congested, a slow link) comes down to its rate.
  static void average(std::atomic<double>& avg, double sample);
  static void decayingMax(std::atomic<double>& max, double sample);
  // Chunks a stream must have sent before its rate is reported to the chunk policy.
  static constexpr uint64_t kRateSamples = 8;
  // Wakes up to `chunks` parked data threads among streams [0, streams).
  void wakeData(int streams, uint64_t chunks);

  // Sends what it can of the pending control records; requires ctrlMu_. Non-blocking unless
  // `blocking`.
  Status pumpControl(bool blocking);
  void callerProgress() override;

  // Control stream: written by the caller (isend fast path, try_lock) or the control thread.
  std::mutex ctrlMu_;
  uint64_t ctrlSeq_ = 0;               // guarded by ctrlMu_: next record to (finish) sending
  size_t ctrlSent_ = 0;                // guarded by ctrlMu_: bytes of it already sent
  std::atomic<uint64_t> ctrlDone_{0};  // mirrors ctrlSeq_ for lock-free checks
  // Who writes a data stream: its thread, or isend for a caller-sent chunk (rule 7). mu is held
  // while a chunk goes out (isend only try_locks it); the chunk a non-blocking caller send left
  // unfinished waits in slot/offset/length/sent for the stream's thread. Taken before claimMu_.
  struct StreamTx {
    std::mutex mu;
    Slot* slot = nullptr;  // guarded by mu: the unfinished chunk, if any
    uint64_t offset = 0;
    uint32_t length = 0;
    size_t sent = 0;  // of header + payload
    uint8_t header[32] = {};
    std::atomic<bool> pending{false};  // slot != nullptr, for the parked thread's predicate
  };
  std::unique_ptr<StreamTx[]> tx_;
  std::mutex claimMu_;
  std::atomic<uint64_t> claimSeq_{0};  // written under claimMu_
  uint64_t claimOffset_ = 0;           // guarded by claimMu_
  uint64_t rrCursor_ = 0;              // caller thread: chunks posted so far (round-robin base)
  std::atomic<uint64_t> streamBytes_[kMaxStreams] = {};   // payload per data stream (stats)
  std::atomic<uint64_t> streamChunks_[kMaxStreams] = {};  // chunks per data stream (stats)
  LiveCell live_;                                         // this comm's override
  // Chunk policy inputs. postedBytes_: bytes of chunked messages posted (caller's thread);
  // claimedBytes_: of those, claimed by a data thread (under claimMu_).
  uint64_t postedBytes_ = 0;
  std::atomic<uint64_t> claimedBytes_{0};
  // Per data stream, payload bytes/s while sending a chunk (decayingMax); the post-to-first-chunk
  // time of a parked stream (seconds, average). 0 until measured.
  std::atomic<double> streamRate_[kMaxStreams] = {};
  std::atomic<uint64_t> rateSamples_[kMaxStreams] = {};
  std::atomic<double> wakeSeconds_{0};
  MessagePlan lastPlan_;         // caller's thread
  uint64_t callerSendTurn_ = 0;  // caller's thread: messages rule 7 applied to
  static constexpr uint64_t kRemeasureEvery = 16;
  // Caller's thread: messages per PlanReason, their chunks, caller-sent chunks (the summary that
  // logPlanSummary writes at debug level when the comm closes).
  std::array<uint64_t, 6> planCounts_{};
  uint64_t planChunks_ = 0;
  uint64_t callerSent_ = 0;
  void logPlanSummary() const;
};

struct RecvComm::Impl : public CommCore {
 public:
  Impl(Fd control, std::vector<Fd> data, const EngineOptions& options, SocketAddress peer);
  ~Impl() override;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Result<Request*> irecv(void* data, size_t capacity);

 private:
  void controlLoop() override;
  void dataLoop(int stream) override;
  // Waits until the receive for `seq` is posted; nullptr when stopping.
  Slot* waitPosted(uint64_t seq);
  // Reads what is available of the control stream (non-blocking); requires ctrlMu_. Sets
  // *waitingForPost when a record waits for its irecv.
  Status pumpControl(bool* waitingForPost);
  void callerProgress() override;
  void callerPolled() override {
    callerSeenNs_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                        std::memory_order_relaxed);
  }

  // Control stream parse state, guarded by ctrlMu_ (the control thread or the caller's test()).
  std::mutex ctrlMu_;
  uint8_t ctrlBuf_[24] = {};
  size_t ctrlGot_ = 0;
  bool ctrlHave_ = false;  // a decoded record waits for its slot / inline bytes
  uint64_t ctrlRecSeq_ = 0;
  uint64_t ctrlRecSize_ = 0;
  uint32_t ctrlRecInline_ = 0;
  size_t ctrlInlineGot_ = 0;
  bool ctrlClosed_ = false;
  std::atomic<uint64_t> ctrlSeq_{0};  // next message whose record is expected
  // When the caller's test() last looked at the control stream (steady clock, ns). While that is
  // within kCallerGrace and no Notifier is set (NCCL polls test() on every outstanding request),
  // the control thread stays off the socket: otherwise poll(2) woke it on every record, one
  // context switch per message that the caller's own read made useless.
  std::atomic<int64_t> callerSeenNs_{0};
  static constexpr std::chrono::milliseconds kCallerGrace{2};
  Status truncation(const Slot* slot, uint64_t needed, const char* what);
};

}  // namespace bagua::net
