// The receive side of a connection (RecvComm): irecv, control records (real sizes, inline
// payloads) read by the control thread or the caller's test(), and the data threads that read
// chunks straight into the posted buffers. Thread model and locks: comm.h.
#include <poll.h>

#include "comm.h"
#include "wire.h"

namespace bagua::net {

namespace {

constexpr int64_t kRecvBias = int64_t{1} << 62;  // "control record not seen yet"

}  // namespace

RecvComm::Impl::Impl(Fd control, std::vector<Fd> data, const EngineOptions& options,
                     SocketAddress peer)
    : CommCore(std::move(control), std::move(data), options, peer, /*sender=*/false) {
  startThreads();
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
  if (!waitUntil([&] { return slot->stamp.load(std::memory_order_acquire) == seq + 1; }, park_)) {
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

void RecvComm::Impl::callerProgress() {
  if (ctrlSeq_.load(std::memory_order_acquire) >= posted_.load(std::memory_order_acquire)) {
    return;
  }
  std::unique_lock<std::mutex> lock(ctrlMu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return;
  }
  bool waiting = false;
  const uint64_t before = ctrlSeq_.load(std::memory_order_relaxed);
  Status s = pumpControl(&waiting);
  if (!s.isOk()) {
    ioError(std::move(s), "control record", -1);
  }
  if (ctrlSeq_.load(std::memory_order_relaxed) != before) {
    park_.wakeAll();  // the control thread may be parked on a record this call consumed
  }
}

Status RecvComm::Impl::pumpControl(bool* waitingForPost) {
  *waitingForPost = false;
  int fd = control_.get();
  while (!ctrlClosed_ && !failed()) {
    if (!ctrlHave_) {
      bool eof = false;
      BAGUA_RETURN_IF_ERROR(recvSome(fd, ctrlBuf_, sizeof(ctrlBuf_), &ctrlGot_, &eof));
      if (eof) {
        if (ctrlGot_ != 0) {
          return BAGUA_ERROR(kRemoteError, "connection closed by peer inside a control record");
        }
        ctrlClosed_ = true;
        closedStreams_.fetch_add(1, std::memory_order_acq_rel);
        wake();
        signal();
        return Status::ok();
      }
      if (ctrlGot_ < sizeof(ctrlBuf_)) {
        return Status::ok();
      }
      BAGUA_ASSIGN_OR_RETURN(wire::ControlRecord r,
                             wire::decodeControl(ctrlBuf_, sizeof(ctrlBuf_), options_.inlineBytes));
      uint64_t expected = ctrlSeq_.load(std::memory_order_relaxed);
      if (r.seq != expected) {
        return BAGUA_ERROR(kRemoteError, "control record for message %llu, expected %llu",
                           static_cast<unsigned long long>(r.seq),
                           static_cast<unsigned long long>(expected));
      }
      ctrlHave_ = true;
      ctrlRecSeq_ = r.seq;
      ctrlRecSize_ = r.size;
      ctrlRecInline_ = r.inlineBytes;
      ctrlInlineGot_ = 0;
    }
    Slot* slot = &slots_[ctrlRecSeq_ % kSlots];
    if (slot->stamp.load(std::memory_order_acquire) != ctrlRecSeq_ + 1) {
      *waitingForPost = true;
      return Status::ok();
    }
    if (ctrlRecSize_ > slot->capacity) {
      Status t = truncation(slot, ctrlRecSize_, "announced size");
      fail(t);
      return t;
    }
    if (ctrlRecInline_ > 0) {
      bool eof = false;
      BAGUA_RETURN_IF_ERROR(recvSome(fd, slot->data, ctrlRecInline_, &ctrlInlineGot_, &eof));
      if (eof) {
        return BAGUA_ERROR(kRemoteError, "connection closed by peer inside an inline payload");
      }
      if (ctrlInlineGot_ < ctrlRecInline_) {
        return Status::ok();
      }
    }
    slot->realSize = ctrlRecSize_;
    ctrlHave_ = false;
    ctrlGot_ = 0;
    ctrlSeq_.store(ctrlRecSeq_ + 1, std::memory_order_release);
    contribute(slot, static_cast<int64_t>(ctrlRecSize_ - ctrlRecInline_) - kRecvBias);
  }
  return Status::ok();
}

void RecvComm::Impl::controlLoop() {
  int fd = control_.get();
  for (;;) {
    if (stopping_.load(std::memory_order_acquire)) {
      return;
    }
    bool waiting = false;
    bool closed = false;
    uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(ctrlMu_);
      Status s = pumpControl(&waiting);
      if (!s.isOk()) {
        ioError(std::move(s), "control record", -1);
        return;
      }
      closed = ctrlClosed_;
      seq = ctrlRecSeq_;
    }
    if (closed || failed()) {
      return;
    }
    if (waiting) {
      // Until the receive is posted, or until the caller's test() consumed the record itself
      // (then the slot may already be recycled, and waiting for its stamp would leave this
      // thread parked while a caller sleeping on its Notifier waits for the next record).
      Slot* slot = &slots_[seq % kSlots];
      if (!waitUntil(
              [&] {
                return slot->stamp.load(std::memory_order_acquire) == seq + 1 ||
                       ctrlSeq_.load(std::memory_order_acquire) > seq;
              },
              park_)) {
        return;
      }
      continue;
    }
    if (notifier_.load(std::memory_order_acquire) == nullptr) {
      // The caller's test() reads the stream while it polls its requests: sleep (woken by
      // nothing, so no irecv or record costs a context switch) until it has been quiet for
      // kCallerGrace. A stop is seen within that.
      const auto seen = std::chrono::steady_clock::time_point(
          std::chrono::steady_clock::duration(callerSeenNs_.load(std::memory_order_relaxed)));
      const auto quietAt = seen + kCallerGrace;
      if (std::chrono::steady_clock::now() < quietAt) {
        std::this_thread::sleep_until(quietAt);
        continue;
      }
    }
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);  // bounded: also re-checks the stop flag
  }
}

void RecvComm::Impl::dataLoop(int stream) {
  int fd = data_[static_cast<size_t>(stream)].get();
  uint8_t header[wire::kChunkBytes];
  uint64_t lastSeq = 0;
  for (;;) {
    bool cleanEof = false;
    Status s = recvAll(fd, header, sizeof(header), kNoDeadline, &cleanEof);
    if (!s.isOk()) {
      if (cleanEof) {
        closedStreams_.fetch_add(1, std::memory_order_acq_rel);
        wake();
        signal();
        return;
      }
      ioError(std::move(s), "chunk header", stream);
      return;
    }
    Result<wire::ChunkHeader> h = wire::decodeChunk(header, sizeof(header), wire::kMaxChunkWire);
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

RecvComm::RecvComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RecvComm::~RecvComm() = default;
Result<Request*> RecvComm::irecv(void* data, size_t capacity) {
  return impl_->irecv(data, capacity);
}
void RecvComm::setNotifier(Notifier* notifier) {
  impl_->setNotifier(notifier);
}
void RecvComm::abort(const std::string& why) {
  impl_->abortNow(BAGUA_ERROR(kAborted, "receive comm aborted: %s", why.c_str()));
}
int RecvComm::nStreams() const {
  return impl_->nStreams();
}
std::vector<SocketAddress> RecvComm::streamPeers() const {
  return impl_->dataPeers();
}
const SocketAddress& RecvComm::peer() const {
  return impl_->peer();
}

}  // namespace bagua::net
