// Connection set-up: Listener (accept side) and Connector (connect side), both non-blocking.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <map>

#include "bagua/base/logging.h"
#include "comm.h"
#include "socket.h"
#include "wire.h"

namespace bagua::net {

namespace {

using Clock = std::chrono::steady_clock;

Result<Fd> makeSocket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return BAGUA_ERRNO(errno, "socket");
  }
  return Fd(fd);
}

// Switches a connected socket to the data-path mode: blocking, stream options set.
Status finishSocket(int fd, const EngineOptions& options) {
  BAGUA_RETURN_IF_ERROR(setStreamOptions(fd, options));
  return setNonBlocking(fd, false);
}

}  // namespace

// ---- Listener ----------------------------------------------------------------------------------

struct Listener::Impl {
  struct Pending {
    Fd fd;
    SocketAddress peer;
    uint8_t hello[wire::kHelloBytes] = {};
    size_t got = 0;
    Clock::time_point since;
  };
  struct Group {
    uint16_t nStreams = 0;
    Fd control;
    std::vector<Fd> data;
    int have = 0;
    SocketAddress peer;
  };

  EngineOptions options;
  std::vector<Fd> listenFds;             // one per rail
  std::vector<SocketAddress> addresses;  // bound addresses, one per rail
  SocketAddress address;                 // rail 0 (for messages)
  Handle handle{};
  uint64_t nonce = 0;
  std::vector<Pending> pending;
  std::map<uint64_t, Group> groups;

  void drop(Pending& p, const Status& why) {
    BAGUA_LOG_WARN(kLogNet, "dropping connection from %s on listener %s: %s",
                   p.peer.toString().c_str(), address.toString().c_str(), why.message().c_str());
    p.fd.reset();
  }

  // Places a socket with a valid hello into its group; returns a RecvComm when complete.
  Result<std::unique_ptr<RecvComm>> place(Pending& p, const wire::Hello& h) {
    Group& g = groups[h.connId];
    if (g.have == 0) {
      g.nStreams = h.nStreams;
      g.data.resize(h.nStreams);
      g.peer = p.peer;
    }
    if (h.nStreams != g.nStreams) {
      drop(p, BAGUA_ERROR(kRemoteError, "hello says %u streams, its connection said %u", h.nStreams,
                          g.nStreams));
      return std::unique_ptr<RecvComm>();
    }
    Fd* target = h.kind == wire::StreamKind::kControl ? &g.control : &g.data[h.index];
    if (target->valid()) {
      drop(p, BAGUA_ERROR(kRemoteError, "duplicate %s stream %u",
                          h.kind == wire::StreamKind::kControl ? "control" : "data", h.index));
      return std::unique_ptr<RecvComm>();
    }
    *target = std::move(p.fd);
    ++g.have;
    if (g.have < g.nStreams + 1) {
      return std::unique_ptr<RecvComm>();
    }
    Group done = std::move(g);
    groups.erase(h.connId);
    BAGUA_RETURN_IF_ERROR(finishSocket(done.control.get(), options));
    for (Fd& fd : done.data) {
      BAGUA_RETURN_IF_ERROR(finishSocket(fd.get(), options));
    }
    BAGUA_LOG_INFO(kLogNet, "accepted connection from %s: 1 control + %u data streams",
                   done.peer.toString().c_str(), done.nStreams);
    auto impl = std::make_unique<RecvComm::Impl>(std::move(done.control), std::move(done.data),
                                                 options, done.peer);
    return std::make_unique<RecvComm>(std::move(impl));
  }
};

Listener::Listener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Listener::~Listener() = default;
const Handle& Listener::handle() const {
  return impl_->handle;
}
const SocketAddress& Listener::address() const {
  return impl_->address;
}
int Listener::rails() const {
  return static_cast<int>(impl_->addresses.size());
}

namespace {

// A listening socket on `bindAddress`; *bound gets the address with its port.
Result<Fd> listenOn(const SocketAddress& bindAddress, const EngineOptions& options,
                    SocketAddress* bound) {
  if (bindAddress.family() != AF_INET && bindAddress.family() != AF_INET6) {
    return BAGUA_ERROR(kInvalidArgument, "listen address %s is neither IPv4 nor IPv6",
                       bindAddress.toString().c_str());
  }
  BAGUA_ASSIGN_OR_RETURN(Fd fd, makeSocket(bindAddress.family()));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (options.socketBufferBytes > 0) {
    // Accepted sockets inherit the receive buffer; setting it before listen() lets the window
    // scale be negotiated for it.
    int buf = static_cast<int>(std::min<uint64_t>(options.socketBufferBytes, 1u << 30));
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  }
  SocketAddress addr = bindAddress;
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0) {
    return BAGUA_ERRNO(errno, "bind").withContext(addr.toString());
  }
  if (::listen(fd.get(), 16384) != 0) {
    return BAGUA_ERRNO(errno, "listen");
  }
  socklen_t len = sizeof(addr.storage);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr.storage), &len) != 0) {
    return BAGUA_ERRNO(errno, "getsockname");
  }
  addr.length = len;
  *bound = addr;
  return fd;
}

}  // namespace

Result<std::unique_ptr<Listener>> Listener::create(const SocketAddress& bindAddress,
                                                   const EngineOptions& options) {
  return create(std::vector<SocketAddress>{bindAddress}, options);
}

Result<std::unique_ptr<Listener>> Listener::create(const std::vector<SocketAddress>& bindAddresses,
                                                   const EngineOptions& options) {
  BAGUA_RETURN_IF_ERROR(options.validate());
  if (bindAddresses.empty() || bindAddresses.size() > 1 + wire::kMaxExtraRails) {
    return BAGUA_ERROR(kInvalidArgument, "a listener takes 1 to %zu addresses, got %zu",
                       1 + wire::kMaxExtraRails, bindAddresses.size());
  }
  for (size_t r = 1; r < bindAddresses.size(); ++r) {
    if (bindAddresses[r].family() != AF_INET) {
      return BAGUA_ERROR(kInvalidArgument,
                         "rail %zu address %s is not IPv4: a device spanning several interfaces "
                         "needs IPv4 addresses after the first (NCCL_SOCKET_FAMILY=AF_INET)",
                         r, bindAddresses[r].toString().c_str());
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const SocketAddress& a : bindAddresses) {
    SocketAddress bound;
    BAGUA_ASSIGN_OR_RETURN(Fd fd, listenOn(a, options, &bound));
    impl->listenFds.push_back(std::move(fd));
    impl->addresses.push_back(bound);
  }
  impl->address = impl->addresses[0];
  impl->nonce = randomU64();
  wire::HandleInfo info;
  info.address = impl->addresses[0];
  info.extra.assign(impl->addresses.begin() + 1, impl->addresses.end());
  info.nonce = impl->nonce;
  wire::encodeHandle(info, &impl->handle);
  std::string list;
  for (const SocketAddress& a : impl->addresses) {
    list += (list.empty() ? "" : " ") + a.toString();
  }
  BAGUA_LOG_DEBUG(kLogNet, "listening on %s", list.c_str());
  return std::unique_ptr<Listener>(new Listener(std::move(impl)));
}

Result<std::unique_ptr<RecvComm>> Listener::accept() {
  Impl& l = *impl_;
  for (size_t r = 0; r < l.listenFds.size(); ++r) {
    for (;;) {
      Impl::Pending p;
      socklen_t len = sizeof(p.peer.storage);
      int fd = ::accept4(l.listenFds[r].get(), reinterpret_cast<sockaddr*>(&p.peer.storage), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) {
          continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          break;
        }
        return BAGUA_ERRNO(errno, "accept").withContext(l.addresses[r].toString());
      }
      p.peer.length = len;
      p.fd = Fd(fd);
      p.since = Clock::now();
      l.pending.push_back(std::move(p));
    }
  }
  std::unique_ptr<RecvComm> result;
  auto now = Clock::now();
  for (Impl::Pending& p : l.pending) {
    if (!p.fd.valid() || result) {
      continue;
    }
    Status s = recvSome(p.fd.get(), p.hello, sizeof(p.hello), &p.got);
    if (!s.isOk()) {
      l.drop(p, s);
      continue;
    }
    if (p.got < sizeof(p.hello)) {
      if (now - p.since > std::chrono::milliseconds(l.options.helloTimeoutMs)) {
        l.drop(p, BAGUA_ERROR(kDeadlineExceeded, "no complete hello within %lld ms (%zu bytes)",
                              static_cast<long long>(l.options.helloTimeoutMs), p.got));
      }
      continue;
    }
    Result<wire::Hello> h = wire::decodeHello(p.hello, sizeof(p.hello));
    if (!h.isOk()) {
      l.drop(p, h.status());
      continue;
    }
    if (h->nonce != l.nonce) {
      l.drop(p, BAGUA_ERROR(kRemoteError,
                            "hello carries nonce %016llx, this listener's is %016llx (stale "
                            "handle or a connection meant for another listener)",
                            static_cast<unsigned long long>(h->nonce),
                            static_cast<unsigned long long>(l.nonce)));
      continue;
    }
    BAGUA_ASSIGN_OR_RETURN(result, l.place(p, *h));
  }
  std::erase_if(l.pending, [](const Impl::Pending& p) { return !p.fd.valid(); });
  return result;
}

// ---- Connector ---------------------------------------------------------------------------------

struct Connector::Impl {
  struct Stream {
    Fd fd;
    SocketAddress target;  // the listener's address of this stream's rail
    bool connected = false;
    uint8_t hello[wire::kHelloBytes] = {};
    size_t sent = 0;
  };
  EngineOptions options;
  wire::HandleInfo target;
  std::vector<Stream> streams;  // [0] control, [1..n] data
  Clock::time_point started;
};

Connector::Connector(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Connector::~Connector() = default;

namespace {

// Binds a socket about to connect to the interface of its rail: its address (port 0) and, where
// the process may (CAP_NET_RAW, or a kernel that lets anyone), its device.
Status bindLocal(int fd, const NetInterface& iface) {
  SocketAddress a = iface.address;
  if (a.family() == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&a.storage)->sin_port = 0;
  } else {
    reinterpret_cast<sockaddr_in6*>(&a.storage)->sin6_port = 0;
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0) {
    return BAGUA_ERRNO(errno, "bind").withContext(a.toString());
  }
  if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, iface.name.c_str(),
                 static_cast<socklen_t>(iface.name.size())) != 0) {
    BAGUA_LOG_DEBUG(kLogNet, "SO_BINDTODEVICE %s: %s (the source address still picks the rail)",
                    iface.name.c_str(), std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Connector>> Connector::start(const Handle& handle,
                                                    const EngineOptions& options,
                                                    const std::vector<NetInterface>& local) {
  BAGUA_RETURN_IF_ERROR(options.validate());
  BAGUA_ASSIGN_OR_RETURN(wire::HandleInfo info, wire::decodeHandle(handle.data(), handle.size()));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (info.rails() > 1 && options.notSentLowatBytes == 0) {
    // Over rails of different speeds a stream must claim its next chunk only when its rail
    // really moved the last one, not when a 4 MiB socket buffer swallowed it (which parks chunks
    // on the slow rail and holds every message back: 0.69 R against 1.15 R with this, links of R
    // and R/4).
    impl->options.notSentLowatBytes = kMultiRailNotSentLowat;
  }
  impl->target = info;
  impl->started = Clock::now();
  uint64_t connId = randomU64();
  impl->streams.resize(static_cast<size_t>(options.nStreams) + 1);
  const bool bindRails = info.rails() > 1 && local.size() == info.rails();
  for (size_t i = 0; i < impl->streams.size(); ++i) {
    Impl::Stream& st = impl->streams[i];
    // Control on rail 0, data stream j on rail j mod rails.
    size_t rail = i == 0 ? 0 : (i - 1) % info.rails();
    const SocketAddress& target = info.rail(rail);
    st.target = target;
    BAGUA_ASSIGN_OR_RETURN(st.fd, makeSocket(target.family()));
    if (options.socketBufferBytes > 0) {
      int buf = static_cast<int>(std::min<uint64_t>(options.socketBufferBytes, 1u << 30));
      setsockopt(st.fd.get(), SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
      setsockopt(st.fd.get(), SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    }
    wire::Hello h;
    h.kind = i == 0 ? wire::StreamKind::kControl : wire::StreamKind::kData;
    h.index = static_cast<uint16_t>(i == 0 ? 0 : i - 1);
    h.nStreams = static_cast<uint16_t>(options.nStreams);
    h.nonce = info.nonce;
    h.connId = connId;
    wire::encodeHello(h, st.hello);
    if (bindRails) {
      BAGUA_RETURN_IF_ERROR(bindLocal(st.fd.get(), local[rail]));
    }
    int rc =
        ::connect(st.fd.get(), reinterpret_cast<const sockaddr*>(&target.storage), target.length);
    if (rc == 0) {
      st.connected = true;
    } else if (errno != EINPROGRESS && errno != EINTR) {
      return BAGUA_ERRNO(errno, "connect").withContext(target.toString());
    }
  }
  return std::unique_ptr<Connector>(new Connector(std::move(impl)));
}

Result<std::unique_ptr<SendComm>> Connector::poll() {
  Impl& c = *impl_;
  if (c.streams.empty()) {
    return BAGUA_ERROR(kFailedPrecondition, "Connector::poll() after it already returned a comm");
  }
  bool all = true;
  for (Impl::Stream& st : c.streams) {
    if (!st.connected) {
      pollfd pfd{st.fd.get(), POLLOUT, 0};
      int n = ::poll(&pfd, 1, 0);
      if (n < 0 && errno != EINTR) {
        return BAGUA_ERRNO(errno, "poll");
      }
      if (n <= 0) {
        all = false;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(st.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        return BAGUA_ERRNO(errno, "getsockopt(SO_ERROR)");
      }
      if (err != 0) {
        return BAGUA_ERRNO(err, "connect").withContext(st.target.toString());
      }
      st.connected = true;
    }
    BAGUA_RETURN_IF_ERROR(sendSome(st.fd.get(), st.hello, sizeof(st.hello), &st.sent));
    all = all && st.sent == sizeof(st.hello);
  }
  if (!all) {
    if (Clock::now() - c.started > std::chrono::milliseconds(c.options.timeoutMs)) {
      return BAGUA_ERROR(kDeadlineExceeded, "connecting to %s took longer than %lld ms",
                         c.target.address.toString().c_str(),
                         static_cast<long long>(c.options.timeoutMs));
    }
    return std::unique_ptr<SendComm>();
  }
  std::vector<Fd> data;
  for (size_t i = 1; i < c.streams.size(); ++i) {
    BAGUA_RETURN_IF_ERROR(finishSocket(c.streams[i].fd.get(), c.options));
    data.push_back(std::move(c.streams[i].fd));
  }
  BAGUA_RETURN_IF_ERROR(finishSocket(c.streams[0].fd.get(), c.options));
  BAGUA_LOG_INFO(kLogNet, "connected to %s: 1 control + %zu data streams over %zu rail(s)",
                 c.target.address.toString().c_str(), data.size(), c.target.rails());
  auto impl = std::make_unique<SendComm::Impl>(std::move(c.streams[0].fd), std::move(data),
                                               c.options, c.target.address);
  c.streams.clear();
  return std::make_unique<SendComm>(std::move(impl));
}

}  // namespace bagua::net
