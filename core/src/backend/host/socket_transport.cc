// Plain TCP sockets behind the host Transport seam: one nonblocking connection per peer,
// progressed with poll(2) by the calling thread.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/host/control_wire.h"
#include "backend/host/shm_mesh.h"
#include "backend/host/transport.h"
#include "bagua/base/crypto.h"
#include "bagua/base/logging.h"
#include "bagua/core/job_key.h"
#include "bagua/core/params.h"
#include "bagua/net/socket_io.h"
#include "liveness.h"

namespace bagua::core::host {

namespace {

using Clock = std::chrono::steady_clock;

int msLeft(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset(o.release());
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int f = -1) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = f;
  }

 private:
  int fd_;
};

// Parses "a.b.c.d:port" or "[v6]:port".
bool parseHostPort(const std::string& s, sockaddr_storage* out, socklen_t* len) {
  std::memset(out, 0, sizeof(*out));
  size_t colon = s.rfind(':');
  if (colon == std::string::npos) {
    return false;
  }
  std::string host = s.substr(0, colon);
  int port = std::atoi(s.c_str() + colon + 1);
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
    auto* a = reinterpret_cast<sockaddr_in6*>(out);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*a);
    return ::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) == 1;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(out);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(port));
  *len = sizeof(*a);
  return ::inet_pton(AF_INET, host.c_str(), &a->sin_addr) == 1;
}

void tuneSocket(int fd, size_t buffer, std::chrono::milliseconds deadPeer) {
  // Best effort, as the buffer sizes: the heartbeat (peer_monitor.h) bounds a vanished host too.
  (void)setDeadPeerBound(fd, deadPeer);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer > 0) {
    int b = static_cast<int>(std::min<size_t>(buffer, 1 << 30));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
  }
}

// The engine's whole-buffer loop (bagua/net/socket_io.h), its failures prefixed with `what`.
Status blockingIo(int fd, void* data, size_t len, bool write, Deadline deadline, const char* what) {
  Status s = write ? net::sendAll(fd, data, len, deadline) : net::recvAll(fd, data, len, deadline);
  if (!s.isOk()) {
    s.withContext(what);
  }
  return s;
}

class SocketTransport final : public TransportBase {
 public:
  SocketTransport(int rank, int size, std::vector<Fd> fds)
      : TransportBase(rank, size), fds_(std::move(fds)) {}
  void setShm(std::unique_ptr<ShmMesh> shm) {
    shm_ = std::move(shm);
    closed_.assign(size_, false);
  }
  bool usesShm() const { return shm_ != nullptr; }
  SocketTransport(const SocketTransport&) = delete;
  SocketTransport& operator=(const SocketTransport&) = delete;

  void abort(const std::string& why) override {
    markAborted(why);
    // Peers blocked on us see the connections close at once instead of waiting for their
    // deadline. The descriptors stay open (and valid for a concurrent poll) until destruction.
    for (Fd& fd : fds_) {
      if (fd.get() >= 0) {
        ::shutdown(fd.get(), SHUT_RDWR);
      }
    }
  }

  Status exchange(std::span<const SendOp> sends, std::span<RecvOp> recvs,
                  Deadline deadline) override {
    BAGUA_RETURN_IF_ERROR(startExchange(sends, recvs));
    Batch batch(*this);
    return runBatch(batch, deadline);
  }

 private:
  // One exchange's remote ops (TransportBase::runBatch's batch): the bytes moved so far and the
  // head of each peer's queue in each direction (its first unfinished op; ops to one peer in one
  // direction move in order).
  class Batch {
   public:
    explicit Batch(SocketTransport& t);
    [[nodiscard]] Status step(bool* progress);
    bool finished() const { return pending_ == 0; }
    bool waitingOn(int p) const { return sendHead_[p] != kNone || recvHead_[p] != kNone; }
    [[nodiscard]] Status wait(Deadline until);

   private:
    struct SendState {
      const SendOp* op;
      size_t done = 0;
      size_t limit() const {
        return op->ready != nullptr ? std::min(*op->ready, op->len) : op->len;
      }
      bool sendable() const { return done < limit(); }
    };
    struct RecvState {
      RecvOp* op;
      size_t done = 0;
      size_t reported = 0;
    };
    static constexpr size_t kNone = SIZE_MAX;

    bool sendable(int p) const { return sendHead_[p] != kNone && ss_[sendHead_[p]].sendable(); }
    void refreshHeads();
    // Move what the head op with `p` can take now; *finishedOp when it completed.
    [[nodiscard]] Status sendTo(int p, bool* progress, bool* finishedOp);
    [[nodiscard]] Status recvFrom(int p, bool* progress, bool* finishedOp);
    // Shared memory: fails when a local peer that closed its connection still owes us an op.
    [[nodiscard]] Status checkClosedLocals() const;
    // Shared memory: true when a local peer's ring can move bytes for us now.
    bool ringReady() const;
    // Poll the sockets we wait on (and every local peer's wake-up connection) until `until`.
    [[nodiscard]] Status pollSockets(Deadline until);
    // Shared memory: drops the wake-up bytes that arrived, noting local peers whose connection
    // closed.
    [[nodiscard]] Status drainWakeups();

    SocketTransport& t_;
    std::vector<SendState> ss_;
    std::vector<RecvState> rs_;
    std::vector<size_t> sendHead_;
    std::vector<size_t> recvHead_;
    size_t pending_ = 0;  // ops not finished
    std::vector<pollfd> pfds_;
    std::vector<int> pfdPeer_;
  };

  bool local(int peer) const { return shm_ != nullptr && shm_->isLocal(peer); }
  // Wakes a local peer sleeping in poll(): one byte on the TCP connection, which otherwise
  // carries no data for local peers.
  void wake(int peer) {
    if (shm_->takeWake(peer)) {
      uint8_t b = 1;
      (void)::send(fds_[peer].get(), &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }

  // Move up to `len` bytes to / from `peer` without blocking, through its shared-memory ring
  // (pieces of at most 256 KiB, so that the receiver can start copying out early; the peer is
  // woken) or its socket. Return the bytes moved, or -1 with errno set (EAGAIN: not now).
  ssize_t trySend(int peer, const uint8_t* data, size_t len) {
    if (!local(peer)) {
      return ::send(fds_[peer].get(), data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    return shmMoved(peer, shm_->trySend(peer, data, std::min<size_t>(len, kShmPiece)));
  }
  ssize_t tryRecv(int peer, uint8_t* data, size_t len) {
    if (!local(peer)) {
      return ::recv(fds_[peer].get(), data, len, MSG_DONTWAIT);
    }
    return shmMoved(peer, shm_->tryRecv(peer, data, std::min<size_t>(len, kShmPiece)));
  }
  ssize_t shmMoved(int peer, size_t n) {
    if (n == 0) {
      errno = EAGAIN;
      return -1;
    }
    wake(peer);
    return static_cast<ssize_t>(n);
  }

  static constexpr size_t kShmPiece = 256 * 1024;
  std::vector<Fd> fds_;           // indexed by peer rank; -1 for self
  std::unique_ptr<ShmMesh> shm_;  // local peers' data path (null: TCP only)
  // Local peers whose connection closed. What they left in the rings is still delivered.
  std::vector<bool> closed_;
};

bool wouldBlock(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

SocketTransport::Batch::Batch(SocketTransport& t)
    : t_(t), sendHead_(t.size_, kNone), recvHead_(t.size_, kNone) {
  ss_.reserve(t.remoteSends_.size());
  rs_.reserve(t.remoteRecvs_.size());
  for (const SendOp* s : t.remoteSends_) {
    ss_.push_back({s});
  }
  for (RecvOp* r : t.remoteRecvs_) {
    rs_.push_back({r});
  }
  pending_ = ss_.size() + rs_.size();
  refreshHeads();
}

void SocketTransport::Batch::refreshHeads() {
  std::fill(sendHead_.begin(), sendHead_.end(), kNone);
  std::fill(recvHead_.begin(), recvHead_.end(), kNone);
  for (size_t i = 0; i < ss_.size(); ++i) {
    const int p = ss_[i].op->peer;
    if (ss_[i].done < ss_[i].op->len && sendHead_[p] == kNone) {
      sendHead_[p] = i;
    }
  }
  for (size_t i = 0; i < rs_.size(); ++i) {
    const int p = rs_[i].op->peer;
    if (rs_[i].done < rs_[i].op->len && recvHead_[p] == kNone) {
      recvHead_[p] = i;
    }
  }
}

Status SocketTransport::Batch::step(bool* progress) {
  bool headsChanged = false;
  for (int p = 0; p < t_.size_; ++p) {
    if (sendable(p)) {
      BAGUA_RETURN_IF_ERROR(sendTo(p, progress, &headsChanged));
    }
    if (recvHead_[p] != kNone) {
      BAGUA_RETURN_IF_ERROR(recvFrom(p, progress, &headsChanged));
    }
  }
  if (headsChanged) {
    refreshHeads();
  }
  return Status::ok();
}

Status SocketTransport::Batch::sendTo(int p, bool* progress, bool* finishedOp) {
  SendState& s = ss_[sendHead_[p]];
  const auto* base = static_cast<const uint8_t*>(s.op->data);
  const ssize_t n = t_.trySend(p, base + s.done, s.limit() - s.done);
  if (n > 0) {
    s.done += static_cast<size_t>(n);
    t_.sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    *progress = true;
    if (s.done == s.op->len) {
      --pending_;
      *finishedOp = true;
    }
  } else if (n < 0 && !wouldBlock(errno)) {
    const int err = errno;
    return t_.unlessAborted(BAGUA_ERRNO(
        err, strPrintf("rank %d: send of %zu bytes to rank %d failed (peer exited or failed?)",
                       t_.rank_, s.op->len, p)));
  }
  return Status::ok();
}

Status SocketTransport::Batch::recvFrom(int p, bool* progress, bool* finishedOp) {
  RecvState& r = rs_[recvHead_[p]];
  auto* base = static_cast<uint8_t*>(r.op->data);
  const ssize_t n = t_.tryRecv(p, base + r.done, r.op->len - r.done);
  if (n > 0) {
    r.done += static_cast<size_t>(n);
    t_.received_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    *progress = true;
    reportSegments(*r.op, r.done, &r.reported);
    if (r.done == r.op->len) {
      --pending_;
      *finishedOp = true;
    }
  } else if (n == 0) {
    return t_.unlessAborted(BAGUA_ERROR(kRemoteError,
                                        "rank %d: rank %d closed its connection while %zu of %zu "
                                        "bytes were still expected from it (did it exit or fail?)",
                                        t_.rank_, p, r.op->len - r.done, r.op->len));
  } else if (!wouldBlock(errno)) {
    const int err = errno;
    return t_.unlessAborted(
        BAGUA_ERRNO(err, strPrintf("rank %d: receive from rank %d failed", t_.rank_, p)));
  }
  return Status::ok();
}

Status SocketTransport::Batch::wait(Deadline until) {
  pfds_.clear();
  pfdPeer_.clear();
  if (t_.shm_ == nullptr) {
    return pollSockets(until);
  }
  BAGUA_RETURN_IF_ERROR(checkClosedLocals());
  // Announce the sleep, then look once more: a peer that changed a ring before seeing the flag
  // is caught here, one that changes it after sees the flag and sends a wake-up byte.
  t_.shm_->setSleeping(true);
  Status polled = ringReady() ? Status::ok() : pollSockets(until);
  t_.shm_->setSleeping(false);
  BAGUA_RETURN_IF_ERROR(polled);
  return drainWakeups();
}

Status SocketTransport::Batch::checkClosedLocals() const {
  // A local peer that exited can no longer fill or drain its rings.
  for (int p = 0; p < t_.size_; ++p) {
    if (t_.local(p) && t_.closed_[p] &&
        (sendHead_[p] != kNone || (recvHead_[p] != kNone && !t_.shm_->canRecv(p)))) {
      return t_.unlessAborted(BAGUA_ERROR(kRemoteError,
                                          "rank %d: rank %d (same host) closed its connection "
                                          "while a transfer with it was unfinished (did it exit "
                                          "or fail?)",
                                          t_.rank_, p));
    }
  }
  return Status::ok();
}

bool SocketTransport::Batch::ringReady() const {
  for (int p = 0; p < t_.size_; ++p) {
    if (t_.local(p) &&
        ((sendable(p) && t_.shm_->canSend(p)) || (recvHead_[p] != kNone && t_.shm_->canRecv(p)))) {
      return true;
    }
  }
  return false;
}

Status SocketTransport::Batch::pollSockets(Deadline until) {
  for (int p = 0; p < t_.size_; ++p) {
    short ev = 0;
    if (t_.local(p)) {
      // Wake-up bytes, and the peer's death (the connection closes). Every local peer, not only
      // those we wait on: the sleeping flag is per rank, so any peer may be the one that clears
      // it and sends the byte.
      ev = !t_.closed_[p] ? POLLIN : 0;
    } else {
      if (sendable(p)) {
        ev |= POLLOUT;
      }
      if (recvHead_[p] != kNone) {
        ev |= POLLIN;
      }
    }
    if (ev != 0) {
      pfds_.push_back({t_.fds_[p].get(), ev, 0});
      pfdPeer_.push_back(p);
    }
  }
  if (::poll(pfds_.data(), pfds_.size(), msLeft(until)) < 0 && errno != EINTR) {
    return BAGUA_ERRNO(errno, "poll");
  }
  return Status::ok();
}

Status SocketTransport::Batch::drainWakeups() {
  for (size_t i = 0; i < pfds_.size(); ++i) {
    const int p = pfdPeer_[i];
    if (!t_.local(p) || (pfds_[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
      continue;
    }
    uint8_t drain[256];
    const ssize_t n = ::recv(t_.fds_[p].get(), drain, sizeof(drain), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && !wouldBlock(errno))) {
      if (t_.aborted()) {
        return t_.abortedStatus();
      }
      t_.closed_[p] = true;  // checked by the next wait once its rings can make no more progress
    }
  }
  return Status::ok();
}

// Finds the ranks on this host and, when there are several, moves their traffic to shared
// memory. Every local rank reports whether it could map the segment; all use it or none does.
Status attachSharedMemory(Store& store, int rank, int size, const SocketTransportOptions& options,
                          Deadline deadline, SocketTransport& transport) {
  const std::string me = hostIdentity();
  BAGUA_RETURN_IF_ERROR(store.set(strPrintf("host/%d", rank), toBytes(me)));
  std::vector<int> locals;
  for (int r = 0; r < size; ++r) {
    BAGUA_ASSIGN_OR_RETURN(Bytes b,
                           store.get(strPrintf("host/%d", r),
                                     std::chrono::milliseconds(std::max(1, msLeft(deadline)))));
    if (toString(b) == me) {
      locals.push_back(r);
    }
  }
  if (locals.size() < 2) {
    return Status::ok();
  }
  Result<std::unique_ptr<ShmMesh>> mesh =
      ShmMesh::create(store, rank, locals, options.sharedMemoryRingBytes, deadline);
  if (!mesh.isOk() && rank == locals.front()) {
    // Let the others stop waiting for the segment's name.
    (void)store.compareSet(strPrintf("shm/name/%d", rank), {}, toBytes("-"));
  }
  BAGUA_RETURN_IF_ERROR(store.set(strPrintf("shm/ok/%d", rank), toBytes(mesh.isOk() ? "1" : "0")));
  bool all = true;
  for (int r : locals) {
    BAGUA_ASSIGN_OR_RETURN(Bytes ok,
                           store.get(strPrintf("shm/ok/%d", r),
                                     std::chrono::milliseconds(std::max(1, msLeft(deadline)))));
    all = all && toString(ok) == "1";
  }
  if (!all) {
    BAGUA_LOG_WARN(kLogCore,
                   "rank %d: shared memory unavailable on this host (%s); local peers use TCP",
                   rank, mesh.isOk() ? "another rank failed" : mesh.status().message().c_str());
    return Status::ok();
  }
  transport.setShm(std::move(*mesh));
  return Status::ok();
}

}  // namespace

std::string hostIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string id = host;
  int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char boot[64] = {};
    ssize_t n = ::read(fd, boot, sizeof(boot) - 1);
    ::close(fd);
    while (n > 0 && (boot[n - 1] == '\n' || boot[n - 1] == ' ')) {
      --n;
    }
    if (n > 0) {
      id += "/" + std::string(boot, static_cast<size_t>(n));
    }
  }
  // Processes in different network namespaces (containers, or the nodes of the elastic tests)
  // are different hosts: they reach each other over a network, and usually see different
  // /dev/shm mounts.
  char ns[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n > 0) {
    id += "/" + std::string(ns, static_cast<size_t>(n));
  }
  return id;
}

namespace {

std::string peerText(const sockaddr_storage& sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&sa);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
    return strPrintf("%s:%d", buf, port);
  }
  if (sa.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&sa);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
    return strPrintf("[%s]:%d", buf, port);
  }
  return buf;
}

// An accepted connection whose hello has not fully arrived.
struct PendingHello {
  Fd fd;
  std::string peer;
  wire::Hello buf{};
  size_t got = 0;
  Clock::time_point since;
};

// Accepts the ranks above `rank` on `listener`, every pending connection progressed at once:
// one that sends a bad hello, claims a rank already connected, stays silent past the hello
// timeout or is the oldest of too many is dropped and logged with its address. Only the
// deadline (rendezvous timeout) fails the set-up, naming the ranks that never came.
Status acceptHigherRanks(int listener, int rank, int size, const SocketTransportOptions& options,
                         HmacSha256& meshKey, const wire::Nonce& nonce, Deadline deadline,
                         std::vector<Fd>& fds) {
  constexpr size_t kMaxPending = 64;
  int expected = size - 1 - rank;
  std::vector<PendingHello> pending;
  uint64_t dropped = 0;
  bool exhaustedLogged = false;
  auto drop = [&](PendingHello& p, const std::string& why) {
    ++dropped;
    if (dropped <= 10 || dropped % 1000 == 0) {
      BAGUA_LOG_WARN(kLogCore, "rank %d: dropped the connection from %s: %s (%llu dropped so far)",
                     rank, p.peer.c_str(), why.c_str(), static_cast<unsigned long long>(dropped));
    }
    p.fd.reset();
  };
  std::vector<pollfd> pfds;
  while (expected > 0) {
    const int left = msLeft(deadline);
    if (left == 0) {
      std::string missing;
      for (int p = rank + 1; p < size; ++p) {
        if (fds[p].get() < 0) {
          missing += strPrintf("%s%d", missing.empty() ? "" : ",", p);
        }
      }
      return BAGUA_ERROR(kDeadlineExceeded,
                         "rank %d: ranks [%s] never connected within the rendezvous timeout%s",
                         rank, missing.c_str(),
                         dropped > 0 ? strPrintf(" (%llu connections were dropped for bad or "
                                                 "missing hellos: see the log)",
                                                 static_cast<unsigned long long>(dropped))
                                           .c_str()
                                     : "");
    }
    pfds.assign(1, pollfd{listener, POLLIN, 0});
    for (const PendingHello& p : pending) {
      pfds.push_back({p.fd.get(), POLLIN, 0});
    }
    ::poll(pfds.data(), pfds.size(), std::min(left, 100));
    const auto now = Clock::now();
    // Progress the pending hellos (the listener's new ones come after, at the next round).
    for (size_t i = 0; i < pending.size(); ++i) {
      PendingHello& p = pending[i];
      if ((pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        const ssize_t n = ::recv(p.fd.get(), p.buf.data() + p.got, p.buf.size() - p.got, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          drop(p, strPrintf("closed after %zu of the hello's %zu bytes", p.got, p.buf.size()));
          continue;
        }
        if (n > 0) {
          p.got += static_cast<size_t>(n);
        }
      }
      if (p.got == p.buf.size()) {
        Result<int> from = wire::verifyHello(p.buf.data(), p.got, meshKey, nonce, rank, size);
        if (!from.isOk()) {
          drop(p, from.status().message());
        } else if (fds[*from].get() >= 0) {
          drop(p, strPrintf("a second connection claiming rank %d", *from));
        } else {
          tuneSocket(p.fd.get(), options.socketBuffer, options.deadPeerTimeout);
          fds[*from] = std::move(p.fd);
          --expected;
        }
      } else if (now - p.since > options.helloTimeout) {
        drop(p, strPrintf("no complete hello within %lld ms (%zu bytes)",
                          static_cast<long long>(options.helloTimeout.count()), p.got));
      }
    }
    std::erase_if(pending, [](const PendingHello& p) { return p.fd.get() < 0; });
    if ((pfds[0].revents & POLLIN) == 0) {
      continue;
    }
    for (int burst = 0; burst < 64; ++burst) {
      sockaddr_storage sa{};
      socklen_t salen = sizeof(sa);
      Fd fd(::accept4(listener, reinterpret_cast<sockaddr*>(&sa), &salen,
                      SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd.get() < 0) {
        if ((errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
          if (!exhaustedLogged) {
            BAGUA_LOG_WARN(kLogCore,
                           "rank %d: cannot accept connections: %s; dropping the "
                           "oldest connection that has not said hello, and retrying",
                           rank, std::strerror(errno));
            exhaustedLogged = true;
          }
          if (!pending.empty()) {
            drop(pending.front(), "descriptors exhausted; the oldest silent connection goes");
            pending.erase(pending.begin());
          }
        }
        break;  // EAGAIN: nothing more queued; anything else: retried at the next round
      }
      if (pending.size() >= kMaxPending) {
        drop(pending.front(), strPrintf("more than %zu connections without a hello; the oldest "
                                        "goes",
                                        kMaxPending));
        pending.erase(pending.begin());
      }
      PendingHello p;
      p.fd = std::move(fd);
      p.peer = peerText(sa);
      p.since = now;
      pending.push_back(std::move(p));
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Transport>> connectSocketTransport(Store& store, int rank, int size,
                                                          const SocketTransportOptions& options) {
  const Deadline deadline = Clock::now() + options.connectTimeout;
  std::vector<Fd> fds;
  fds.resize(size);
  if (size == 1) {
    return std::unique_ptr<Transport>(new SocketTransport(rank, size, std::move(fds)));
  }
  JobKey key;
  if (options.key.has_value()) {
    key = *options.key;
  } else {
    BAGUA_ASSIGN_OR_RETURN(key, jobKeyFromParams());
  }
  const Digest meshDigest = key.derive("mesh");
  HmacSha256 meshKey(meshDigest.data(), meshDigest.size());
  std::string addr = options.listenAddress.empty() ? store.localAddress() : options.listenAddress;
  const bool v6 = addr.find(':') != std::string::npos;
  Fd listener(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (listener.get() < 0) {
    return BAGUA_ERRNO(errno, "socket");
  }
  sockaddr_storage sa{};
  socklen_t salen = 0;
  if (!parseHostPort(v6 ? "[" + addr + "]:0" : addr + ":0", &sa, &salen)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "host backend: cannot listen on '%s' (not an IP address; "
                       "BAGUA_HOST_LISTEN_ADDR, when set, must be an IP address of this host)",
                       addr.c_str());
  }
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), salen) != 0 ||
      ::listen(listener.get(), std::max(size, 64)) != 0) {
    return BAGUA_ERRNO(errno, "host backend: bind/listen on " + addr);
  }
  socklen_t len = sizeof(sa);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  int port = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port)
                : ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  std::string published =
      v6 ? strPrintf("[%s]:%d", addr.c_str(), port) : strPrintf("%s:%d", addr.c_str(), port);
  BAGUA_ASSIGN_OR_RETURN(wire::Nonce nonce, wire::freshNonce());
  BAGUA_RETURN_IF_ERROR(
      store.set(strPrintf("addr/%d", rank), toBytes(wire::publishListener(published, nonce))));

  // Connect to every lower rank and introduce ourselves.
  for (int peer = 0; peer < rank; ++peer) {
    BAGUA_ASSIGN_OR_RETURN(Bytes where,
                           store.get(strPrintf("addr/%d", peer),
                                     std::chrono::milliseconds(std::max(1, msLeft(deadline)))));
    std::string hostPort;
    wire::Nonce peerNonce{};
    sockaddr_storage pa{};
    socklen_t palen = 0;
    if (!wire::parseListener(toString(where), &hostPort, &peerNonce) ||
        !parseHostPort(hostPort, &pa, &palen)) {
      return BAGUA_ERROR(kRemoteError, "rank %d published a bad address '%s'", peer,
                         toString(where).c_str());
    }
    std::string lastErr;
    while (true) {
      Fd fd(::socket(pa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      tuneSocket(fd.get(), options.socketBuffer, options.deadPeerTimeout);
      int r = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&pa), palen);
      if (r < 0 && errno == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, std::max(1, std::min(msLeft(deadline), 1000))) == 1) {
          int err = 0;
          socklen_t elen = sizeof(err);
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
          r = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (r == 0) {
        wire::Hello hello = wire::encodeHello(meshKey, peerNonce, static_cast<uint32_t>(rank),
                                              static_cast<uint32_t>(peer));
        BAGUA_RETURN_IF_ERROR(
            blockingIo(fd.get(), hello.data(), hello.size(), true, deadline, "host backend hello"));
        fds[peer] = std::move(fd);
        break;
      }
      lastErr = std::strerror(errno);
      if (msLeft(deadline) == 0) {
        return BAGUA_ERROR(kUnavailable, "rank %d: cannot connect to rank %d at %s: %s", rank, peer,
                           hostPort.c_str(), lastErr.c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  BAGUA_RETURN_IF_ERROR(
      acceptHigherRanks(listener.get(), rank, size, options, meshKey, nonce, deadline, fds));
  auto transport = std::make_unique<SocketTransport>(rank, size, std::move(fds));
  if (options.sharedMemory) {
    BAGUA_RETURN_IF_ERROR(attachSharedMemory(store, rank, size, options, deadline, *transport));
  }
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace bagua::core::host
