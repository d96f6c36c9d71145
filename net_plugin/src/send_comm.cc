// The send side of a connection (SendComm): isend, the control record, the chunk schedule and the
// data threads that send chunks. Thread model and locks: comm.h.
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "bagua/base/logging.h"
#include "comm.h"
#include "wire.h"

namespace bagua::net {

namespace {

// EngineOptions::sendRateMbps: one virtual clock per process. A sender reserves the wire time
// of its bytes (start = max(now, the clock), clock = start + bytes / rate) and sends at its start
// time, so over any stretch the process's payload rate stays at or below the cap whatever the
// number of comms and streams; idle time earns no credit (a link has no burst memory).
class SendPacer {
 public:
  // The time `bytes` may start on a link of `mbps` Mbit/s.
  std::chrono::steady_clock::time_point reserve(uint64_t bytes, uint64_t mbps) {
    const auto cost =
        static_cast<int64_t>(static_cast<double>(bytes) * 8e3 / static_cast<double>(mbps));  // ns
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t cur = clock_.load(std::memory_order_relaxed);
    int64_t start = 0;
    do {
      start = std::max(cur, now);
    } while (!clock_.compare_exchange_weak(cur, start + cost, std::memory_order_relaxed));
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(start));
  }

 private:
  std::atomic<int64_t> clock_{0};
};

SendPacer& processPacer() {
  static SendPacer pacer;
  return pacer;
}

}  // namespace

SendComm::Impl::Impl(Fd control, std::vector<Fd> data, const EngineOptions& options,
                     SocketAddress peer)
    : CommCore(std::move(control), std::move(data), options, peer, /*sender=*/true) {
  if (options_.slowStreamBytesPerSec > 0 && !data_.empty()) {
    // Fault injection (EngineOptions::slowStreamBytesPerSec): the kernel paces stream 0.
    uint64_t rate = options_.slowStreamBytesPerSec;
    if (setsockopt(data_[0].get(), SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) != 0) {
      BAGUA_LOG_WARN(kLogNet, "cannot pace data stream 0 to %llu B/s: %s",
                     static_cast<unsigned long long>(rate), std::strerror(errno));
    }
  }
  startThreads();
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
  if (isInline && options_.sendRateMbps > 0) {
    // Sent from the caller's thread without waiting (NCCL's proxy must not block): the inline
    // payload pushes the clock, so the next chunk of any stream waits for it.
    (void)processPacer().reserve(size, options_.sendRateMbps);
  }
  bool roundRobin = options_.schedule == Schedule::kRoundRobin;
  // One snapshot of the live settings per message (see LiveSettings).
  const LiveSettings live = resolveLive();
  const int active = roundRobin ? nStreams() : live.activeStreams;
  // A message that finds every earlier chunk claimed has the streams to itself: with a lone
  // chunk size set, it is cut finer (latency), while queued messages keep the larger minimum
  // (fewer hops per byte). The cursor is read without the lock: a hint, either cut is correct.
  uint64_t minChunk = live.minChunkBytes;
  if (!roundRobin && options_.loneChunkBytes > 0 &&
      claimSeq_.load(std::memory_order_acquire) == seq) {
    minChunk = std::min(minChunk, options_.loneChunkBytes);
  }
  // Round-robin splits evenly with no upper clamp (the NCCL Socket / Bagua-Net rule).
  slot->chunk = isInline
                    ? 0
                    : wire::chunkBytesFor(size, active, minChunk,
                                          roundRobin ? wire::kMaxChunkWire : live.maxChunkBytes);
  slot->active.store(active, std::memory_order_relaxed);
  slot->done.store(false, std::memory_order_relaxed);
  slot->nChunks = isInline ? 0 : wire::chunkCount(size, slot->chunk);
  slot->rrBase = rrCursor_;
  rrCursor_ += slot->nChunks;
  // Tokens: the control record (1) plus every data byte; an inline message instead holds a
  // "claim passed" token so that it cannot complete (and its slot be reused) while the chunk
  // cursor still points at it. Round-robin: one "passed" token per data stream instead.
  int64_t passTokens = roundRobin ? nStreams() : (isInline ? 1 : 0);
  slot->remaining.store(static_cast<int64_t>(isInline ? 0 : size) + 1 + passTokens,
                        std::memory_order_relaxed);
  slot->stamp.store(seq + 1, std::memory_order_release);
  posted_.store(seq + 1, std::memory_order_seq_cst);
  if (isInline && !roundRobin) {
    // Fast path: nothing earlier is left to claim, so move the cursor past it right here.
    std::unique_lock<std::mutex> lock(claimMu_);
    if (claimSeq_.load(std::memory_order_relaxed) == seq) {
      claimSeq_.store(seq + 1, std::memory_order_relaxed);
      claimOffset_ = 0;
      lock.unlock();
      contribute(slot, -1);
    }
  }
  // Fast path: write the control record (and an inline payload) from the caller's thread when
  // the control stream is idle; whatever the socket does not take now, the control thread sends.
  callerProgress();
  if (roundRobin) {
    wakeData(active, UINT64_MAX);  // every stream walks every message
  } else if (!isInline) {
    // As many parked streams as the message has chunks, so that no busy stream holds a chunk an
    // idle one could take; the others stay asleep (waking all 8 for a 2-chunk message cost 21
    // context switches per 128 KiB message on loopback, 6 of 8 wake-ups for nothing).
    wakeData(active, slot->nChunks);
  }
  if (ctrlDone_.load(std::memory_order_acquire) <= seq) {
    park_.wakeAll();  // the caller could not write the record: the control thread will
  }
  return static_cast<Request*>(slot);
}

void SendComm::Impl::callerProgress() {
  if (ctrlDone_.load(std::memory_order_acquire) >= posted_.load(std::memory_order_acquire)) {
    return;
  }
  std::unique_lock<std::mutex> lock(ctrlMu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return;  // the control thread is at it
  }
  Status s = pumpControl(/*blocking=*/false);
  if (!s.isOk()) {
    ioError(std::move(s), "control record", -1);
  }
}

Status SendComm::Impl::pumpControl(bool blocking) {
  uint8_t record[wire::kControlBytes];
  while (ctrlSeq_ < posted_.load(std::memory_order_acquire)) {
    Slot* slot = &slots_[ctrlSeq_ % kSlots];
    wire::ControlRecord r;
    r.seq = ctrlSeq_;
    r.size = slot->size;
    r.inlineBytes = slot->chunk == 0 ? static_cast<uint32_t>(slot->size) : 0;
    wire::encodeControl(r, record);
    iovec iov[2] = {{record, sizeof(record)}, {slot->data, r.inlineBytes}};
    size_t total = sizeof(record) + r.inlineBytes;
    if (blocking) {
      // Skip what an earlier non-blocking attempt already sent.
      size_t skip = ctrlSent_;
      iovec rest[2];
      int n = 0;
      for (iovec& v : iov) {
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        rest[n++] = iovec{static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
        skip = 0;
      }
      BAGUA_RETURN_IF_ERROR(sendAllV(control_.get(), rest, n));
      ctrlSent_ = total;
    } else {
      BAGUA_RETURN_IF_ERROR(sendSomeV(control_.get(), iov, r.inlineBytes > 0 ? 2 : 1, &ctrlSent_));
      if (ctrlSent_ < total) {
        return Status::ok();  // the socket is full; the control thread finishes it
      }
    }
    ctrlSent_ = 0;
    ++ctrlSeq_;
    ctrlDone_.store(ctrlSeq_, std::memory_order_release);
    contribute(slot, -1);
  }
  return Status::ok();
}

void SendComm::Impl::controlLoop() {
  for (;;) {
    if (!waitUntil(
            [&] {
              return posted_.load(std::memory_order_acquire) >
                     ctrlDone_.load(std::memory_order_acquire);
            },
            park_)) {
      return;
    }
    std::lock_guard<std::mutex> lock(ctrlMu_);
    Status s = pumpControl(/*blocking=*/true);
    if (!s.isOk()) {
      ioError(std::move(s), "control record", -1);
      return;
    }
  }
}

void SendComm::Impl::wakeData(int streams, uint64_t chunks) {
  // A stream not counted as a sleeper is running, or about to park: it re-checks its predicate
  // after counting itself (waitUntil), so it sees the message published before this (seq_cst).
  for (int i = 0; i < streams && chunks > 0; ++i) {
    if (dataParks_[i].sleepers.load(std::memory_order_seq_cst) > 0) {
      dataParks_[i].wakeAll();
      --chunks;
    }
  }
}

LiveSettings SendComm::Impl::resolveLive() const {
  const LiveSettings mine = live_.load();
  const LiveSettings all = processLiveCell().load();
  auto pick = [](auto a, auto b, auto fallback) { return a > 0 ? a : b > 0 ? b : fallback; };
  LiveSettings r;
  r.activeStreams =
      std::clamp(pick(mine.activeStreams, all.activeStreams, nStreams()), 1, nStreams());
  r.minChunkBytes = pick(mine.minChunkBytes, all.minChunkBytes, options_.minChunkBytes);
  r.maxChunkBytes = pick(mine.maxChunkBytes, all.maxChunkBytes, options_.maxChunkBytes);
  r.maxChunkBytes = std::max(r.maxChunkBytes, r.minChunkBytes);
  return r;
}

Status SendComm::Impl::setLive(const LiveSettings& settings) {
  BAGUA_RETURN_IF_ERROR(settings.validate());
  live_.store(settings);
  return Status::ok();
}

bool SendComm::Impl::claimable(int stream) const {
  const uint64_t seq = claimSeq_.load(std::memory_order_acquire);
  if (posted_.load(std::memory_order_acquire) <= seq) {
    return false;
  }
  // A hint only (the slot may be recycled meanwhile): claim() decides under claimMu_.
  return slots_[seq % kSlots].active.load(std::memory_order_relaxed) > stream;
}

bool SendComm::Impl::claim(int stream, Slot** slot, uint64_t* offset, uint32_t* length) {
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
    if (s->active.load(std::memory_order_relaxed) <= stream) {
      break;  // a message cut for fewer streams than this one: leave it to the active ones
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

bool SendComm::Impl::sendChunk(int stream, Slot* slot, uint64_t offset, uint32_t length) {
  uint8_t header[wire::kChunkBytes];
  wire::ChunkHeader h;
  h.seq = slot->seq;
  h.offset = offset;
  h.length = length;
  wire::encodeChunk(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {slot->data + offset, length}};
  if (options_.sendRateMbps > 0) {
    // Link emulation: wait for this chunk's slot on the process's clock, in slices so that an
    // abort is seen within 10 ms.
    const auto start = processPacer().reserve(length, options_.sendRateMbps);
    while (!failed()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= start) {
        break;
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          start - now, std::chrono::milliseconds(10)));
    }
  }
  Status s = sendAllV(data_[static_cast<size_t>(stream)].get(), iov, 2);
  if (!s.isOk()) {
    ioError(std::move(s), "chunk", stream);
    return false;
  }
  streamBytes_[stream].fetch_add(length, std::memory_order_relaxed);
  contribute(slot, -static_cast<int64_t>(length));
  return true;
}

// Equal split, chunk k of the connection to stream k mod N: the comparison baseline. A stream
// walks every message (holding one "passed" token of each) and sends its own chunks.
void SendComm::Impl::roundRobinLoop(int stream) {
  uint64_t n = static_cast<uint64_t>(nStreams());
  uint64_t mine = static_cast<uint64_t>(stream);
  for (uint64_t seq = 0;; ++seq) {
    if (!waitUntil([&] { return posted_.load(std::memory_order_acquire) > seq; },
                   dataParks_[stream])) {
      return;
    }
    Slot* slot = &slots_[seq % kSlots];
    uint64_t first = (mine + n - slot->rrBase % n) % n;  // first j with (rrBase + j) % n == mine
    for (uint64_t j = first; j < slot->nChunks; j += n) {
      uint64_t offset = j * slot->chunk;
      auto length = static_cast<uint32_t>(std::min(slot->chunk, slot->size - offset));
      if (!sendChunk(stream, slot, offset, length)) {
        return;
      }
    }
    contribute(slot, -1);  // this stream has passed the message
  }
}

void SendComm::Impl::dataLoop(int stream) {
  if (options_.schedule == Schedule::kRoundRobin) {
    roundRobinLoop(stream);
    return;
  }
  for (;;) {
    Slot* slot = nullptr;
    uint64_t offset = 0;
    uint32_t length = 0;
    if (!claim(stream, &slot, &offset, &length)) {
      if (!waitUntil([&] { return claimable(stream); }, dataParks_[stream])) {
        return;
      }
      continue;
    }
    if (!sendChunk(stream, slot, offset, length)) {
      return;
    }
  }
}

std::vector<uint64_t> SendComm::Impl::bytesPerStream() const {
  std::vector<uint64_t> v(static_cast<size_t>(nStreams()));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = streamBytes_[i].load(std::memory_order_relaxed);
  }
  return v;
}

// ---- public wrappers ---------------------------------------------------------------------------

SendComm::SendComm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SendComm::~SendComm() = default;
Result<Request*> SendComm::isend(const void* data, size_t size) {
  return impl_->isend(data, size);
}
void SendComm::setNotifier(Notifier* notifier) {
  impl_->setNotifier(notifier);
}
std::vector<uint64_t> SendComm::bytesPerStream() const {
  return impl_->bytesPerStream();
}
uint64_t SendComm::chunksPosted() const {
  return impl_->chunksPosted();
}
std::vector<SocketAddress> SendComm::streamPeers() const {
  return impl_->dataPeers();
}
Status SendComm::setLiveSettings(const LiveSettings& settings) {
  return impl_->setLive(settings);
}
LiveSettings SendComm::effectiveLiveSettings() const {
  return impl_->resolveLive();
}
void SendComm::abort(const std::string& why) {
  impl_->abortNow(BAGUA_ERROR(kAborted, "send comm aborted: %s", why.c_str()));
}
int SendComm::nStreams() const {
  return impl_->nStreams();
}
const SocketAddress& SendComm::peer() const {
  return impl_->peer();
}

}  // namespace bagua::net
