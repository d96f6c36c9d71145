// The comm core (CommCore): what send and receive comms share (helper-thread start and stop,
// failure, completion counting, parking, test()), and the Notifier. Thread model and locks:
// comm.h. The two sides: send_comm.cc, recv_comm.cc; the live settings: live_cell.cc.
#include "comm.h"

#include <sys/socket.h>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"

namespace bagua::net {

Status Request::test(bool* done, size_t* size) {
  auto* slot = static_cast<Slot*>(this);
  return slot->owner->testSlot(slot, done, size);
}

// ---- CommCore ----------------------------------------------------------------------------------

CommCore::CommCore(Fd control, std::vector<Fd> data, const EngineOptions& options,
                   SocketAddress peer, bool sender)
    : options_(options),
      peer_(peer),
      sender_(sender),
      control_(std::move(control)),
      data_(std::move(data)),
      dataParks_(std::make_unique<Park[]>(data_.size() + 1)) {
  for (Slot& s : slots_) {
    s.owner = this;
  }
}

CommCore::~CommCore() {
  stopThreads();
}

void CommCore::startThreads() {
  const char side = sender_ ? 's' : 'r';
  threads_.emplace_back([this, side] {
    setThreadName(strPrintf("bagua-net-%cc", side));
    controlLoop();
  });
  for (int i = 0; i < nStreams(); ++i) {
    threads_.emplace_back([this, side, i] {
      setThreadName(strPrintf("bagua-net-%c%d", side, i));
      dataLoop(i);
    });
  }
}

void CommCore::stopThreads() {
  stopping_.store(true, std::memory_order_seq_cst);
  for (std::jthread& t : threads_) {
    t.request_stop();
  }
  // Wakes threads blocked in send/recv; the fds stay open (and unique) until the members die.
  if (control_.valid()) {
    ::shutdown(control_.get(), SHUT_RDWR);
  }
  for (Fd& fd : data_) {
    if (fd.valid()) {
      ::shutdown(fd.get(), SHUT_RDWR);
    }
  }
  park_.wakeAll();
  wakeDataParks();
  for (std::jthread& t : threads_) {
    if (t.joinable()) {
      t.join();
    }
  }
  threads_.clear();
}

void CommCore::fail(Status status) {
  {
    std::lock_guard<std::mutex> lock(errorMu_);
    if (!failed_.load(std::memory_order_relaxed)) {
      error_ = std::move(status);
      failed_.store(true, std::memory_order_release);
      // An abort is the owner's decision (it knows why and says so); other failures warn.
      if (error_.code() == StatusCode::kAborted) {
        BAGUA_LOG_DEBUG(kLogNet, "%s comm with %s aborted: %s", sender_ ? "send" : "receive",
                        peer_.toString().c_str(), error_.toString().c_str());
      } else {
        BAGUA_LOG_WARN(kLogNet, "%s comm with %s failed: %s", sender_ ? "send" : "receive",
                       peer_.toString().c_str(), error_.toString().c_str());
      }
    }
  }
  wake();
  signal();
}

std::vector<SocketAddress> CommCore::dataPeers() const {
  std::vector<SocketAddress> out(data_.size());
  for (size_t i = 0; i < data_.size(); ++i) {
    socklen_t len = sizeof(out[i].storage);
    if (getpeername(data_[i].get(), reinterpret_cast<sockaddr*>(&out[i].storage), &len) == 0) {
      out[i].length = len;
    }
  }
  return out;
}

void CommCore::abortNow(Status status) {
  fail(std::move(status));
  if (control_.valid()) {
    ::shutdown(control_.get(), SHUT_RDWR);
  }
  for (Fd& fd : data_) {
    if (fd.valid()) {
      ::shutdown(fd.get(), SHUT_RDWR);
    }
  }
}

void Notifier::notify() {
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }  // as Park::wakeAll: ordered, then notified
    cv_.notify_all();
  }
}

void Notifier::waitChange(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  while (epoch_.load(std::memory_order_seq_cst) == seen &&
         std::chrono::steady_clock::now() < deadline) {
    cv_.wait_until(lock, deadline);
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

Status CommCore::failure() {
  std::lock_guard<std::mutex> lock(errorMu_);
  return error_;
}

void CommCore::ioError(Status status, const char* where, int stream) {
  if (stopping_.load(std::memory_order_acquire)) {
    return;
  }
  status.withContext(strPrintf("%s stream %d (%s, peer %s)", sender_ ? "send" : "receive", stream,
                               where, peer_.toString().c_str()));
  fail(std::move(status));
}

void CommCore::contribute(Slot* slot, int64_t delta) {
  int64_t before = slot->remaining.fetch_add(delta, std::memory_order_acq_rel);
  int64_t after = before + delta;
  if (after == 0) {
    completed_.fetch_add(1, std::memory_order_relaxed);
    slot->done.store(true, std::memory_order_release);
    signal();
  } else if (after < 0) {
    fail(BAGUA_ERROR(kRemoteError,
                     "peer sent more data than message %llu holds (protocol violation)",
                     static_cast<unsigned long long>(slot->seq)));
  }
}

void Park::wakeAll() {
  if (sleepers.load(std::memory_order_seq_cst) > 0) {
    // Taking the lock orders this wake-up after a sleeper's predicate check (no lost wake-up);
    // notifying after releasing it lets the woken thread take the lock at once instead of
    // waking only to block on it again.
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }
}

void CommCore::wake() {
  park_.wakeAll();
  wakeDataParks();
}

void CommCore::wakeDataParks() {
  for (size_t i = 0; i < data_.size(); ++i) {
    dataParks_[i].wakeAll();
  }
}

Status CommCore::testSlot(Slot* slot, bool* done, size_t* size) {
  *done = false;
  if (slot->stamp.load(std::memory_order_acquire) == 0) {
    return BAGUA_ERROR(kFailedPrecondition, "test() on a request that is not in flight");
  }
  // Every test(), done or not: a caller that polls is around, and the receive control thread
  // must see it (else, once that thread had won one record under load, it woke for 11-19% of the
  // later ones). Progress only while not done: pumping the control streams on done requests too
  // (0242452) cost a loaded 4-rank ring 25-36% at 8 KiB.
  callerPolled();
  if (!slot->done.load(std::memory_order_acquire)) {
    callerProgress();
  }
  if (slot->done.load(std::memory_order_acquire)) {
    if (size != nullptr) {
      *size = static_cast<size_t>(sender_ ? slot->size : slot->realSize);
    }
    *done = true;
    slot->done.store(false, std::memory_order_relaxed);
    slot->stamp.store(0, std::memory_order_release);
    return Status::ok();
  }
  if (!sender_ && closedStreams_.load(std::memory_order_acquire) == nStreams() + 1 &&
      !slot->done.load(std::memory_order_acquire)) {
    fail(BAGUA_ERROR(kRemoteError,
                     "peer %s closed the connection while a receive of message %llu was pending",
                     peer_.toString().c_str(), static_cast<unsigned long long>(slot->seq)));
  }
  if (failed()) {
    return failure();
  }
  return Status::ok();
}

}  // namespace bagua::net
