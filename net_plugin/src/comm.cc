#include "comm.h"

#include <sys/socket.h>

#include <chrono>
#include <cstring>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "wire.h"

namespace bagua::net {

namespace {

constexpr int64_t kRecvBias = int64_t{1} << 62;  // "control record not seen yet"

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

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
      data_(std::move(data)) {
  for (Slot& s : slots_) {
    s.owner = this;
  }
}

CommCore::~CommCore() {
  stopThreads();
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
  {
    std::lock_guard<std::mutex> lock(waitMu_);
    waitCv_.notify_all();
  }
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
      BAGUA_LOG_WARN(kNet, "%s comm with %s failed: %s", sender_ ? "send" : "receive",
                     peer_.toString().c_str(), error_.toString().c_str());
    }
  }
  wake();
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
    slot->done.store(true, std::memory_order_release);
  } else if (after < 0) {
    fail(BAGUA_ERROR(kRemoteError,
                     "peer sent more data than message %llu holds (protocol violation)",
                     static_cast<unsigned long long>(slot->seq)));
  }
}

template <typename Pred>
bool CommCore::waitUntil(Pred pred) {
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
  std::unique_lock<std::mutex> lock(waitMu_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while (!pred() && !stopping_.load(std::memory_order_seq_cst)) {
    waitCv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  return !stopping_.load(std::memory_order_acquire);
}

void CommCore::wake() {
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(waitMu_);
    waitCv_.notify_all();
  }
}

Status CommCore::testSlot(Slot* slot, bool* done, size_t* size) {
  *done = false;
  if (slot->stamp.load(std::memory_order_acquire) == 0) {
    return BAGUA_ERROR(kFailedPrecondition, "test() on a request that is not in flight");
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

// ---- send side ---------------------------------------------------------------------------------

SendComm::Impl::Impl(Fd control, std::vector<Fd> data, const EngineOptions& options,
                     SocketAddress peer)
    : CommCore(std::move(control), std::move(data), options, peer, /*sender=*/true) {
  threads_.emplace_back([this] {
    setThreadName("bagua-net-sc");
    controlLoop();
  });
  for (int i = 0; i < nStreams(); ++i) {
    threads_.emplace_back([this, i] {
      setThreadName(strPrintf("bagua-net-s%d", i));
      dataLoop(i);
    });
  }
}

SendComm::Impl::~Impl() {
  stopThreads();
}

Result<Request*> SendComm::Impl::isend(const void* data, size_t size) {
  if (failed()) {
    return failure();
  }
  if (data == nullptr && size > 0) {
    return BAGUA_ERROR(kInvalidArgument, "isend of %zu bytes from a null buffer", size);
  }
  uint64_t seq = posted_.load(std::memory_order_relaxed);
  Slot* slot = &slots_[seq % kSlots];
  if (slot->stamp.load(std::memory_order_acquire) != 0) {
    return BAGUA_ERROR(kUnavailable, "all %d send requests in flight", kSlots);
  }
  slot->data = static_cast<uint8_t*>(const_cast<void*>(data));
  slot->size = size;
  slot->seq = seq;
  bool isInline = size <= options_.inlineBytes;
  slot->chunk = isInline ? 0
                         : wire::chunkBytesFor(size, nStreams(), options_.minChunkBytes,
                                               options_.maxChunkBytes);
  slot->done.store(false, std::memory_order_relaxed);
  // Tokens: the control record (1) plus every data byte; an inline message instead holds a
  // "claim passed" token so that it cannot complete (and its slot be reused) while the chunk
  // cursor still points at it.
  slot->remaining.store(static_cast<int64_t>(isInline ? 1 : size) + 1, std::memory_order_relaxed);
  slot->stamp.store(seq + 1, std::memory_order_release);
  posted_.store(seq + 1, std::memory_order_seq_cst);
  if (isInline) {
    // Fast path: nothing earlier is left to claim, so move the cursor past it right here.
    std::unique_lock<std::mutex> lock(claimMu_);
    if (claimSeq_.load(std::memory_order_relaxed) == seq) {
      claimSeq_.store(seq + 1, std::memory_order_relaxed);
      claimOffset_ = 0;
      lock.unlock();
      contribute(slot, -1);
    }
  }
  wake();
  return static_cast<Request*>(slot);
}

void SendComm::Impl::controlLoop() {
  uint8_t record[wire::kControlBytes];
  for (uint64_t seq = 0;; ++seq) {
    if (!waitUntil([&] { return posted_.load(std::memory_order_acquire) > seq; })) {
      return;
    }
    Slot* slot = &slots_[seq % kSlots];
    wire::ControlRecord r;
    r.seq = seq;
    r.size = slot->size;
    r.inlineBytes = slot->chunk == 0 ? static_cast<uint32_t>(slot->size) : 0;
    wire::encodeControl(r, record);
    iovec iov[2] = {{record, sizeof(record)}, {slot->data, r.inlineBytes}};
    Status s = sendAllV(control_.get(), iov, r.inlineBytes > 0 ? 2 : 1);
    if (!s.isOk()) {
      ioError(std::move(s), "control record", -1);
      return;
    }
    contribute(slot, -1);
  }
}

bool SendComm::Impl::claim(Slot** slot, uint64_t* offset, uint32_t* length) {
  std::lock_guard<std::mutex> lock(claimMu_);
  uint64_t posted = posted_.load(std::memory_order_acquire);
  uint64_t seq = claimSeq_.load(std::memory_order_relaxed);
  while (seq < posted) {
    Slot* s = &slots_[seq % kSlots];
    if (s->chunk == 0) {
      ++seq;
      claimOffset_ = 0;
      claimSeq_.store(seq, std::memory_order_relaxed);
      contribute(s, -1);  // the inline message's "claim passed" token
      continue;
    }
    uint64_t len = std::min(s->chunk, s->size - claimOffset_);
    *slot = s;
    *offset = claimOffset_;
    *length = static_cast<uint32_t>(len);
    claimOffset_ += len;
    if (claimOffset_ >= s->size) {
      ++seq;
      claimOffset_ = 0;
    }
    claimSeq_.store(seq, std::memory_order_relaxed);
    return true;
  }
  claimSeq_.store(seq, std::memory_order_relaxed);
  return false;
}

void SendComm::Impl::dataLoop(int stream) {
  int fd = data_[static_cast<size_t>(stream)].get();
  uint8_t header[wire::kChunkBytes];
  for (;;) {
    Slot* slot = nullptr;
    uint64_t offset = 0;
    uint32_t length = 0;
    if (!claim(&slot, &offset, &length)) {
      if (!waitUntil([&] {
            return posted_.load(std::memory_order_acquire) >
                   claimSeq_.load(std::memory_order_relaxed);
          })) {
        return;
      }
      continue;
    }
    wire::ChunkHeader h;
    h.seq = slot->seq;
    h.offset = offset;
    h.length = length;
    wire::encodeChunk(h, header);
    iovec iov[2] = {{header, sizeof(header)}, {slot->data + offset, length}};
    Status s = sendAllV(fd, iov, 2);
    if (!s.isOk()) {
      ioError(std::move(s), "chunk", stream);
      return;
    }
    contribute(slot, -static_cast<int64_t>(length));
  }
}

// ---- receive side ------------------------------------------------------------------------------

RecvComm::Impl::Impl(Fd control, std::vector<Fd> data, const EngineOptions& options,
                     SocketAddress peer)
    : CommCore(std::move(control), std::move(data), options, peer, /*sender=*/false) {
  threads_.emplace_back([this] {
    setThreadName("bagua-net-rc");
    controlLoop();
  });
  for (int i = 0; i < nStreams(); ++i) {
    threads_.emplace_back([this, i] {
      setThreadName(strPrintf("bagua-net-r%d", i));
      dataLoop(i);
    });
  }
}

RecvComm::Impl::~Impl() {
  stopThreads();
}

Result<Request*> RecvComm::Impl::irecv(void* data, size_t capacity) {
  if (failed()) {
    return failure();
  }
  if (data == nullptr && capacity > 0) {
    return BAGUA_ERROR(kInvalidArgument, "irecv of %zu bytes into a null buffer", capacity);
  }
  uint64_t seq = posted_.load(std::memory_order_relaxed);
  Slot* slot = &slots_[seq % kSlots];
  if (slot->stamp.load(std::memory_order_acquire) != 0) {
    return BAGUA_ERROR(kUnavailable, "all %d receive requests in flight", kSlots);
  }
  slot->data = static_cast<uint8_t*>(data);
  slot->capacity = capacity;
  slot->size = capacity;
  slot->seq = seq;
  slot->realSize = 0;
  slot->done.store(false, std::memory_order_relaxed);
  slot->remaining.store(kRecvBias, std::memory_order_relaxed);
  slot->stamp.store(seq + 1, std::memory_order_release);
  posted_.store(seq + 1, std::memory_order_seq_cst);
  wake();
  return static_cast<Request*>(slot);
}

Slot* RecvComm::Impl::waitPosted(uint64_t seq) {
  Slot* slot = &slots_[seq % kSlots];
  if (!waitUntil([&] { return slot->stamp.load(std::memory_order_acquire) == seq + 1; })) {
    return nullptr;
  }
  return slot;
}

Status RecvComm::Impl::truncation(const Slot* slot, uint64_t needed, const char* what) {
  return BAGUA_ERROR(kInvalidArgument,
                     "message truncated: message %llu from %s needs %llu bytes (%s) but the "
                     "posted receive holds %llu; post receives at least as large as the matching "
                     "sends",
                     static_cast<unsigned long long>(slot->seq), peer_.toString().c_str(),
                     static_cast<unsigned long long>(needed), what,
                     static_cast<unsigned long long>(slot->capacity));
}

void RecvComm::Impl::controlLoop() {
  uint8_t record[wire::kControlBytes];
  for (uint64_t seq = 0;; ++seq) {
    bool cleanEof = false;
    Status s = recvAll(control_.get(), record, sizeof(record), &cleanEof);
    if (!s.isOk()) {
      if (cleanEof) {
        closedStreams_.fetch_add(1, std::memory_order_acq_rel);
        wake();
        return;
      }
      ioError(std::move(s), "control record", -1);
      return;
    }
    Result<wire::ControlRecord> r =
        wire::decodeControl(record, sizeof(record), options_.inlineBytes);
    if (!r.isOk()) {
      ioError(r.takeStatus(), "control record", -1);
      return;
    }
    if (r->seq != seq) {
      ioError(BAGUA_ERROR(kRemoteError, "control record for message %llu, expected %llu",
                          static_cast<unsigned long long>(r->seq),
                          static_cast<unsigned long long>(seq)),
              "control record", -1);
      return;
    }
    Slot* slot = waitPosted(seq);
    if (slot == nullptr) {
      return;
    }
    if (r->size > slot->capacity) {
      fail(truncation(slot, r->size, "announced size"));
      return;
    }
    if (r->inlineBytes > 0) {
      s = recvAll(control_.get(), slot->data, r->inlineBytes);
      if (!s.isOk()) {
        ioError(std::move(s), "inline payload", -1);
        return;
      }
    }
    slot->realSize = r->size;
    int64_t dataBytes = static_cast<int64_t>(r->size - r->inlineBytes);
    contribute(slot, dataBytes - kRecvBias);
  }
}

void RecvComm::Impl::dataLoop(int stream) {
  int fd = data_[static_cast<size_t>(stream)].get();
  uint8_t header[wire::kChunkBytes];
  uint64_t lastSeq = 0;
  for (;;) {
    bool cleanEof = false;
    Status s = recvAll(fd, header, sizeof(header), &cleanEof);
    if (!s.isOk()) {
      if (cleanEof) {
        closedStreams_.fetch_add(1, std::memory_order_acq_rel);
        wake();
        return;
      }
      ioError(std::move(s), "chunk header", stream);
      return;
    }
    Result<wire::ChunkHeader> h = wire::decodeChunk(header, sizeof(header), options_.maxChunkBytes);
    if (!h.isOk()) {
      ioError(h.takeStatus(), "chunk header", stream);
      return;
    }
    if (h->seq < lastSeq) {
      ioError(BAGUA_ERROR(kRemoteError, "chunk of message %llu after message %llu",
                          static_cast<unsigned long long>(h->seq),
                          static_cast<unsigned long long>(lastSeq)),
              "chunk header", stream);
      return;
    }
    lastSeq = h->seq;
    Slot* slot = waitPosted(h->seq);
    if (slot == nullptr) {
      return;
    }
    if (h->offset + h->length > slot->capacity) {
      fail(truncation(slot, h->offset + h->length, "chunk end"));
      return;
    }
    s = recvAll(fd, slot->data + h->offset, h->length);
    if (!s.isOk()) {
      ioError(std::move(s), "chunk payload", stream);
      return;
    }
    contribute(slot, -static_cast<int64_t>(h->length));
  }
}

// ---- public wrappers ---------------------------------------------------------------------------

SendComm::SendComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SendComm::~SendComm() = default;
Result<Request*> SendComm::isend(const void* data, size_t size) {
  return impl_->isend(data, size);
}
int SendComm::nStreams() const {
  return impl_->nStreams();
}
const SocketAddress& SendComm::peer() const {
  return impl_->peer();
}

RecvComm::RecvComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RecvComm::~RecvComm() = default;
Result<Request*> RecvComm::irecv(void* data, size_t capacity) {
  return impl_->irecv(data, capacity);
}
int RecvComm::nStreams() const {
  return impl_->nStreams();
}
const SocketAddress& RecvComm::peer() const {
  return impl_->peer();
}

}  // namespace bagua::net
