#include "comm.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
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

// ---- live settings -----------------------------------------------------------------------------

Status LiveSettings::validate() const {
  if (activeStreams < 0 || activeStreams > kMaxStreams) {
    return BAGUA_ERROR(kInvalidArgument, "live active streams %d outside 0..%d (0: all)",
                       activeStreams, kMaxStreams);
  }
  for (uint64_t v : {minChunkBytes, maxChunkBytes}) {
    if (v > wire::kMaxChunkWire) {
      return BAGUA_ERROR(kInvalidArgument, "live chunk bound %llu above 1 GiB",
                         static_cast<unsigned long long>(v));
    }
  }
  if (minChunkBytes > 0 && maxChunkBytes > 0 && maxChunkBytes < minChunkBytes) {
    return BAGUA_ERROR(kInvalidArgument, "live chunk bounds: min %llu above max %llu",
                       static_cast<unsigned long long>(minChunkBytes),
                       static_cast<unsigned long long>(maxChunkBytes));
  }
  return Status::ok();
}

void LiveCell::store(const LiveSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  active_.store(settings.activeStreams, std::memory_order_relaxed);
  minChunk_.store(settings.minChunkBytes, std::memory_order_relaxed);
  maxChunk_.store(settings.maxChunkBytes, std::memory_order_relaxed);
  seq_.store(s + 2, std::memory_order_release);
}

LiveSettings LiveCell::load() const {
  for (;;) {
    const uint64_t before = seq_.load(std::memory_order_acquire);
    if ((before & 1) != 0) {
      cpuRelax();
      continue;
    }
    LiveSettings r;
    r.activeStreams = active_.load(std::memory_order_relaxed);
    r.minChunkBytes = minChunk_.load(std::memory_order_relaxed);
    r.maxChunkBytes = maxChunk_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq_.load(std::memory_order_relaxed) == before) {
      return r;
    }
  }
}

LiveCell& processLiveCell() {
  static LiveCell cell;
  return cell;
}

Status setProcessLiveSettings(const LiveSettings& settings) {
  BAGUA_RETURN_IF_ERROR(settings.validate());
  processLiveCell().store(settings);
  return Status::ok();
}

LiveSettings processLiveSettings() {
  return processLiveCell().load();
}

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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu);
    cv.notify_all();
  }
}

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
    park.cv.wait_for(lock, std::chrono::milliseconds(20));
  }
  park.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return !stopping_.load(std::memory_order_acquire);
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

// ---- send side ---------------------------------------------------------------------------------

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
  bool roundRobin = options_.schedule == Schedule::kRoundRobin;
  // One snapshot of the live settings per message (see LiveSettings).
  const LiveSettings live = resolveLive();
  const int active = roundRobin ? nStreams() : live.activeStreams;
  // Round-robin splits evenly with no upper clamp (the NCCL Socket / Bagua-Net rule).
  slot->chunk = isInline
                    ? 0
                    : wire::chunkBytesFor(size, active, live.minChunkBytes,
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
  if (!isInline || roundRobin) {
    // Every active stream, not just nChunks of them: a busy stream must not hold a chunk that an
    // idle one could take (dynamic schedule); round-robin: every stream walks every message.
    wakeData(active);
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

void SendComm::Impl::wakeData(int streams) {
  for (int i = 0; i < streams; ++i) {
    dataParks_[i].wakeAll();
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

Status SendComm::Impl::sendChunk(int fd, Slot* slot, uint64_t offset, uint32_t length) {
  uint8_t header[wire::kChunkBytes];
  wire::ChunkHeader h;
  h.seq = slot->seq;
  h.offset = offset;
  h.length = length;
  wire::encodeChunk(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {slot->data + offset, length}};
  return sendAllV(fd, iov, 2);
}

// Equal split, chunk k of the connection to stream k mod N: the comparison baseline. A stream
// walks every message (holding one "passed" token of each) and sends its own chunks.
void SendComm::Impl::roundRobinLoop(int stream) {
  int fd = data_[static_cast<size_t>(stream)].get();
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
      Status s = sendChunk(fd, slot, offset, length);
      if (!s.isOk()) {
        ioError(std::move(s), "chunk", stream);
        return;
      }
      streamBytes_[stream].fetch_add(length, std::memory_order_relaxed);
      contribute(slot, -static_cast<int64_t>(length));
    }
    contribute(slot, -1);  // this stream has passed the message
  }
}

void SendComm::Impl::dataLoop(int stream) {
  if (options_.schedule == Schedule::kRoundRobin) {
    roundRobinLoop(stream);
    return;
  }
  int fd = data_[static_cast<size_t>(stream)].get();
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
    Status s = sendChunk(fd, slot, offset, length);
    if (!s.isOk()) {
      ioError(std::move(s), "chunk", stream);
      return;
    }
    streamBytes_[stream].fetch_add(length, std::memory_order_relaxed);
    contribute(slot, -static_cast<int64_t>(length));
  }
}

std::vector<uint64_t> SendComm::Impl::bytesPerStream() const {
  std::vector<uint64_t> v(static_cast<size_t>(nStreams()));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = streamBytes_[i].load(std::memory_order_relaxed);
  }
  return v;
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
    Status s = recvAll(fd, header, sizeof(header), &cleanEof);
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
const SocketAddress& RecvComm::peer() const {
  return impl_->peer();
}

}  // namespace bagua::net
