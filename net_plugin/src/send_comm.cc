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

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SendComm::Impl::Impl(Fd control, std::vector<Fd> data, const EngineOptions& options,
                     SocketAddress peer)
    : CommCore(std::move(control), std::move(data), options, peer, /*sender=*/true),
      tx_(std::make_unique<StreamTx[]>(data_.size())) {
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
  logPlanSummary();
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
  const bool roundRobin = options_.schedule == Schedule::kRoundRobin;
  // One snapshot of the live settings per message (see LiveSettings).
  bool floorSet = false;
  const LiveSettings live = resolveLive(&floorSet);
  const int active = roundRobin ? nStreams() : live.activeStreams;
  // The chunk policy (bagua/net/chunk_policy.h) on what the comm sees now.
  lastPlan_.rules.adaptive = options_.adaptiveChunks && !floorSet && !roundRobin;
  lastPlan_.rules.roundRobin = roundRobin;
  lastPlan_.rules.inlineBytes = options_.inlineBytes;
  lastPlan_.rules.minChunk = live.minChunkBytes;
  lastPlan_.rules.loneChunk = options_.loneChunkBytes;
  // Round-robin splits evenly with no upper clamp of its own (the NCCL Socket / Bagua-Net rule).
  lastPlan_.rules.maxChunk = roundRobin ? wire::kMaxChunkWire : live.maxChunkBytes;
  lastPlan_.load = observe(size, active, seq);
  lastPlan_.plan = planChunks(lastPlan_.load, lastPlan_.rules);
  const ChunkPlan& plan = lastPlan_.plan;
  ++planCounts_[static_cast<size_t>(plan.reason)];
  planChunks_ += plan.chunks;
  const bool isInline = plan.chunk == 0;
  if (isInline && options_.sendRateMbps > 0) {
    // Sent from the caller's thread without waiting (NCCL's proxy must not block): the inline
    // payload pushes the clock, so the next chunk of any stream waits for it.
    (void)processPacer().reserve(size, options_.sendRateMbps);
  }
  slot->chunk = plan.chunk;
  slot->postNs = lastPlan_.rules.adaptive ? steadyNs() : 0;
  postedBytes_ += isInline ? 0 : size;
  slot->active.store(active, std::memory_order_relaxed);
  slot->done.store(false, std::memory_order_relaxed);
  slot->nChunks = plan.chunks;
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
  lastPlan_.callerSent = false;
  if (roundRobin) {
    wakeData(active, UINT64_MAX);  // every stream walks every message
  } else if (!isInline) {
    // Rule 7, except one such message in kRemeasureEvery: that one goes through a woken stream,
    // so that the wake-up the rule weighs stays measured (caller-sent chunks wake nobody).
    if (plan.callerSends && options_.sendRateMbps == 0 &&
        ++callerSendTurn_ % kRemeasureEvery != 0) {
      lastPlan_.callerSent = callerSend(active);
      callerSent_ += lastPlan_.callerSent ? 1 : 0;
    }
    if (!lastPlan_.callerSent) {
      // As many parked streams as the plan says (no more than the message has chunks), so that
      // no busy stream holds a chunk an idle one could take; the others stay asleep (waking all
      // 8 for a 2-chunk message cost 21 context switches per 128 KiB message on loopback, 6 of 8
      // wake-ups for nothing).
      wakeData(active, static_cast<uint64_t>(plan.wake));
    }
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

LiveSettings SendComm::Impl::resolveLive(bool* floorSet) const {
  const LiveSettings mine = live_.load();
  const LiveSettings all = processLiveCell().load();
  if (floorSet != nullptr) {
    *floorSet = mine.minChunkBytes > 0 || all.minChunkBytes > 0;
  }
  auto pick = [](auto a, auto b, auto fallback) { return a > 0 ? a : b > 0 ? b : fallback; };
  LiveSettings r;
  r.activeStreams =
      std::clamp(pick(mine.activeStreams, all.activeStreams, nStreams()), 1, nStreams());
  r.minChunkBytes = pick(mine.minChunkBytes, all.minChunkBytes, options_.minChunkBytes);
  r.maxChunkBytes = pick(mine.maxChunkBytes, all.maxChunkBytes, options_.maxChunkBytes);
  r.maxChunkBytes = std::max(r.maxChunkBytes, r.minChunkBytes);
  return r;
}

void SendComm::Impl::logPlanSummary() const {
  uint64_t chunked = 0;
  for (size_t r = 1; r < planCounts_.size(); ++r) {
    chunked += planCounts_[r];
  }
  if (chunked + planCounts_[0] == 0 || !logEnabled(LogLevel::kDebug, kLogNet)) {
    return;
  }
  double lo = 0;
  double hi = 0;
  for (int i = 0; i < nStreams(); ++i) {
    const double r = streamRate_[i].load(std::memory_order_relaxed);
    lo = (lo == 0 || (r > 0 && r < lo)) ? r : lo;
    hi = std::max(hi, r);
  }
  BAGUA_LOG_DEBUG(
      kLogNet,
      "send comm to %s: messages inline %llu, fixed %llu, unmeasured %llu, lone %llu "
      "(caller-sent %llu), queued %llu, uneven %llu; %.2f chunks per chunked message; "
      "wake-up %.1f us; stream rates %.2f-%.2f GB/s",
      peer_.toString().c_str(), static_cast<unsigned long long>(planCounts_[0]),
      static_cast<unsigned long long>(planCounts_[1]),
      static_cast<unsigned long long>(planCounts_[2]),
      static_cast<unsigned long long>(planCounts_[3]), static_cast<unsigned long long>(callerSent_),
      static_cast<unsigned long long>(planCounts_[4]),
      static_cast<unsigned long long>(planCounts_[5]),
      chunked == 0 ? 0.0 : static_cast<double>(planChunks_) / static_cast<double>(chunked),
      wakeSeconds_.load(std::memory_order_relaxed) * 1e6, lo / 1e9, hi / 1e9);
}

CommLoad SendComm::Impl::observe(uint64_t size, int active, uint64_t seq) const {
  CommLoad load;
  load.size = size;
  const uint64_t claimed = claimedBytes_.load(std::memory_order_acquire);
  load.queuedBytes = postedBytes_ > claimed ? postedBytes_ - claimed : 0;
  const uint64_t completed = completed_.load(std::memory_order_acquire);
  load.inFlight = seq > completed ? seq - completed : 0;
  load.streams = active;
  for (int i = 0; i < active; ++i) {
    // A stream's rate counts once it has a few samples (one chunk that waited for a slow
    // receiver is not the stream's speed).
    if (rateSamples_[i].load(std::memory_order_relaxed) >= kRateSamples) {
      load.streamRates[static_cast<size_t>(i)] = streamRate_[i].load(std::memory_order_relaxed);
    }
  }
  load.wakeSeconds = wakeSeconds_.load(std::memory_order_relaxed);
  return load;
}

void SendComm::Impl::seedMeasurements(double wakeSeconds, double streamBytesPerSecond) {
  wakeSeconds_.store(wakeSeconds, std::memory_order_relaxed);
  for (int i = 0; i < nStreams(); ++i) {
    streamRate_[i].store(streamBytesPerSecond, std::memory_order_relaxed);
    rateSamples_[i].fetch_add(kRateSamples, std::memory_order_relaxed);
  }
}

void SendComm::Impl::average(std::atomic<double>& avg, double sample) {
  const double old = avg.load(std::memory_order_relaxed);
  avg.store(old == 0 ? sample : old + (sample - old) / 8, std::memory_order_relaxed);
}

void SendComm::Impl::decayingMax(std::atomic<double>& max, double sample) {
  const double old = max.load(std::memory_order_relaxed);
  max.store(std::max(sample, old * 0.9), std::memory_order_relaxed);
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
    claimedBytes_.fetch_add(len, std::memory_order_release);
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
  const int64_t t0 = slot->postNs != 0 ? steadyNs() : 0;
  Status s = sendAllV(data_[static_cast<size_t>(stream)].get(), iov, 2);
  if (!s.isOk()) {
    ioError(std::move(s), "chunk", stream);
    return false;
  }
  chunkSent(stream, slot, length, t0);
  return true;
}

void SendComm::Impl::chunkSent(int stream, Slot* slot, uint32_t length, int64_t t0) {
  if (t0 != 0) {
    // The stream's rate while it sends (the copy into the kernel, or the wait for room when the
    // link or the receiver is the limit): the chunk policy's per-stream rate.
    const int64_t dt = std::max<int64_t>(steadyNs() - t0, 1000);
    decayingMax(streamRate_[stream], static_cast<double>(length) * 1e9 / static_cast<double>(dt));
    rateSamples_[stream].fetch_add(1, std::memory_order_relaxed);
  }
  streamBytes_[stream].fetch_add(length, std::memory_order_relaxed);
  streamChunks_[stream].fetch_add(1, std::memory_order_relaxed);
  contribute(slot, -static_cast<int64_t>(length));
}

bool SendComm::Impl::callerSend(int active) {
  for (int i = 0; i < active; ++i) {
    // Only a parked stream: a running one is about to claim on its own, and its lock may be
    // held for a whole blocking send.
    if (dataParks_[i].sleepers.load(std::memory_order_seq_cst) == 0) {
      continue;
    }
    StreamTx& tx = tx_[static_cast<size_t>(i)];
    std::unique_lock<std::mutex> lock(tx.mu, std::try_to_lock);
    if (!lock.owns_lock() || tx.slot != nullptr) {
      continue;
    }
    Slot* slot = nullptr;
    uint64_t offset = 0;
    uint32_t length = 0;
    if (!claim(i, &slot, &offset, &length)) {
      return true;  // a stream already took it
    }
    wire::ChunkHeader h;
    h.seq = slot->seq;
    h.offset = offset;
    h.length = length;
    wire::encodeChunk(h, tx.header);
    iovec iov[2] = {{tx.header, sizeof(tx.header)}, {slot->data + offset, length}};
    size_t sent = 0;
    const int64_t t0 = slot->postNs != 0 ? steadyNs() : 0;
    Status s = sendSomeV(data_[static_cast<size_t>(i)].get(), iov, 2, &sent);
    if (!s.isOk()) {
      lock.unlock();
      ioError(std::move(s), "chunk", i);
      return true;
    }
    if (sent == sizeof(tx.header) + length) {
      chunkSent(i, slot, length, t0);
      return true;
    }
    // The socket is full: the stream's thread sends the rest.
    tx.slot = slot;
    tx.offset = offset;
    tx.length = length;
    tx.sent = sent;
    tx.pending.store(true, std::memory_order_seq_cst);
    lock.unlock();
    dataParks_[i].wakeAll();
    return true;
  }
  return false;
}

bool SendComm::Impl::finishPending(int stream) {
  StreamTx& tx = tx_[static_cast<size_t>(stream)];
  Slot* slot = tx.slot;
  iovec iov[2] = {{tx.header, sizeof(tx.header)}, {slot->data + tx.offset, tx.length}};
  size_t skip = tx.sent;
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
  tx.slot = nullptr;
  tx.pending.store(false, std::memory_order_relaxed);
  Status s = sendAllV(data_[static_cast<size_t>(stream)].get(), rest, n);
  if (!s.isOk()) {
    ioError(std::move(s), "chunk", stream);
    return false;
  }
  chunkSent(stream, slot, tx.length, 0);
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
  StreamTx& tx = tx_[static_cast<size_t>(stream)];
  int64_t idleSince = 0;  // when this thread last found nothing to claim (0: busy since)
  for (;;) {
    Slot* slot = nullptr;
    uint64_t offset = 0;
    uint32_t length = 0;
    bool claimed = false;
    {
      std::lock_guard<std::mutex> lock(tx.mu);
      if (tx.slot != nullptr) {
        idleSince = 0;  // a caller's chunk, not a wake-up for one of this thread's own
        if (!finishPending(stream)) {
          return;
        }
      }
      claimed = claim(stream, &slot, &offset, &length);
      if (claimed) {
        if (idleSince != 0 && slot->postNs >= idleSince) {
          // Posted while this stream was idle: the time to its first chunk is the wake-up a
          // lone message pays (the chunk policy's break-even chunk is this time x the rate).
          average(wakeSeconds_, static_cast<double>(steadyNs() - slot->postNs) * 1e-9);
        }
        idleSince = 0;
        if (!sendChunk(stream, slot, offset, length)) {
          return;
        }
      }
    }
    if (!claimed) {
      if (idleSince == 0) {
        idleSince = steadyNs();
      }
      if (!waitUntil(
              [&] { return claimable(stream) || tx.pending.load(std::memory_order_seq_cst); },
              dataParks_[stream])) {
        return;
      }
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

std::vector<uint64_t> SendComm::Impl::chunksPerStream() const {
  std::vector<uint64_t> v(static_cast<size_t>(nStreams()));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = streamChunks_[i].load(std::memory_order_relaxed);
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
std::vector<uint64_t> SendComm::chunksPerStream() const {
  return impl_->chunksPerStream();
}
uint64_t SendComm::chunksPosted() const {
  return impl_->chunksPosted();
}
MessagePlan SendComm::lastPlan() const {
  return impl_->lastPlan();
}
void SendComm::seedMeasurementsForTesting(double wakeSeconds, double streamBytesPerSecond) {
  impl_->seedMeasurements(wakeSeconds, streamBytesPerSecond);
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
