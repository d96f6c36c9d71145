// The host Transport over the Bagua-Net multi-stream TCP engine (net_plugin's bagua_net_engine):
// one engine connection per ordered pair of ranks (my SendComm to each peer, my RecvComm from
// each peer), every message cut into pieces of `pieceBytes` so that a receive reports segments
// while the rest is still in flight and a ring can forward a piece as soon as it is reduced.
//
// Both sides cut a message by the same rule (pieces of pieceBytes, the tail shorter), so the k-th
// isend of a pair matches the k-th irecv; pieceBytes is published with each connection handle
// and a rank that sees another value fails set-up, naming both.
//
// Waiting: the comms share one net::Notifier that their helper threads bump on every completion,
// so the calling thread sleeps on it (bounded, 50 ms at a time to see abort and the deadline)
// instead of spinning against the helper threads for the two cores.
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/host/control_wire.h"
#include "backend/host/transport.h"
#include "bagua/base/crypto.h"
#include "bagua/base/logging.h"
#include "bagua/core/job_key.h"
#include "bagua/core/params.h"
#include "bagua/net/engine.h"

namespace bagua::core::host {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxInFlight = 16;  // per comm and direction (the engine holds >= 32)

std::chrono::milliseconds msUntil(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

class EngineTransport final : public TransportBase {
 public:
  EngineTransport(int rank, int size, size_t pieceBytes)
      : TransportBase(rank, size), piece_(pieceBytes), sends_(size), recvs_(size) {}
  ~EngineTransport() override = default;
  EngineTransport(const EngineTransport&) = delete;
  EngineTransport& operator=(const EngineTransport&) = delete;

  void abort(const std::string& why) override {
    markAborted(why);
    for (auto& c : sends_) {
      if (c) {
        c->abort(why);
      }
    }
    for (auto& c : recvs_) {
      if (c) {
        c->abort(why);
      }
    }
    notifier_.notify();
  }

  Status exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs,
                  Deadline deadline) override {
    BAGUA_RETURN_IF_ERROR(startExchange(sends, recvs));
    Batch batch(*this);
    return runBatch(batch, deadline);
  }

  // Worker thread, between exchanges: both ends cut by piece_, and the communicator applies a
  // change at the same point of the operation sequence on every rank.
  void setPieceBytes(size_t bytes) override { piece_ = std::max<size_t>(bytes, 1); }
  int establishedStreams() const override { return streams_; }
  int activeStreams() const override { return active_.load(std::memory_order_relaxed); }
  uint64_t engineChunkBytes() const override { return chunk_.load(std::memory_order_relaxed); }
  uint64_t engineMinChunkBytes() const override { return minChunk_; }
  // Sender side only (the engine's receiver takes chunks of any size from any stream), so no
  // agreement is needed; set on every send comm of this rank.
  Status setEngineLive(int streams, uint64_t chunkBytes) override {
    if (streams < 0 || streams > streams_) {
      return BAGUA_ERROR(kInvalidArgument,
                         "active streams %d outside 1..%d (the streams established per "
                         "connection, BAGUA_HOST_NET_STREAMS)",
                         streams, streams_);
    }
    const int a = streams > 0 ? streams : active_.load(std::memory_order_relaxed);
    const uint64_t c = chunkBytes > 0 ? chunkBytes : chunk_.load(std::memory_order_relaxed);
    for (auto& comm : sends_) {
      if (comm) {
        BAGUA_RETURN_IF_ERROR(comm->setLiveSettings({a, c, c}));
      }
    }
    active_.store(a, std::memory_order_relaxed);
    chunk_.store(c, std::memory_order_relaxed);
    return Status::ok();
  }

  Status connect(Store& store, const EngineTransportOptions& options);
  Status authenticate(const EngineTransportOptions& options, Deadline deadline);

 private:
  // One exchange's remote ops (TransportBase::runBatch's batch): every op cut into pieces of
  // piece_ bytes, up to kMaxInFlight pieces per peer and direction posted to the engine at once,
  // in order.
  class Batch {
   public:
    explicit Batch(EngineTransport& t);
    // Posts what may be posted and collects what completed, peer by peer.
    [[nodiscard]] Status step(bool* progress);
    bool finished() const { return pending_ == 0; }
    bool waitingOn(int p) const {
      const PeerQueues& pq = q_[p];
      return !pq.sendFlight.empty() || !pq.recvFlight.empty() || pq.sendHead < pq.sendOps.size() ||
             pq.recvHead < pq.recvOps.size();
    }
    // Sleeps on the notifier the comms' helper threads bump on every completion.
    [[nodiscard]] Status wait(Deadline until) {
      t_.notifier_.waitChange(seen_, until);
      return Status::ok();
    }

   private:
    struct SendState {
      const SendOp* op;
      size_t posted = 0;  // bytes handed to the engine
      size_t done = 0;    // bytes whose isend completed
      size_t limit() const {
        return op->ready != nullptr ? std::min(*op->ready, op->len) : op->len;
      }
    };
    struct RecvState {
      explicit RecvState(RecvOp* o) : op(o) {}
      RecvOp* op;
      size_t posted = 0;
      size_t prefix = 0;        // bytes received contiguously from offset 0
      size_t reported = 0;      // bytes passed to onSegment
      std::vector<bool> piece;  // completed pieces
      size_t nDone = 0;         // completed pieces
    };
    struct InFlight {
      net::Request* req;
      size_t state;  // index into ss_ / rs_
      size_t piece;  // piece index within the op
      size_t bytes;
    };
    struct PeerQueues {
      std::vector<size_t> sendOps;  // indices into ss_, in posting order
      std::vector<size_t> recvOps;
      size_t sendHead = 0;  // first op with bytes left to post
      size_t recvHead = 0;
      std::vector<InFlight> sendFlight;
      std::vector<InFlight> recvFlight;
    };

    [[nodiscard]] Status postSends(int p);
    [[nodiscard]] Status postRecvs(int p);
    [[nodiscard]] Status collectSends(int p, bool* progress);
    [[nodiscard]] Status collectRecvs(int p, bool* progress);

    EngineTransport& t_;
    std::vector<SendState> ss_;
    std::vector<RecvState> rs_;
    std::vector<PeerQueues> q_;
    size_t pending_ = 0;  // ops not finished
    uint64_t seen_ = 0;   // the notifier's epoch when the last step began
  };

  size_t pieces(size_t len) const { return (len + piece_ - 1) / piece_; }
  Status peerError(const Status& s, const char* what, int peer) const {
    if (s.code() == StatusCode::kAborted) {
      return unlessAborted(s);
    }
    return unlessAborted(
        Status(s.code() == StatusCode::kSystemError ? StatusCode::kRemoteError : s.code(),
               strPrintf("rank %d: %s rank %d failed (did it exit or fail?): %s", rank_, what, peer,
                         s.message().c_str())));
  }

  size_t piece_;     // worker thread only
  int streams_ = 1;  // established per connection (set by connect)
  std::atomic<int> active_{1};
  std::atomic<uint64_t> chunk_{0};                     // 0: the engine's parameters
  uint64_t minChunk_ = 0;                              // the parameters' (set by connect)
  net::Notifier notifier_;                             // outlives the comms (declared before them)
  std::vector<std::unique_ptr<net::SendComm>> sends_;  // indexed by peer; null for self
  std::vector<std::unique_ptr<net::RecvComm>> recvs_;
};

Status EngineTransport::connect(Store& store, const EngineTransportOptions& options) {
  const Deadline deadline = Clock::now() + options.connectTimeout;
  BAGUA_ASSIGN_OR_RETURN(net::EngineOptions eo, net::EngineOptions::fromParams());
  eo.nStreams = std::clamp(options.streams, 1, net::kMaxStreams);
  streams_ = eo.nStreams;
  minChunk_ = eo.minChunkBytes;
  active_.store(eo.nStreams, std::memory_order_relaxed);
  eo.socketBufferBytes = options.socketBuffer;
  eo.timeoutMs = std::max<int64_t>(eo.timeoutMs, 1000);
  BAGUA_RETURN_IF_ERROR(eo.validate());
  std::string addr = options.listenAddress.empty() ? store.localAddress() : options.listenAddress;
  BAGUA_ASSIGN_OR_RETURN(net::SocketAddress bindAddr, net::SocketAddress::parse(addr));

  // One listener per peer that sends to me, published as "eng/<me>/<peer>": handle + pieceBytes.
  std::vector<std::unique_ptr<net::Listener>> listeners(size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) {
      continue;
    }
    BAGUA_ASSIGN_OR_RETURN(listeners[p], net::Listener::create(bindAddr, eo));
    const net::Handle& h = listeners[p]->handle();
    Bytes value(h.begin(), h.end());
    const uint64_t piece = piece_;
    value.resize(h.size() + sizeof(piece));
    std::memcpy(value.data() + h.size(), &piece, sizeof(piece));
    BAGUA_RETURN_IF_ERROR(store.set(strPrintf("eng/%d/%d", rank_, p), value));
  }
  std::vector<std::unique_ptr<net::Connector>> connectors(size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) {
      continue;
    }
    BAGUA_ASSIGN_OR_RETURN(Bytes value,
                           store.get(strPrintf("eng/%d/%d", p, rank_), msUntil(deadline)));
    net::Handle h{};
    uint64_t piece = 0;
    if (value.size() != h.size() + sizeof(piece)) {
      return BAGUA_ERROR(kRemoteError, "rank %d published a bad engine handle (%zu bytes)", p,
                         value.size());
    }
    std::memcpy(h.data(), value.data(), h.size());
    std::memcpy(&piece, value.data() + h.size(), sizeof(piece));
    if (piece != piece_) {
      return BAGUA_ERROR(kInvalidArgument,
                         "rank %d cuts messages into %llu-byte pieces but rank %d into %zu: set "
                         "BAGUA_HOST_SEGMENT_BYTES to the same value on every rank",
                         p, static_cast<unsigned long long>(piece), rank_, piece_);
    }
    BAGUA_ASSIGN_OR_RETURN(connectors[p], net::Connector::start(h, eo));
  }
  int missing = 2 * (size_ - 1);
  while (missing > 0) {
    bool progress = false;
    for (int p = 0; p < size_; ++p) {
      if (connectors[p] && !sends_[p]) {
        Result<std::unique_ptr<net::SendComm>> c = connectors[p]->poll();
        if (!c.isOk()) {
          return BAGUA_ERROR(kUnavailable, "rank %d: cannot connect to rank %d: %s", rank_, p,
                             c.status().message().c_str());
        }
        if (*c) {
          sends_[p] = std::move(*c);
          sends_[p]->setNotifier(&notifier_);
          connectors[p].reset();
          --missing;
          progress = true;
        }
      }
      if (listeners[p] && !recvs_[p]) {
        Result<std::unique_ptr<net::RecvComm>> c = listeners[p]->accept();
        if (!c.isOk()) {
          return c.takeStatus();
        }
        if (*c) {
          recvs_[p] = std::move(*c);
          recvs_[p]->setNotifier(&notifier_);
          listeners[p].reset();
          --missing;
          progress = true;
        }
      }
    }
    if (missing == 0) {
      break;
    }
    if (Clock::now() >= deadline) {
      std::string who;
      for (int p = 0; p < size_; ++p) {
        if (p != rank_ && (!sends_[p] || !recvs_[p])) {
          who += strPrintf("%s%d", who.empty() ? "" : ",", p);
        }
      }
      return BAGUA_ERROR(kDeadlineExceeded,
                         "rank %d: engine connections with ranks [%s] not made within the "
                         "rendezvous timeout",
                         rank_, who.c_str());
    }
    if (!progress) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return authenticate(options, deadline);
}

// Each connection pair proves the job key before any data moves (control_wire.h): my challenge
// to every peer over my SendComm, its answer over its connection to me. The engine's own hello
// already carried the listener's nonce, which only readers of the (authenticated) store know;
// this makes the key itself the proof, so a process that learnt a handle still cannot join.
Status EngineTransport::authenticate(const EngineTransportOptions& options, Deadline deadline) {
  JobKey key;
  if (options.key.has_value()) {
    key = *options.key;
  } else {
    BAGUA_ASSIGN_OR_RETURN(key, jobKeyFromParams());
  }
  const Digest ek = key.derive("engine");
  HmacSha256 engineKey(ek.data(), ek.size());
  struct PeerAuth {
    wire::Challenge mine{};
    wire::Challenge theirs{};
    Digest answer{};       // to their challenge
    Digest theirAnswer{};  // to mine
  };
  std::vector<PeerAuth> auth(size_);
  // One batch of four messages per peer, matched in posting order on each comm: challenge out,
  // challenge in, then the answers.
  auto run = [&](auto post) -> Status {
    std::vector<net::Request*> reqs;
    std::vector<int> who;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) {
        continue;
      }
      Status s = post(p, reqs);
      if (!s.isOk()) {
        return peerError(s, "authenticating with", p);
      }
      who.push_back(p);
      who.push_back(p);
    }
    size_t done = 0;
    std::vector<bool> finished(reqs.size(), false);
    while (done < reqs.size()) {
      const uint64_t seen = notifier_.epoch();
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (finished[i]) {
          continue;
        }
        bool ok = false;
        size_t got = 0;
        Status st = reqs[i]->test(&ok, &got);
        if (!st.isOk()) {
          return peerError(st, "authenticating with", who[i]);
        }
        if (ok) {
          finished[i] = true;
          ++done;
        }
      }
      if (done == reqs.size()) {
        break;
      }
      if (Clock::now() >= deadline) {
        return BAGUA_ERROR(kDeadlineExceeded,
                           "rank %d: engine connections made, but the peers did not answer the "
                           "key challenge within the rendezvous timeout",
                           rank_);
      }
      notifier_.waitChange(seen, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
    }
    return Status::ok();
  };
  for (PeerAuth& a : auth) {
    BAGUA_RETURN_IF_ERROR(randomBytes(a.mine.data(), a.mine.size()));
  }
  BAGUA_RETURN_IF_ERROR(run([&](int p, std::vector<net::Request*>& reqs) -> Status {
    BAGUA_ASSIGN_OR_RETURN(net::Request * out,
                           sends_[p]->isend(auth[p].mine.data(), auth[p].mine.size()));
    BAGUA_ASSIGN_OR_RETURN(net::Request * in,
                           recvs_[p]->irecv(auth[p].theirs.data(), auth[p].theirs.size()));
    reqs.push_back(out);
    reqs.push_back(in);
    return Status::ok();
  }));
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) {
      auth[p].answer = wire::engineProof(engineKey, static_cast<uint32_t>(rank_),
                                         static_cast<uint32_t>(p), auth[p].theirs);
    }
  }
  BAGUA_RETURN_IF_ERROR(run([&](int p, std::vector<net::Request*>& reqs) -> Status {
    BAGUA_ASSIGN_OR_RETURN(net::Request * out,
                           sends_[p]->isend(auth[p].answer.data(), auth[p].answer.size()));
    BAGUA_ASSIGN_OR_RETURN(net::Request * in, recvs_[p]->irecv(auth[p].theirAnswer.data(),
                                                               auth[p].theirAnswer.size()));
    reqs.push_back(out);
    reqs.push_back(in);
    return Status::ok();
  }));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) {
      continue;
    }
    const Digest want = wire::engineProof(engineKey, static_cast<uint32_t>(p),
                                          static_cast<uint32_t>(rank_), auth[p].mine);
    if (!constantTimeEqual(want.data(), auth[p].theirAnswer.data(), want.size())) {
      const std::string from = recvs_[p]->peer().toString();
      BAGUA_LOG_WARN(kLogCore,
                     "rank %d: the engine connection from %s, made with rank %d's handle, did not "
                     "prove the job key",
                     rank_, from.c_str(), p);
      return BAGUA_ERROR(kFailedPrecondition,
                         "rank %d: the engine connection from %s claiming rank %d did not prove "
                         "the job key (a process that learnt rank %d's engine handle, or "
                         "BAGUA_JOB_KEY differs between ranks)",
                         rank_, from.c_str(), p, rank_);
    }
  }
  return Status::ok();
}

EngineTransport::Batch::Batch(EngineTransport& t) : t_(t), q_(t.size_) {
  ss_.reserve(t.remoteSends_.size());
  rs_.reserve(t.remoteRecvs_.size());
  for (const SendOp* s : t.remoteSends_) {
    q_[s->peer].sendOps.push_back(ss_.size());
    ss_.push_back({s});
  }
  for (RecvOp* r : t.remoteRecvs_) {
    q_[r->peer].recvOps.push_back(rs_.size());
    rs_.emplace_back(r);
    rs_.back().piece.assign(t.pieces(r->len), false);
  }
  pending_ = ss_.size() + rs_.size();
}

Status EngineTransport::Batch::step(bool* progress) {
  // Before anything is tested: a completion after this is a change that wait() sees.
  seen_ = t_.notifier_.epoch();
  for (int p = 0; p < t_.size_; ++p) {
    BAGUA_RETURN_IF_ERROR(postSends(p));
    BAGUA_RETURN_IF_ERROR(postRecvs(p));
    BAGUA_RETURN_IF_ERROR(collectSends(p, progress));
    BAGUA_RETURN_IF_ERROR(collectRecvs(p, progress));
  }
  return Status::ok();
}

// Posts the sends whose bytes are ready, in order.
Status EngineTransport::Batch::postSends(int p) {
  PeerQueues& pq = q_[p];
  const size_t piece = t_.piece_;
  while (pq.sendHead < pq.sendOps.size() &&
         pq.sendFlight.size() < static_cast<size_t>(kMaxInFlight)) {
    SendState& s = ss_[pq.sendOps[pq.sendHead]];
    const size_t len = std::min(piece, s.op->len - s.posted);
    if (s.posted + len > s.limit()) {
      break;  // the next piece is still arriving (ring forwarding)
    }
    Result<net::Request*> r =
        t_.sends_[p]->isend(static_cast<const uint8_t*>(s.op->data) + s.posted, len);
    if (!r.isOk()) {
      if (r.status().code() == StatusCode::kUnavailable) {
        break;
      }
      return t_.peerError(r.status(), "send to", p);
    }
    pq.sendFlight.push_back({*r, pq.sendOps[pq.sendHead], s.posted / piece, len});
    s.posted += len;
    if (s.posted == s.op->len) {
      ++pq.sendHead;
    }
  }
  return Status::ok();
}

Status EngineTransport::Batch::postRecvs(int p) {
  PeerQueues& pq = q_[p];
  const size_t piece = t_.piece_;
  while (pq.recvHead < pq.recvOps.size() &&
         pq.recvFlight.size() < static_cast<size_t>(kMaxInFlight)) {
    // A receive's pieces are posted only once the previous receive from this peer completed and
    // was reported: ops may share a buffer (the ring reduces each step's chunk out of one scratch
    // buffer), exactly as a byte stream would deliver them.
    if (pq.recvHead > 0) {
      const RecvState& prevOp = rs_[pq.recvOps[pq.recvHead - 1]];
      if (prevOp.nDone < prevOp.piece.size()) {
        break;
      }
    }
    RecvState& rcv = rs_[pq.recvOps[pq.recvHead]];
    const size_t len = std::min(piece, rcv.op->len - rcv.posted);
    Result<net::Request*> r =
        t_.recvs_[p]->irecv(static_cast<uint8_t*>(rcv.op->data) + rcv.posted, len);
    if (!r.isOk()) {
      if (r.status().code() == StatusCode::kUnavailable) {
        break;
      }
      return t_.peerError(r.status(), "receive from", p);
    }
    pq.recvFlight.push_back({*r, pq.recvOps[pq.recvHead], rcv.posted / piece, len});
    rcv.posted += len;
    if (rcv.posted == rcv.op->len) {
      ++pq.recvHead;
    }
  }
  return Status::ok();
}

Status EngineTransport::Batch::collectSends(int p, bool* progress) {
  std::vector<InFlight>& flight = q_[p].sendFlight;
  for (size_t i = 0; i < flight.size();) {
    InFlight& f = flight[i];
    bool done = false;
    size_t got = 0;
    Status st = f.req->test(&done, &got);
    if (!st.isOk()) {
      return t_.peerError(st, "send to", p);
    }
    if (!done) {
      ++i;
      continue;
    }
    SendState& s = ss_[f.state];
    s.done += f.bytes;
    t_.sent_.fetch_add(f.bytes, std::memory_order_relaxed);
    if (s.done == s.op->len) {
      --pending_;
    }
    flight.erase(flight.begin() + static_cast<std::ptrdiff_t>(i));
    *progress = true;
  }
  return Status::ok();
}

Status EngineTransport::Batch::collectRecvs(int p, bool* progress) {
  std::vector<InFlight>& flight = q_[p].recvFlight;
  const size_t piece = t_.piece_;
  for (size_t i = 0; i < flight.size();) {
    InFlight& f = flight[i];
    bool done = false;
    size_t got = 0;
    Status st = f.req->test(&done, &got);
    if (!st.isOk()) {
      return t_.peerError(st, "receive from", p);
    }
    if (!done) {
      ++i;
      continue;
    }
    if (got != f.bytes) {
      return BAGUA_ERROR(kRemoteError,
                         "rank %d: rank %d sent a %zu-byte piece where %zu were expected (the "
                         "ranks issued different operations?)",
                         t_.rank_, p, got, f.bytes);
    }
    RecvState& rcv = rs_[f.state];
    rcv.piece[f.piece] = true;
    ++rcv.nDone;
    t_.received_.fetch_add(f.bytes, std::memory_order_relaxed);
    while (rcv.prefix < rcv.op->len && rcv.piece[rcv.prefix / piece]) {
      rcv.prefix = std::min(rcv.op->len, rcv.prefix + piece);
    }
    reportSegments(*rcv.op, rcv.prefix, &rcv.reported);
    if (rcv.nDone == rcv.piece.size()) {
      --pending_;
    }
    flight.erase(flight.begin() + static_cast<std::ptrdiff_t>(i));
    *progress = true;
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Transport>> connectEngineTransport(Store& store, int rank, int size,
                                                          const EngineTransportOptions& options) {
  if (options.pieceBytes == 0) {
    return BAGUA_ERROR(kInvalidArgument, "engine transport: piece size must be positive");
  }
  auto t = std::make_unique<EngineTransport>(rank, size, options.pieceBytes);
  if (size > 1) {
    BAGUA_RETURN_IF_ERROR(t->connect(store, options));
  }
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace bagua::core::host
