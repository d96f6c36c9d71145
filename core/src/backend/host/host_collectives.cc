// HostCommunicator's collectives: the entry points check their arguments and enqueue; the
// algorithms run on the worker thread (host_communicator.cc) over the Transport seam.
#include <algorithm>
#include <cstring>

#include "backend/host/host_communicator.h"

namespace bagua::core::host {

Chunks splitCount(size_t count, int n, size_t elementSize) {
  Chunks c;
  c.offsets.resize(static_cast<size_t>(n));
  c.lengths.resize(static_cast<size_t>(n));
  const size_t base = count / n;
  const size_t rem = count % n;
  size_t pos = 0;
  for (int i = 0; i < n; ++i) {
    const size_t elements = base + (static_cast<size_t>(i) < rem ? 1 : 0);
    c.offsets[i] = pos * elementSize;
    c.lengths[i] = elements * elementSize;
    pos += elements;
  }
  return c;
}

Chunks equalChunks(int n, size_t bytes) {
  Chunks c;
  c.offsets.resize(static_cast<size_t>(n));
  c.lengths.assign(static_cast<size_t>(n), bytes);
  for (int i = 0; i < n; ++i) {
    c.offsets[i] = i * bytes;
  }
  return c;
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
  const Chunks chunks = splitCount(count, n, es);
  const std::vector<size_t>& off = chunks.offsets;
  const std::vector<size_t>& len = chunks.lengths;
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

Status HostCommunicator::ringAllGather(uint8_t* data, const Chunks& chunks, int have, Deadline dl) {
  const int n = size();
  const int r = rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  // `have` is the chunk I hold; at step s I forward the one I received at step s-1.
  for (int s = 0; s < n - 1; ++s) {
    const int sendIdx = ((have - s) % n + n) % n;
    const int recvIdx = ((have - s - 1) % n + n) % n;
    SendOp so{next, data + chunks.offsets[sendIdx], chunks.lengths[sendIdx]};
    RecvOp ro{prev, data + chunks.offsets[recvIdx], chunks.lengths[recvIdx], 0, nullptr};
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
                   return ringAllGather(out, equalChunks(n, block), rank(), dl);
                 });
}

WorkPtr HostCommunicator::broadcast(void* buffer, size_t count, DataType dtype, int root) {
  if (root < 0 || root >= size()) {
    return completedWork(
        BAGUA_ERROR(kInvalidArgument, "broadcast: root %d outside a group of %d", root, size()));
  }
  BAGUA_HOST_CHECK(checkBuffer(buffer, count, "broadcast"));
  return enqueue(
      strPrintf("broadcast(%zu x %s, root %d)", count, dataTypeName(dtype), root),
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
        const Chunks chunks = splitCount(count, n, es);
        if (rank() == root) {
          std::vector<SendOp> sends;
          for (int i = 0; i < n; ++i) {
            if (i != root) {
              sends.push_back({i, data + chunks.offsets[i], chunks.lengths[i]});
            }
          }
          BAGUA_RETURN_IF_ERROR(transport_->exchange(sends, {}, dl));
        } else {
          RecvOp ro{root, data + chunks.offsets[rank()], chunks.lengths[rank()], 0, nullptr};
          BAGUA_RETURN_IF_ERROR(transport_->exchange({}, {&ro, 1}, dl));
        }
        return ringAllGather(data, chunks, rank(), dl);
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

}  // namespace bagua::core::host
