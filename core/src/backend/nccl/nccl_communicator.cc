#include "backend/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "bagua/base/cuda_check.h"
#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/params.h"

namespace bagua::core::nccl {

namespace {

using Clock = std::chrono::steady_clock;

// Completion events are pooled in a ring indexed by the operation's sequence number: operation s
// records slot s % kEventRing, which is reused only once operation s - kEventRing is known to be
// complete. More operations in flight than this makes the issuer wait (bounded) for the oldest,
// like CUDA's own launch queue does.
constexpr uint64_t kEventRing = 1024;
// Work::wait spins on cudaEventQuery this long (a 64 MiB all-reduce over NVLink takes ~260 us),
// then sleeps in naps of 1/32 of the time waited so far (20..200 us): the added latency stays a
// few percent of the operation and long collectives do not burn a core.
constexpr auto kSpinBudget = std::chrono::microseconds(2000);
constexpr auto kMinNap = std::chrono::microseconds(20);
constexpr auto kMaxNap = std::chrono::microseconds(200);
// The watchdog's period: how late a timeout or an NCCL async error is acted on.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(10);
// How long abort waits for a launch to leave NCCL before aborting under it.
constexpr auto kAbortLaunchGrace = std::chrono::milliseconds(1000);

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void fetchMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v &&
         !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
}

// NCCL_COMM_BLOCKING=0 in the environment overrides config.blocking; then NCCL calls may return
// ncclInProgress. Polls (bounded) until NCCL has settled; ncclInProgress if the deadline passed.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline) {
  while (r == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) {
      return ncclInternalError;
    }
    if (state != ncclInProgress) {
      return state;
    }
    if (Clock::now() >= deadline) {
      return ncclInProgress;
    }
    std::this_thread::yield();
  }
  return r;
}

ncclDataType_t toNccl(DataType t) {
  switch (t) {
  case DataType::kF32:
    return ncclFloat32;
  case DataType::kF16:
    return ncclFloat16;
  case DataType::kBF16:
    return ncclBfloat16;
  case DataType::kF64:
    return ncclFloat64;
  case DataType::kI32:
    return ncclInt32;
  case DataType::kI64:
    return ncclInt64;
  case DataType::kU8:
    return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t toNccl(ReduceOp op) {
  switch (op) {
  case ReduceOp::kSum:
    return ncclSum;
  case ReduceOp::kAvg:
    return ncclAvg;
  case ReduceOp::kMin:
    return ncclMin;
  case ReduceOp::kMax:
    return ncclMax;
  case ReduceOp::kProduct:
    return ncclProd;
  }
  return ncclSum;
}

class NcclCommunicator;

// One issued operation: its sequence number on the communicator. Completion is read from the
// pooled event (or from the communicator's completed-sequence mark, which covers slot reuse).
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, uint64_t seq, const char* name)
      : comm_(comm), seq_(seq), name_(name) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  bool test() override;
  Status wait(std::chrono::milliseconds timeout) override;
  Status status() override;

 private:
  NcclCommunicator* comm_;
  const uint64_t seq_;
  const char* name_;  // a string literal
  std::atomic<bool> done_{false};
  std::mutex mu_;  // guards status_ while the first finisher writes it
  Status status_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, ncclComm_t comm, cudaStream_t stream,
                   void* scratch, std::unique_ptr<cudaEvent_t[]> events,
                   std::chrono::milliseconds timeout)
      : rank_(rank),
        size_(size),
        device_(device),
        comm_(comm),
        stream_(stream),
        scratch_(scratch),
        events_(std::move(events)),
        slots_(new Slot[kEventRing]),
        timeout_(timeout) {
    watchdog_ = std::jthread([this](std::stop_token st) { watchdogLoop(st); });
  }

  ~NcclCommunicator() override {
    watchdog_.request_stop();
    if (watchdog_.joinable()) {
      watchdog_.join();
    }
    int callerDevice = -1;
    if (cudaGetDevice(&callerDevice) != cudaSuccess) {
      callerDevice = -1;
    }
    cudaSetDevice(device_);
    // Blocking mode: ncclCommFinalize waits for NCCL's own streams and proxies, so it runs only
    // once everything we issued has completed and NCCL reports no error; otherwise (a peer gone
    // mid-collective) the communicator is aborted, which never waits for peers.
    // Released with ncclCommAbort even when clean: ncclCommDestroy joins NCCL's proxy thread,
    // which serves until every peer on this host has closed its connections to it, i.e. has
    // destroyed its own communicator too. Ranks do not drop a communicator at the same moment
    // (Python frees a wrapped model, and its algorithm's groups, when its garbage collector runs),
    // so destroy blocked a rank until its peers dropped theirs while they waited for it in the
    // next collective (on 2 GPUs: decentralized's exchange group, then a 30 s timeout). Abort
    // closes those connections itself (cuMem, NCCL's default from driver 12.6) and, after the
    // drain and the finalize, loses nothing.
    const bool drained = !ncclAborted_ && drain(Clock::now() + timeout_);
    if (!ncclAborted_) {  // drain() aborts on a CUDA error
      ncclResult_t async = ncclSuccess;
      const bool healthy =
          drained && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async == ncclSuccess;
      ncclResult_t r = healthy ? ncclCommFinalize(comm_) : ncclInternalError;
      r = healthy ? settle(comm_, r, Clock::now() + timeout_) : r;  // finalized before the abort
      if (!(healthy && r == ncclSuccess)) {
        BAGUA_LOG_WARN(kLogCore, "rank %d: NCCL communicator not clean at close (%s); aborting it",
                       rank_,
                       !drained   ? "operations still running"
                       : !healthy ? ncclGetErrorString(async)
                                  : ncclGetErrorString(r));
      }
      ncclCommAbort(comm_);
    }
    for (uint64_t i = 0; i < kEventRing; ++i) {
      cudaEventDestroy(events_[i]);
    }
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    if (callerDevice >= 0 && callerDevice != device_) {
      cudaSetDevice(callerDevice);
    }
    (void)cudaGetLastError();
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backendName() const override { return "nccl"; }

  void abort(const std::string& why) override { abortImpl(StatusCode::kAborted, why, false); }
  // A waiter's deadline at or past the collective timeout ran out.
  void abortTimedOut(const std::string& why) {
    abortImpl(StatusCode::kDeadlineExceeded, why, false);
  }
  CommStats stats() const override {
    CommStats s;
    s.bytesSent = bytes_.load(std::memory_order_relaxed);
    s.operations = ops_.load(std::memory_order_relaxed);
    return s;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Stream ordering (Communicator::afterEvent / orderStream), under issueMu_ so that each takes
  // its place between launches. orderStream() needs no event of its own: the ring slot of the
  // last issued operation was recorded right behind it, and cudaStreamWaitEvent captures that
  // record (the slot is recorded again only kEventRing launches later).
  Status afterEvent(CUevent_st* event) override {
    std::unique_lock<std::timed_mutex> lock(issueMu_, std::defer_lock);
    if (!lock.try_lock_for(timeout_ + kAbortLaunchGrace)) {
      return BAGUA_ERROR(kDeadlineExceeded, "rank %d: afterEvent: a launch held the communicator",
                         rank_);
    }
    if (cudaSetDevice(device_) != cudaSuccess) {
      (void)cudaGetLastError();
      return BAGUA_ERROR(kCudaError, "afterEvent: cudaSetDevice(%d) failed", device_);
    }
    return cudaStatus(cudaStreamWaitEvent(stream_, event, 0), "afterEvent: cudaStreamWaitEvent");
  }
  Status orderStream(CUstream_st* stream) override {
    std::unique_lock<std::timed_mutex> lock(issueMu_, std::defer_lock);
    if (!lock.try_lock_for(timeout_ + kAbortLaunchGrace)) {
      return BAGUA_ERROR(kDeadlineExceeded, "rank %d: orderStream: a launch held the communicator",
                         rank_);
    }
    const uint64_t seq = issuedSeq_.load(std::memory_order_relaxed);
    if (seq == 0) {
      return Status::ok();
    }
    return cudaStatus(cudaStreamWaitEvent(stream, events_[seq % kEventRing], 0),
                      "orderStream: cudaStreamWaitEvent");
  }

  // Completion of operation `seq`: true with *status set once it has finished (successfully, or
  // failed because the communicator was aborted first), false while it runs. Any thread; takes
  // no lock and calls no NCCL function unless a CUDA error makes it abort the communicator
  // (haveIssueLock: the caller holds issueMu_).
  bool poll(uint64_t seq, const char* name, Status* status, bool haveIssueLock = false) {
    if (completedSeq_.load(std::memory_order_acquire) >= seq) {
      *status = Status::ok();
      return true;
    }
    if (aborted_.load(std::memory_order_acquire)) {
      *status = abortedStatus(name, seq);
      return true;
    }
    const cudaError_t e = cudaEventQuery(events_[seq % kEventRing]);
    if (e == cudaErrorNotReady) {
      return false;
    }
    if (e != cudaSuccess) {
      abortImpl(StatusCode::kCudaError,
                cudaStatus(e, strPrintf("%s #%llu: cudaEventQuery", name,
                                        static_cast<unsigned long long>(seq)))
                    .message(),
                haveIssueLock);
      *status = abortedStatus(name, seq);
      return true;
    }
    // The event fired. An abort also ends the kernels early, so check the flag after the query:
    // an abort that completed the event set it before.
    if (aborted_.load(std::memory_order_seq_cst)) {
      *status = abortedStatus(name, seq);
      return true;
    }
    fetchMax(completedSeq_, seq);
    *status = Status::ok();
    return true;
  }

  WorkPtr allReduce(const void* send, void* recv, size_t count, DataType dtype,
                    ReduceOp op) override {
    return issue("allReduce", count * dataTypeSize(dtype), [&] {
      return ncclAllReduce(send, recv, count, toNccl(dtype), toNccl(op), comm_, stream_);
    });
  }
  WorkPtr reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                 int root) override {
    return issue("reduce", count * dataTypeSize(dtype), [&] {
      return ncclReduce(send, recv, count, toNccl(dtype), toNccl(op), root, comm_, stream_);
    });
  }
  WorkPtr reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                        ReduceOp op) override {
    return issue("reduceScatter", count * size_ * dataTypeSize(dtype), [&] {
      return ncclReduceScatter(send, recv, count, toNccl(dtype), toNccl(op), comm_, stream_);
    });
  }
  WorkPtr allGather(const void* send, void* recv, size_t count, DataType dtype) override {
    return issue("allGather", count * dataTypeSize(dtype),
                 [&] { return ncclAllGather(send, recv, count, toNccl(dtype), comm_, stream_); });
  }
  WorkPtr broadcast(void* buffer, size_t count, DataType dtype, int root) override {
    return issue("broadcast", count * dataTypeSize(dtype), [&] {
      return ncclBroadcast(buffer, buffer, count, toNccl(dtype), root, comm_, stream_);
    });
  }
  WorkPtr allToAll(const void* send, void* recv, size_t count, DataType dtype) override {
    const size_t block = count * dataTypeSize(dtype);
    return issue("allToAll", block * size_, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        r = ncclSend(static_cast<const uint8_t*>(send) + p * block, count, toNccl(dtype), p, comm_,
                     stream_);
        if (r == ncclSuccess) {
          r = ncclRecv(static_cast<uint8_t*>(recv) + p * block, count, toNccl(dtype), p, comm_,
                       stream_);
        }
      }
      ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  WorkPtr send(const void* buffer, size_t count, DataType dtype, int peer) override {
    return issue("send", count * dataTypeSize(dtype),
                 [&] { return ncclSend(buffer, count, toNccl(dtype), peer, comm_, stream_); });
  }
  WorkPtr recv(void* buffer, size_t count, DataType dtype, int peer) override {
    return issue("recv", 0,
                 [&] { return ncclRecv(buffer, count, toNccl(dtype), peer, comm_, stream_); });
  }
  WorkPtr sendRecv(const void* sendBuf, size_t sendCount, int sendPeer, void* recvBuf,
                   size_t recvCount, int recvPeer, DataType dtype) override {
    return issue("sendRecv", sendCount * dataTypeSize(dtype), [&] {
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess && sendPeer >= 0) {
        r = ncclSend(sendBuf, sendCount, toNccl(dtype), sendPeer, comm_, stream_);
      }
      if (r == ncclSuccess && recvPeer >= 0) {
        r = ncclRecv(recvBuf, recvCount, toNccl(dtype), recvPeer, comm_, stream_);
      }
      ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  WorkPtr barrier() override {
    return issue("barrier", 4, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

 private:
  // Per event slot: when and what was issued last on it (read by the watchdog).
  struct Slot {
    std::atomic<int64_t> issuedNs{0};
    std::atomic<const char*> name{""};
  };

  Status abortedStatus(const char* name, uint64_t seq) const {
    // abortWhy_ and abortCode_ are written once, before aborted_ is released.
    return Status(abortCode_,
                  strPrintf("rank %d: %s #%llu: the NCCL communicator was aborted: %s", rank_, name,
                            static_cast<unsigned long long>(seq), abortWhy_.c_str()),
                  __FILE__, __LINE__);
  }

  // The launch path: one issuing thread at a time (NCCL's rule for a communicator), blocking
  // NCCL mode so the enqueue happens on this thread with no helper thread and no polling, then
  // one pooled event recorded behind it. No allocation but the Work itself.
  template <typename F>
  WorkPtr issue(const char* name, size_t bytes, F&& call) {
    std::unique_lock<std::timed_mutex> lock(issueMu_, std::defer_lock);
    if (!lock.try_lock_for(timeout_ + kAbortLaunchGrace)) {
      return completedWork(BAGUA_ERROR(kDeadlineExceeded,
                                       "rank %d: %s: another launch held the NCCL communicator "
                                       "for longer than the collective timeout (%lld ms)",
                                       rank_, name, static_cast<long long>(timeout_.count())));
    }
    if (aborted_.load(std::memory_order_acquire)) {
      return completedWork(abortedStatus(name, issuedSeq_.load(std::memory_order_relaxed) + 1));
    }
    if (cudaSetDevice(device_) != cudaSuccess) {
      (void)cudaGetLastError();
      return completedWork(BAGUA_ERROR(kCudaError, "%s: cudaSetDevice(%d) failed", name, device_));
    }
    const uint64_t seq = issuedSeq_.load(std::memory_order_relaxed) + 1;
    const uint64_t slot = seq % kEventRing;
    if (seq > kEventRing) {
      Status s = waitSlotFree(seq - kEventRing, name);
      if (!s.isOk()) {
        return completedWork(std::move(s));
      }
    }
    launchStartNs_.store(nowNs(), std::memory_order_release);
    ncclResult_t r = call();
    if (r == ncclInProgress) {
      std::lock_guard<std::mutex> nccl(commMu_);  // the watchdog polls the same state
      r = settle(comm_, r, Clock::now() + timeout_);
    }
    launchStartNs_.store(0, std::memory_order_release);
    if (r != ncclSuccess) {
      if (aborted_.load(std::memory_order_acquire)) {
        return completedWork(abortedStatus(name, seq));  // aborted under this launch
      }
      const std::string why = strPrintf("%s #%llu failed to launch: %s (%s)", name,
                                        static_cast<unsigned long long>(seq), ncclGetErrorString(r),
                                        ncclGetLastError(comm_));
      abortImpl(StatusCode::kNcclError, why, true);
      return completedWork(BAGUA_ERROR(kNcclError, "rank %d: %s", rank_, why.c_str()));
    }
    const cudaError_t e = cudaEventRecord(events_[slot], stream_);
    if (e != cudaSuccess) {
      const std::string why = cudaStatus(e, strPrintf("%s #%llu: recording its completion event",
                                                      name, static_cast<unsigned long long>(seq)))
                                  .message();
      abortImpl(StatusCode::kCudaError, why, true);
      return completedWork(BAGUA_ERROR(kCudaError, "rank %d: %s", rank_, why.c_str()));
    }
    slots_[slot].issuedNs.store(nowNs(), std::memory_order_relaxed);
    slots_[slot].name.store(name, std::memory_order_relaxed);
    issuedSeq_.store(seq, std::memory_order_release);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    ops_.fetch_add(1, std::memory_order_relaxed);
    return std::make_shared<NcclWork>(this, seq, name);
  }

  // Waits (bounded by the collective timeout) until operation `seq` has completed, so that its
  // event slot can be recorded again. Requires issueMu_.
  Status waitSlotFree(uint64_t seq, const char* name) {
    const auto deadline = Clock::now() + timeout_;
    Status st;
    while (!poll(seq, name, &st, /*haveIssueLock=*/true)) {
      if (Clock::now() >= deadline) {
        const std::string why = strPrintf(
            "%llu operations in flight and the oldest (#%llu) did not finish within "
            "the collective timeout (%lld ms)",
            static_cast<unsigned long long>(kEventRing), static_cast<unsigned long long>(seq),
            static_cast<long long>(timeout_.count()));
        abortImpl(StatusCode::kDeadlineExceeded, why, true);
        return BAGUA_ERROR(kDeadlineExceeded, "rank %d: %s: %s", rank_, name, why.c_str());
      }
      std::this_thread::sleep_for(kMinNap);
    }
    return st;
  }

  // Waits (bounded) until everything issued has completed. True if it did.
  bool drain(Clock::time_point deadline) {
    const uint64_t last = issuedSeq_.load(std::memory_order_acquire);
    Status st;
    while (last > 0 && !poll(last, "close", &st)) {
      if (Clock::now() >= deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return st.isOk();
  }

  // Marks the communicator broken (first caller wins; later calls return at once) and aborts
  // the NCCL communicator, which makes running kernels quit. ncclCommAbort must not run while
  // another thread is inside an NCCL call on this communicator, so it waits for the launch
  // lock (haveIssueLock: the caller holds it) and for commMu_ (the watchdog's NCCL calls). A
  // launch that has not left NCCL after kAbortLaunchGrace (a peer that never joins a first
  // collective's connection set-up) is aborted under: NCCL's abort flag is what unblocks it.
  void abortImpl(StatusCode code, const std::string& why, bool haveIssueLock) {
    bool expected = false;
    if (!abortClaimed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      return;
    }
    abortWhy_ = why;
    abortCode_ = code;
    aborted_.store(true, std::memory_order_seq_cst);
    BAGUA_LOG_WARN(kLogCore, "rank %d: aborting NCCL communicator: %s", rank_, why.c_str());
    std::unique_lock<std::timed_mutex> launch(issueMu_, std::defer_lock);
    if (!haveIssueLock && !launch.try_lock_for(kAbortLaunchGrace)) {
      BAGUA_LOG_WARN(kLogCore,
                     "rank %d: an NCCL launch has not returned for %lld ms; aborting under it",
                     rank_, static_cast<long long>(kAbortLaunchGrace.count()));
    }
    std::lock_guard<std::mutex> nccl(commMu_);
    ncclCommAbort(comm_);
    ncclAborted_ = true;
  }

  // The watchdog (thread "bagua-nccl-wd"): every kWatchdogPeriod it polls NCCL's async error
  // state and the oldest unfinished operation; it aborts the communicator on an async error,
  // when no operation has completed for the collective timeout, or when a launch has been inside
  // NCCL that long. It never takes issueMu_, so a stuck launch cannot stall it.
  void watchdogLoop(const std::stop_token& st) {
    setThreadName("bagua-nccl-wd");
    if (cudaSetDevice(device_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    std::mutex m;
    std::condition_variable_any cv;
    uint64_t seenDone = 0;
    int64_t progressNs = nowNs();
    const int64_t timeoutNs = std::chrono::nanoseconds(timeout_).count();
    while (!st.stop_requested()) {
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait_for(lk, st, kWatchdogPeriod, [] { return false; });
      }
      if (st.stop_requested() || aborted_.load(std::memory_order_acquire)) {
        continue;
      }
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclSuccess;
      {
        std::lock_guard<std::mutex> nccl(commMu_);
        if (!ncclAborted_) {
          r = ncclCommGetAsyncError(comm_, &async);
        }
      }
      if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        const ncclResult_t bad = r != ncclSuccess ? r : async;
        abortImpl(bad == ncclRemoteError ? StatusCode::kRemoteError : StatusCode::kNcclError,
                  strPrintf("NCCL reported %s", ncclGetErrorString(bad)), false);
        continue;
      }
      const int64_t now = nowNs();
      const uint64_t issued = issuedSeq_.load(std::memory_order_acquire);
      uint64_t done = completedSeq_.load(std::memory_order_acquire);
      Status ignored;
      if (done < issued && poll(issued, "watchdog", &ignored)) {
        done = issued;  // in-order stream: the newest done means all are
      }
      while (done < issued && poll(done + 1, "watchdog", &ignored)) {
        ++done;
      }
      done = std::max(done, completedSeq_.load(std::memory_order_acquire));
      if (done != seenDone || done >= issued) {
        seenDone = done;
        progressNs = now;
      }
      if (done < issued) {
        const Slot& oldest = slots_[(done + 1) % kEventRing];
        const int64_t since = std::max(progressNs, oldest.issuedNs.load(std::memory_order_relaxed));
        if (now - since > timeoutNs) {
          abortImpl(StatusCode::kDeadlineExceeded,
                    strPrintf("%s #%llu made no progress within the collective timeout (%lld ms; "
                              "BAGUA_COLLECTIVE_TIMEOUT_MS): a peer is gone or did not issue it",
                              oldest.name.load(std::memory_order_relaxed),
                              static_cast<unsigned long long>(done + 1),
                              static_cast<long long>(timeout_.count())),
                    false);
          continue;
        }
      }
      const int64_t launchNs = launchStartNs_.load(std::memory_order_acquire);
      if (launchNs != 0 && now - launchNs > timeoutNs) {
        abortImpl(StatusCode::kDeadlineExceeded,
                  strPrintf("a launch has been inside NCCL for longer than the collective "
                            "timeout (%lld ms): a peer is gone or did not issue the operation",
                            static_cast<long long>(timeout_.count())),
                  false);
      }
    }
  }

  const int rank_;
  const int size_;
  const int device_;
  ncclComm_t const comm_;
  cudaStream_t const stream_;
  void* const scratch_;  // the barrier's 4-byte all-reduce
  const std::unique_ptr<cudaEvent_t[]> events_;
  const std::unique_ptr<Slot[]> slots_;
  const std::chrono::milliseconds timeout_;

  // Lock order: issueMu_ before commMu_.
  std::timed_mutex issueMu_;  // held across one launch (issue)
  std::mutex commMu_;         // the watchdog's NCCL calls against ncclCommAbort
  bool ncclAborted_ = false;  // guarded by commMu_ (read without it once the watchdog stopped)

  std::atomic<uint64_t> issuedSeq_{0};     // last sequence number issued (written under issueMu_)
  std::atomic<uint64_t> completedSeq_{0};  // every operation up to this one has completed
  std::atomic<int64_t> launchStartNs_{0};  // non-zero while a launch is inside NCCL

  std::atomic<bool> abortClaimed_{false};
  std::atomic<bool> aborted_{false};
  StatusCode abortCode_ = StatusCode::kAborted;  // written once before aborted_ is released
  std::string abortWhy_;                         // same

  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> ops_{0};
  std::jthread watchdog_;  // last: started once everything above exists
};

bool NcclWork::test() {
  if (done_.load(std::memory_order_acquire)) {
    return true;
  }
  Status s;
  if (!comm_->poll(seq_, name_, &s)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_relaxed)) {
    status_ = std::move(s);
    done_.store(true, std::memory_order_release);
  }
  return true;
}

Status NcclWork::wait(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  while (!test()) {
    const auto now = Clock::now();
    if (now >= deadline) {
      if (timeout >= comm_->timeout()) {
        comm_->abortTimedOut(strPrintf("%s #%llu exceeded the collective timeout (%lld ms)", name_,
                                       static_cast<unsigned long long>(seq_),
                                       static_cast<long long>(comm_->timeout().count())));
      }
      return BAGUA_ERROR(kDeadlineExceeded, "%s still running after %lld ms", name_,
                         static_cast<long long>(timeout.count()));
    }
    const auto waited = now - start;
    if (waited < kSpinBudget) {
      continue;  // spin on the event: the completion is likely microseconds away
    }
    auto nap = std::chrono::duration_cast<std::chrono::microseconds>(waited / 32);
    nap = std::clamp(nap, std::chrono::microseconds(kMinNap), std::chrono::microseconds(kMaxNap));
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

Status NcclWork::status() {
  if (!test()) {
    return BAGUA_ERROR(kFailedPrecondition, "%s has not finished", name_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

// Every rank announces itself before NCCL's (blocking) init, so a rank that never arrives is a
// bounded DeadlineExceeded naming it instead of a hang inside NCCL's bootstrap.
Status arrivalBarrier(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  BAGUA_RETURN_IF_ERROR(store.set(strPrintf("nccl/arrived/%d", rank), Bytes{1}));
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    keys.push_back(strPrintf("nccl/arrived/%d", r));
  }
  Status s = store.wait(keys, timeout);
  if (s.isOk()) {
    return s;
  }
  std::string missing;
  for (int r = 0; r < size; ++r) {
    Result<bool> there = store.check(keys[static_cast<size_t>(r)]);
    if (there.isOk() && !*there) {
      missing += (missing.empty() ? "" : ",") + std::to_string(r);
    }
  }
  return BAGUA_ERROR(kDeadlineExceeded,
                     "rank %d: NCCL init: rank(s) %s did not arrive within %lld ms (%s)", rank,
                     missing.empty() ? "?" : missing.c_str(),
                     static_cast<long long>(timeout.count()), s.toString().c_str());
}

}  // namespace

int visibleCudaDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Result<std::unique_ptr<Communicator>> createNcclCommunicator(Store& store, int rank, int size,
                                                             const ProcessGroupOptions& options) {
  const int devices = visibleCudaDevices();
  const int device = options.cudaDevice >= 0 ? options.cudaDevice : options.localRank;
  if (device < 0 || device >= devices) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "NCCL backend: rank %d wants CUDA device %d but %d device(s) are visible",
                       rank, device, devices);
  }
  // Before the rendezvous: a bad value fails every rank here, none waits for it.
  BAGUA_ASSIGN_OR_RETURN(const std::string priority, coreParams().ncclStreamPriority.get());
  BAGUA_CHECK_CUDA(cudaSetDevice(device));
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return BAGUA_ERROR(kNcclError, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    Bytes b(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id));
    BAGUA_RETURN_IF_ERROR(store.set("nccl/id", b));
  } else {
    BAGUA_ASSIGN_OR_RETURN(Bytes b, store.get("nccl/id", options.rendezvousTimeout));
    if (b.size() != sizeof(id)) {
      return BAGUA_ERROR(kRemoteError, "NCCL unique id from the store has %zu bytes, not %zu",
                         b.size(), sizeof(id));
    }
    std::memcpy(&id, b.data(), sizeof(id));
  }
  BAGUA_RETURN_IF_ERROR(arrivalBarrier(store, rank, size, options.rendezvousTimeout));

  // CUDA resources first, so that a failure here leaves no NCCL communicator behind.
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  auto events = std::make_unique<cudaEvent_t[]>(kEventRing);
  uint64_t made = 0;
  auto freeCuda = [&] {
    for (uint64_t i = 0; i < made; ++i) {
      cudaEventDestroy(events[i]);
    }
    cudaFree(scratch);
    if (stream != nullptr) {
      cudaStreamDestroy(stream);
    }
    (void)cudaGetLastError();
  };
  int lo = 0, hi = 0;
  cudaError_t ce = cudaDeviceGetStreamPriorityRange(&lo, &hi);
  if (ce == cudaSuccess) {
    ce = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority == "high" ? hi : lo);
  }
  if (ce == cudaSuccess) {
    ce = cudaMalloc(&scratch, sizeof(int32_t));
  }
  if (ce == cudaSuccess) {
    ce = cudaMemset(scratch, 0, sizeof(int32_t));
  }
  for (; ce == cudaSuccess && made < kEventRing; ++made) {
    ce = cudaEventCreateWithFlags(&events[made], cudaEventDisableTiming);
    if (ce != cudaSuccess) {
      break;
    }
  }
  if (ce != cudaSuccess) {
    Status failed =
        cudaStatus(ce, strPrintf("rank %d: NCCL backend: CUDA set-up on device %d", rank, device),
                   __FILE__, __LINE__);
    freeCuda();
    return failed;
  }

  // Blocking mode: a non-blocking communicator runs every collective's launch on a helper
  // thread that NCCL creates per call, so every call would pay a thread's start. Timeouts are
  // the watchdog's job instead (see NcclCommunicator).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r == ncclInProgress) {
    BAGUA_LOG_WARN(kLogInit,
                   "rank %d: NCCL_COMM_BLOCKING=0 made the communicator non-blocking: every call "
                   "then starts a thread inside NCCL (slower)",
                   rank);
    r = settle(comm, r, Clock::now() + options.rendezvousTimeout);
  }
  if (r != ncclSuccess) {
    // NCCL's own words for it (its last WARN, e.g. "Duplicate GPU detected : rank 1 and rank 3
    // both on CUDA device 1b000"), which otherwise only NCCL_DEBUG=WARN shows.
    const char* last = ncclGetLastError(comm);
    const std::string detail = last != nullptr && *last != '\0' ? std::string(": ") + last : "";
    if (comm != nullptr) {
      ncclCommAbort(comm);
    }
    freeCuda();
    const char* hint = r != ncclInvalidUsage
                           ? ""
                           : " (two ranks of one host on one GPU? Each rank of a host needs its "
                             "own GPU: LOCAL_RANK, CUDA_VISIBLE_DEVICES; simulated nodes on one "
                             "machine need an NCCL_HOSTID each)";
    return BAGUA_ERROR(kNcclError, "rank %d: NCCL init of %d ranks on device %d failed: %s%s%s",
                       rank, size, device, ncclGetErrorString(r), detail.c_str(), hint);
  }
  BAGUA_LOG_INFO(kLogInit, "rank %d: NCCL communicator of %d ranks on device %d", rank, size,
                 device);
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      rank, size, device, comm, stream, scratch, std::move(events), options.collectiveTimeout));
}

}  // namespace bagua::core::nccl
