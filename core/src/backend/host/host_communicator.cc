#include "backend/host/host_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/params.h"
#include "bagua/core/process_group.h"

namespace bagua::core {

namespace {

class DoneWork final : public Work {
 public:
  explicit DoneWork(Status s) : status_(std::move(s)) {}
  bool test() override { return true; }
  Status wait(std::chrono::milliseconds) override { return status_; }
  Status status() override { return status_; }

 private:
  Status status_;
};

}  // namespace

WorkPtr completedWork(Status status) {
  return std::make_shared<DoneWork>(std::move(status));
}

namespace host {

using Clock = std::chrono::steady_clock;

Result<HostOptions> hostOptionsFromParams(std::chrono::milliseconds timeout, int ranksPerHost) {
  HostOptions o;
  if (timeout.count() <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, coreParams().collectiveTimeoutMs.get());
    timeout = std::chrono::milliseconds(t);
  }
  o.timeout = timeout;
  Result<std::string> algo = coreParams().hostAlgorithm.get();
  if (!algo.isOk()) {
    return algo.status();
  }
  o.algo = *algo == "ring"   ? HostOptions::Algo::kRing
           : *algo == "tree" ? HostOptions::Algo::kTree
                             : HostOptions::Algo::kAuto;
  BAGUA_ASSIGN_OR_RETURN(uint64_t tree, coreParams().hostTreeMaxBytes.get());
  o.treeMaxBytes = tree;
  BAGUA_ASSIGN_OR_RETURN(uint64_t seg, coreParams().hostSegmentBytes.get());
  o.segmentBytes = seg;
  BAGUA_ASSIGN_OR_RETURN(int64_t threads, coreParams().hostReduceThreads.get());
  if (threads == 0) {
    // Cores are shared by the ranks of a host: helpers beyond a rank's share only add
    // context switches.
    const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
    threads = std::clamp<int64_t>(cores / std::max(1, ranksPerHost), 1, 4);
  }
  o.reduceThreads = static_cast<int>(threads);
  return o;
}

class HostCommunicator::HostWork final : public Work {
 public:
  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      return BAGUA_ERROR(kDeadlineExceeded, "%s still running after waiting %lld ms", name_.c_str(),
                         static_cast<long long>(timeout.count()));
    }
    return status_;
  }
  Status status() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      return BAGUA_ERROR(kFailedPrecondition, "%s has not finished", name_.c_str());
    }
    return status_;
  }
  void complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      done_ = true;
    }
    cv_.notify_all();
  }
  explicit HostWork(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

HostCommunicator::HostCommunicator(std::unique_ptr<Transport> transport, const HostOptions& options)
    : transport_(std::move(transport)), options_(options), reducer_(options.reduceThreads) {
  options_.segmentBytes = std::max<size_t>(options_.segmentBytes, 4096);
  segmentNow_.store(options_.segmentBytes, std::memory_order_relaxed);
  worker_ = std::jthread([this](std::stop_token st) { workerLoop(st); });
}

HostCommunicator::~HostCommunicator() {
  // An operation still running (a peer that never joins) would otherwise hold the join up to
  // the collective timeout. Data already handed to the transport still reaches the peers.
  transport_->abort("communicator destroyed");
  worker_.request_stop();
  queueCv_.notify_all();
  if (worker_.joinable()) {
    worker_.join();
  }
  // Anything still queued fails rather than leaving waiters hanging.
  std::lock_guard<std::mutex> lock(queueMu_);
  for (auto& item : queue_) {
    item.work->complete(BAGUA_ERROR(kAborted, "%s: communicator destroyed", item.name.c_str()));
  }
  queue_.clear();
}

WorkPtr HostCommunicator::enqueue(std::string name, std::function<Status(Deadline)> run) {
  auto work = std::make_shared<HostWork>(name);
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    queue_.push_back({std::move(name), std::move(run), work});
  }
  queueCv_.notify_one();
  return work;
}

void HostCommunicator::workerLoop(std::stop_token stop) {
  setThreadName("bagua-host-comm");
  while (true) {
    Item item;
    Status broken;
    {
      std::unique_lock<std::mutex> lock(queueMu_);
      queueCv_.wait_for(lock, stop, std::chrono::milliseconds(200),
                        [&] { return !queue_.empty(); });
      if (queue_.empty()) {
        if (stop.stop_requested()) {
          return;
        }
        continue;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    if (!broken.isOk()) {
      item.work->complete(BAGUA_ERROR(kFailedPrecondition,
                                      "rank %d: %s not run: the communicator failed earlier: %s",
                                      rank(), item.name.c_str(), broken.message().c_str()));
      continue;
    }
    Status s = item.run(Clock::now() + options_.timeout);
    operations_.fetch_add(1, std::memory_order_relaxed);
    if (!s.isOk()) {
      s.withContext(strPrintf("rank %d: %s", rank(), item.name.c_str()));
      BAGUA_LOG_WARN(kLogCore, "host communicator failed: %s", s.toString().c_str());
      std::lock_guard<std::mutex> lock(queueMu_);
      if (broken_.isOk()) {
        broken_ = s;
      }
    }
    item.work->complete(std::move(s));
  }
}

void HostCommunicator::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (broken_.isOk()) {
      broken_ = BAGUA_ERROR(kAborted, "aborted: %s", why.c_str());
    }
  }
  transport_->abort(why);
  queueCv_.notify_all();
}

CommStats HostCommunicator::stats() const {
  CommStats s;
  s.bytesSent = transport_->bytesSent();
  s.bytesReceived = transport_->bytesReceived();
  s.operations = operations_.load(std::memory_order_relaxed);
  return s;
}

bool HostCommunicator::useTree(size_t bytes) const {
  switch (options_.algo) {
  case HostOptions::Algo::kRing:
    return false;
  case HostOptions::Algo::kTree:
    return true;
  case HostOptions::Algo::kAuto:
    break;
  }
  return bytes <= options_.treeMaxBytes;
}

uint8_t* HostCommunicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) {
    scratch_.resize(bytes);
  }
  return scratch_.data();
}

// ---- Algorithms ------------------------------------------------------------------------------

Status HostCommunicator::allReduceImpl(const void* send, void* recv, size_t count, DataType dtype,
                                       ReduceOp op, Deadline dl) {
  const size_t es = dataTypeSize(dtype);
  const size_t bytes = count * es;
  if (send != recv && bytes > 0) {
    std::memmove(recv, send, bytes);
  }
  const int n = size();
  if (n == 1 || count == 0) {
    return Status::ok();
  }
  auto* data = static_cast<uint8_t*>(recv);
  if (useTree(bytes) || count < static_cast<size_t>(n)) {
    BAGUA_RETURN_IF_ERROR(doublingAllReduce(data, count, dtype, op, dl));
  } else {
    BAGUA_RETURN_IF_ERROR(ringAllReduce(data, count, dtype, op, dl));
  }
  if (op == ReduceOp::kAvg) {
    divideBy(data, count, dtype, n);
  }
  return Status::ok();
}

Status HostCommunicator::ringAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                                       Deadline dl) {
  const int n = size();
  const int r = rank();
  const size_t es = dataTypeSize(dtype);
  std::vector<size_t> off(n), len(n);
  size_t base = count / n, rem = count % n, pos = 0;
  for (int i = 0; i < n; ++i) {
    size_t c = base + (static_cast<size_t>(i) < rem ? 1 : 0);
    off[i] = pos * es;
    len[i] = c * es;
    pos += c;
  }
  uint8_t* tmp = scratch(len[0]);
  const size_t seg = std::max(es, options_.segmentBytes / es * es);
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  // One exchange for the whole ring, pipelined across steps: the chunk reduced at step s is
  // forwarded at step s + 1 segment by segment as its reduction completes (ready[s]), and in
  // the all-gather each chunk is forwarded while it is still arriving. Receives from `prev`
  // complete in order, so step s + 1 writes tmp only after step s's segments were reduced.
  const int steps = 2 * (n - 1);
  std::vector<size_t> ready(static_cast<size_t>(steps), 0);
  std::vector<SendOp> sends(static_cast<size_t>(steps));
  std::vector<RecvOp> recvs(static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    int sendIdx, recvIdx;
    if (s < n - 1) {  // reduce-scatter: afterwards I own chunk (r + 1) % n
      sendIdx = ((r - s) % n + n) % n;
      recvIdx = ((r - s - 1) % n + n) % n;
    } else {  // all-gather, starting from the chunk I own
      const int t = s - (n - 1);
      sendIdx = ((r + 1 - t) % n + n) % n;
      recvIdx = ((r - t) % n + n) % n;
    }
    sends[s] = SendOp{next, data + off[sendIdx], len[sendIdx], s == 0 ? nullptr : &ready[s - 1]};
    size_t* done = &ready[s];
    if (s < n - 1) {
      uint8_t* dst = data + off[recvIdx];
      recvs[s] = RecvOp{prev, tmp, len[recvIdx], seg,
                        [this, dst, tmp, es, dtype, op, done](size_t o, size_t l) {
                          reducer_.reduce(dst + o, tmp + o, l / es, dtype, op);
                          *done = o + l;
                        }};
    } else {
      recvs[s] = RecvOp{prev, data + off[recvIdx], len[recvIdx], seg,
                        [done](size_t o, size_t l) { *done = o + l; }};
    }
  }
  return transport_->exchange(sends, recvs, dl);
}

Status HostCommunicator::ringAllGather(uint8_t* data, const std::vector<size_t>& offsets,
                                       const std::vector<size_t>& lengths, int have, Deadline dl) {
  const int n = size();
  const int r = rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  // `have` is the chunk I hold; at step s I forward the one I received at step s-1.
  for (int s = 0; s < n - 1; ++s) {
    const int sendIdx = ((have - s) % n + n) % n;
    const int recvIdx = ((have - s - 1) % n + n) % n;
    SendOp so{next, data + offsets[sendIdx], lengths[sendIdx]};
    RecvOp ro{prev, data + offsets[recvIdx], lengths[recvIdx], 0, nullptr};
    BAGUA_RETURN_IF_ERROR(transport_->exchange({&so, 1}, {&ro, 1}, dl));
  }
  return Status::ok();
}

Status HostCommunicator::doublingAllReduce(uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                                           Deadline dl) {
  const int n = size();
  const int r = rank();
  const size_t bytes = count * dataTypeSize(dtype);
  int p = 1;
  while (p * 2 <= n) {
    p *= 2;
  }
  const int extra = n - p;
  uint8_t* tmp = scratch(bytes);
  if (r >= p) {  // fold into r - p, then get the result back
    SendOp so{r - p, data, bytes};
    BAGUA_RETURN_IF_ERROR(transport_->exchange({&so, 1}, {}, dl));
    RecvOp ro{r - p, data, bytes, 0, nullptr};
    return transport_->exchange({}, {&ro, 1}, dl);
  }
  if (r < extra) {
    RecvOp ro{r + p, tmp, bytes, 0, nullptr};
    BAGUA_RETURN_IF_ERROR(transport_->exchange({}, {&ro, 1}, dl));
    reducer_.reduce(data, tmp, count, dtype, op);
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = r ^ mask;
    SendOp so{partner, data, bytes};
    RecvOp ro{partner, tmp, bytes, 0, nullptr};
    BAGUA_RETURN_IF_ERROR(transport_->exchange({&so, 1}, {&ro, 1}, dl));
    reducer_.reduce(data, tmp, count, dtype, op);
  }
  if (r < extra) {
    SendOp so{r + p, data, bytes};
    BAGUA_RETURN_IF_ERROR(transport_->exchange({&so, 1}, {}, dl));
  }
  return Status::ok();
}

Status HostCommunicator::treeBroadcast(uint8_t* data, size_t bytes, int root, Deadline dl) {
  const int n = size();
  const int vr = (rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      RecvOp ro{(vr - mask + root) % n, data, bytes, 0, nullptr};
      BAGUA_RETURN_IF_ERROR(transport_->exchange({}, {&ro, 1}, dl));
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  std::vector<SendOp> sends;
  while (mask > 0) {
    if (vr + mask < n) {
      sends.push_back({(vr + mask + root) % n, data, bytes});
    }
    mask >>= 1;
  }
  return transport_->exchange(sends, {}, dl);
}

// ---- Entry points ----------------------------------------------------------------------------

namespace {

Status checkBuffer(const void* p, size_t count, const char* what) {
  if (count > 0 && p == nullptr) {
    return BAGUA_ERROR(kInvalidArgument, "%s: null buffer for %zu elements", what, count);
  }
  return Status::ok();
}

}  // namespace

#define BAGUA_HOST_CHECK(expr)   \
  do {                           \
    ::bagua::Status s_ = (expr); \
    if (!s_.isOk()) {            \
      return completedWork(s_);  \
    }                            \
  } while (0)

WorkPtr HostCommunicator::allReduce(const void* send, void* recv, size_t count, DataType dtype,
                                    ReduceOp op) {
  BAGUA_HOST_CHECK(checkBuffer(send, count, "allReduce send"));
  BAGUA_HOST_CHECK(checkBuffer(recv, count, "allReduce recv"));
  return enqueue(
      strPrintf("allReduce(%zu x %s, %s)", count, dataTypeName(dtype), reduceOpName(op)),
      [=, this](Deadline dl) { return allReduceImpl(send, recv, count, dtype, op, dl); });
}

WorkPtr HostCommunicator::reduce(const void* send, void* recv, size_t count, DataType dtype,
                                 ReduceOp op, int root) {
  if (root < 0 || root >= size()) {
    return completedWork(
        BAGUA_ERROR(kInvalidArgument, "reduce: root %d outside a group of %d", root, size()));
  }
  BAGUA_HOST_CHECK(checkBuffer(send, count, "reduce send"));
  if (rank() == root) {
    BAGUA_HOST_CHECK(checkBuffer(recv, count, "reduce recv"));
  }
  return enqueue(strPrintf("reduce(%zu x %s, %s, root %d)", count, dataTypeName(dtype),
                           reduceOpName(op), root),
                 [=, this](Deadline dl) -> Status {
                   if (rank() == root) {
                     return allReduceImpl(send, recv, count, dtype, op, dl);
                   }
                   // Non-roots reduce into a private buffer (the ring's bandwidth is the same as a
                   // reduce-scatter + gather, and the schedule stays identical on every rank).
                   scratch2_.resize(count * dataTypeSize(dtype));
                   return allReduceImpl(send, scratch2_.data(), count, dtype, op, dl);
                 });
}

WorkPtr HostCommunicator::reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                        ReduceOp op) {
  BAGUA_HOST_CHECK(checkBuffer(send, count, "reduceScatter send"));
  BAGUA_HOST_CHECK(checkBuffer(recv, count, "reduceScatter recv"));
  return enqueue(
      strPrintf("reduceScatter(%zu x %s, %s)", count, dataTypeName(dtype), reduceOpName(op)),
      [=, this](Deadline dl) -> Status {
        const int n = size();
        const int r = rank();
        const size_t es = dataTypeSize(dtype);
        const size_t block = count * es;
        if (count == 0) {
          return Status::ok();
        }
        scratch2_.resize(block * n);
        uint8_t* work = scratch2_.data();
        std::memcpy(work, send, block * n);
        if (n > 1 && useTree(block * n)) {
          BAGUA_RETURN_IF_ERROR(doublingAllReduce(work, count * n, dtype, op, dl));
        } else if (n > 1) {
          uint8_t* tmp = scratch(block);
          const size_t seg = std::max(es, options_.segmentBytes / es * es);
          const int next = (r + 1) % n;
          const int prev = (r - 1 + n) % n;
          // Shifted so that I end owning block r.
          for (int s = 0; s < n - 1; ++s) {
            const int sendIdx = ((r - s - 1) % n + n) % n;
            const int recvIdx = ((r - s - 2) % n + n) % n;
            SendOp so{next, work + sendIdx * block, block};
            uint8_t* dst = work + recvIdx * block;
            RecvOp ro{prev, tmp, block, seg, [&, dst](size_t o, size_t l) {
                        reducer_.reduce(dst + o, tmp + o, l / es, dtype, op);
                      }};
            BAGUA_RETURN_IF_ERROR(transport_->exchange({&so, 1}, {&ro, 1}, dl));
          }
        }
        std::memcpy(recv, work + r * block, block);
        if (op == ReduceOp::kAvg) {
          divideBy(recv, count, dtype, n);
        }
        return Status::ok();
      });
}

WorkPtr HostCommunicator::allGather(const void* send, void* recv, size_t count, DataType dtype) {
  BAGUA_HOST_CHECK(checkBuffer(send, count, "allGather send"));
  BAGUA_HOST_CHECK(checkBuffer(recv, count, "allGather recv"));
  return enqueue(strPrintf("allGather(%zu x %s)", count, dataTypeName(dtype)),
                 [=, this](Deadline dl) -> Status {
                   const int n = size();
                   const size_t block = count * dataTypeSize(dtype);
                   auto* out = static_cast<uint8_t*>(recv);
                   if (block == 0) {
                     return Status::ok();
                   }
                   std::memmove(out + rank() * block, send, block);
                   std::vector<size_t> off(n), len(n, block);
                   for (int i = 0; i < n; ++i) {
                     off[i] = i * block;
                   }
                   return ringAllGather(out, off, len, rank(), dl);
                 });
}

WorkPtr HostCommunicator::broadcast(void* buffer, size_t count, DataType dtype, int root) {
  if (root < 0 || root >= size()) {
    return completedWork(
        BAGUA_ERROR(kInvalidArgument, "broadcast: root %d outside a group of %d", root, size()));
  }
  BAGUA_HOST_CHECK(checkBuffer(buffer, count, "broadcast"));
  return enqueue(strPrintf("broadcast(%zu x %s, root %d)", count, dataTypeName(dtype), root),
                 [=, this](Deadline dl) -> Status {
                   const int n = size();
                   const size_t es = dataTypeSize(dtype);
                   const size_t bytes = count * es;
                   auto* data = static_cast<uint8_t*>(buffer);
                   if (n == 1 || bytes == 0) {
                     return Status::ok();
                   }
                   if (useTree(bytes) || count < static_cast<size_t>(n)) {
                     return treeBroadcast(data, bytes, root, dl);
                   }
                   // Scatter from the root, then ring all-gather.
                   std::vector<size_t> off(n), len(n);
                   size_t base = count / n, rem = count % n, pos = 0;
                   for (int i = 0; i < n; ++i) {
                     size_t c = base + (static_cast<size_t>(i) < rem ? 1 : 0);
                     off[i] = pos * es;
                     len[i] = c * es;
                     pos += c;
                   }
                   if (rank() == root) {
                     std::vector<SendOp> sends;
                     for (int i = 0; i < n; ++i) {
                       if (i != root) {
                         sends.push_back({i, data + off[i], len[i]});
                       }
                     }
                     BAGUA_RETURN_IF_ERROR(transport_->exchange(sends, {}, dl));
                   } else {
                     RecvOp ro{root, data + off[rank()], len[rank()], 0, nullptr};
                     BAGUA_RETURN_IF_ERROR(transport_->exchange({}, {&ro, 1}, dl));
                   }
                   return ringAllGather(data, off, len, rank(), dl);
                 });
}

WorkPtr HostCommunicator::allToAll(const void* send, void* recv, size_t count, DataType dtype) {
  BAGUA_HOST_CHECK(checkBuffer(send, count, "allToAll send"));
  BAGUA_HOST_CHECK(checkBuffer(recv, count, "allToAll recv"));
  if (send == recv && count > 0) {
    return completedWork(
        BAGUA_ERROR(kInvalidArgument, "allToAll: send and recv must not be the same buffer"));
  }
  return enqueue(
      strPrintf("allToAll(%zu x %s)", count, dataTypeName(dtype)),
      [=, this](Deadline dl) -> Status {
        const int n = size();
        const size_t block = count * dataTypeSize(dtype);
        std::vector<SendOp> sends;
        std::vector<RecvOp> recvs;
        for (int i = 0; i < n; ++i) {
          sends.push_back({i, static_cast<const uint8_t*>(send) + i * block, block});
          recvs.push_back({i, static_cast<uint8_t*>(recv) + i * block, block, 0, nullptr});
        }
        return transport_->exchange(sends, recvs, dl);
      });
}

WorkPtr HostCommunicator::send(const void* buffer, size_t count, DataType dtype, int peer) {
  return sendRecv(buffer, count, peer, nullptr, 0, -1, dtype);
}

WorkPtr HostCommunicator::recv(void* buffer, size_t count, DataType dtype, int peer) {
  return sendRecv(nullptr, 0, -1, buffer, count, peer, dtype);
}

WorkPtr HostCommunicator::sendRecv(const void* sendBuf, size_t sendCount, int sendPeer,
                                   void* recvBuf, size_t recvCount, int recvPeer, DataType dtype) {
  if ((sendPeer >= size() || sendPeer < -1) || (recvPeer >= size() || recvPeer < -1)) {
    return completedWork(BAGUA_ERROR(kInvalidArgument,
                                     "send/recv: peer %d / %d outside a group of %d", sendPeer,
                                     recvPeer, size()));
  }
  BAGUA_HOST_CHECK(checkBuffer(sendBuf, sendPeer >= 0 ? sendCount : 0, "send"));
  BAGUA_HOST_CHECK(checkBuffer(recvBuf, recvPeer >= 0 ? recvCount : 0, "recv"));
  return enqueue(strPrintf("sendRecv(%zu x %s to %d, %zu from %d)", sendCount, dataTypeName(dtype),
                           sendPeer, recvCount, recvPeer),
                 [=, this](Deadline dl) -> Status {
                   const size_t es = dataTypeSize(dtype);
                   SendOp so{sendPeer, sendBuf, sendCount * es};
                   RecvOp ro{recvPeer, recvBuf, recvCount * es, 0, nullptr};
                   return transport_->exchange(
                       sendPeer >= 0 ? std::span<const SendOp>(&so, 1) : std::span<const SendOp>(),
                       recvPeer >= 0 ? std::span<RecvOp>(&ro, 1) : std::span<RecvOp>(), dl);
                 });
}

WorkPtr HostCommunicator::barrier() {
  return enqueue("barrier", [this](Deadline dl) -> Status {
    uint8_t token = 1;
    if (size() == 1) {
      return Status::ok();
    }
    return doublingAllReduce(&token, 1, DataType::kU8, ReduceOp::kMax, dl);
  });
}

// ---- Live tuning -------------------------------------------------------------------------------

namespace {

constexpr size_t kMinSegment = 4096;
constexpr size_t kMaxSegment = size_t{1} << 30;

// Every rank decides from the same exchanged values, so every rank reaches the same verdict.
// Per rank (kFields each): requested segment, streams, chunk; streams its transport established.
constexpr int kFields = 4;

Status judgeTuning(const std::vector<uint64_t>& all, int n) {
  for (int r = 1; r < n; ++r) {
    const uint64_t* v = &all[static_cast<size_t>(kFields * r)];
    if (v[0] != all[0] || v[1] != all[1] || v[2] != all[2]) {
      return BAGUA_ERROR(
          kInvalidArgument,
          "setHostTuning: rank %d asked for segment %llu / streams %llu / chunk "
          "%llu but rank 0 for %llu / %llu / %llu; every rank must pass the same "
          "values at the same point of the operation sequence (nothing applied)",
          r, static_cast<unsigned long long>(v[0]), static_cast<unsigned long long>(v[1]),
          static_cast<unsigned long long>(v[2]), static_cast<unsigned long long>(all[0]),
          static_cast<unsigned long long>(all[1]), static_cast<unsigned long long>(all[2]));
    }
  }
  const uint64_t seg = all[0];
  if (seg != 0 && (seg < kMinSegment || seg > kMaxSegment)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "setHostTuning: segment %llu bytes outside 4 KiB .. 1 GiB (nothing applied)",
                       static_cast<unsigned long long>(seg));
  }
  const uint64_t chunk = all[2];
  if (chunk != 0 && (chunk < kMinSegment || chunk > kMaxSegment)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "setHostTuning: engine chunk %llu bytes outside 4 KiB .. 1 GiB (nothing "
                       "applied)",
                       static_cast<unsigned long long>(chunk));
  }
  const uint64_t streams = all[1];
  if (streams != 0 || chunk != 0) {
    for (int r = 0; r < n; ++r) {
      const uint64_t est = all[static_cast<size_t>(kFields * r + 3)];
      if (est == 0) {
        return BAGUA_ERROR(kFailedPrecondition,
                           "setHostTuning: rank %d does not use the engine transport, so its "
                           "stream count / chunk size cannot be set (BAGUA_HOST_TRANSPORT=engine; "
                           "nothing applied)",
                           r);
      }
      if (streams > est) {
        return BAGUA_ERROR(kInvalidArgument,
                           "setHostTuning: %llu active streams but rank %d established %llu per "
                           "connection (BAGUA_HOST_NET_STREAMS; nothing applied)",
                           static_cast<unsigned long long>(streams), r,
                           static_cast<unsigned long long>(est));
      }
    }
  }
  return Status::ok();
}

}  // namespace

WorkPtr HostCommunicator::setTuning(const HostTuning& tuning, std::shared_ptr<Status> verdict) {
  // Nothing is refused here: a bad value is judged after the exchange, by every rank alike, so
  // that one rank's mistake cannot leave the others waiting in the exchange.
  return enqueue(
      strPrintf("setTuning(segment %zu, streams %d, chunk %zu)", tuning.segmentBytes,
                tuning.engineStreams, tuning.engineChunkBytes),
      [=, this](Deadline dl) -> Status {
        const int n = size();
        constexpr size_t kRecord = kFields * sizeof(uint64_t);
        std::vector<uint64_t> all(static_cast<size_t>(kFields * n));
        uint64_t* mine = &all[static_cast<size_t>(kFields * rank())];
        mine[0] = tuning.segmentBytes;
        mine[1] = static_cast<uint64_t>(static_cast<int64_t>(tuning.engineStreams));
        mine[2] = tuning.engineChunkBytes;
        mine[3] = static_cast<uint64_t>(transport_->establishedStreams());
        if (n > 1) {
          std::vector<size_t> off(n), len(n, kRecord);
          for (int i = 0; i < n; ++i) {
            off[i] = i * kRecord;
          }
          BAGUA_RETURN_IF_ERROR(
              ringAllGather(reinterpret_cast<uint8_t*>(all.data()), off, len, rank(), dl));
        }
        Status v = judgeTuning(all, n);
        if (v.isOk() && (all[1] != 0 || all[2] != 0)) {
          v = transport_->setEngineLive(static_cast<int>(all[1]), all[2]);
        }
        if (v.isOk() && all[0] != 0) {
          options_.segmentBytes = all[0];
          transport_->setPieceBytes(all[0]);
          segmentNow_.store(all[0], std::memory_order_relaxed);
        }
        if (v.isOk()) {
          BAGUA_LOG_DEBUG(kLogCore, "rank %d: host tuning now segment %zu bytes, %d active streams",
                          rank(), options_.segmentBytes, transport_->activeStreams());
        }
        *verdict = std::move(v);
        return Status::ok();
      });
}

HostTuningState HostCommunicator::tuning() const {
  HostTuningState st;
  st.segmentBytes = segmentNow_.load(std::memory_order_relaxed);
  st.establishedStreams = transport_->establishedStreams();
  st.activeStreams = transport_->activeStreams();
  st.engineChunkBytes = transport_->engineChunkBytes();
  st.transport = st.establishedStreams > 0 ? "engine" : "socket";
  return st;
}

}  // namespace host

Status setHostTuning(Communicator& comm, const HostTuning& tuning,
                     std::chrono::milliseconds timeout) {
  auto* hc = dynamic_cast<host::HostCommunicator*>(&comm);
  if (hc == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "setHostTuning: the communicator uses the %s backend, not the host backend",
                       comm.backendName().c_str());
  }
  auto verdict = std::make_shared<Status>();
  WorkPtr w = hc->setTuning(tuning, verdict);
  BAGUA_RETURN_IF_ERROR(w->wait(timeout));
  return *verdict;
}

Result<HostTuningState> hostTuning(const Communicator& comm) {
  const auto* hc = dynamic_cast<const host::HostCommunicator*>(&comm);
  if (hc == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "hostTuning: the communicator uses the %s backend, not the host backend",
                       comm.backendName().c_str());
  }
  return hc->tuning();
}

Status setHostTuning(ProcessGroup& group, const HostTuning& tuning,
                     std::chrono::milliseconds timeout) {
  // The stream count goes to the communicators on the engine transport only (a node's intra
  // group may run over shared memory while the global one uses the engine); each communicator's
  // transport is chosen collectively, so every rank of it skips or applies alike.
  std::vector<Communicator*> comms = {&group.global(), group.intraNode(), group.interNode()};
  bool anyEngine = false;
  for (Communicator* c : comms) {
    if (c != nullptr) {
      BAGUA_ASSIGN_OR_RETURN(HostTuningState st, hostTuning(*c));
      anyEngine = anyEngine || st.establishedStreams > 0;
    }
  }
  if ((tuning.engineStreams != 0 || tuning.engineChunkBytes != 0) && !anyEngine) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "setHostTuning: no communicator of the group uses the engine transport, "
                       "so there is no stream count / chunk size to set "
                       "(BAGUA_HOST_TRANSPORT=engine)");
  }
  for (Communicator* c : comms) {
    if (c == nullptr) {
      continue;
    }
    HostTuning t = tuning;
    BAGUA_ASSIGN_OR_RETURN(HostTuningState st, hostTuning(*c));
    if (st.establishedStreams == 0) {
      t.engineStreams = 0;
      t.engineChunkBytes = 0;
    }
    BAGUA_RETURN_IF_ERROR(setHostTuning(*c, t, timeout));
  }
  return Status::ok();
}

Result<HostTuningState> hostTuning(ProcessGroup& group) {
  return hostTuning(group.global());
}

}  // namespace bagua::core
