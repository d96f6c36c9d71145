// The TCP store's client (TcpStore): POSIX sockets, one request at a time under a mutex; connect
// with retries until the server answers, the key's handshake, and failures turned into errors
// that name the server. And the addresses of this host the store uses: where rank 0's server
// listens (storeListenAddress) and the client's own (localAddress). The wire is store_wire.h's;
// the server is tcp_store_server.cc.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>

#include "bagua/base/logging.h"
#include "bagua/core/params.h"
#include "bagua/core/store.h"
#include "bagua/net/socket_io.h"
#include "liveness.h"
#include "store_wire.h"

namespace bagua::core {

namespace sw = storewire;

// ---- Addresses of this host ---------------------------------------------------------------------

namespace {

bool isIpLiteral(const std::string& s) {
  in_addr a4{};
  in6_addr a6{};
  return ::inet_pton(AF_INET, s.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, s.c_str(), &a6) == 1;
}

std::string addrText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool isLoopback(const std::string& ip) {
  return ip.rfind("127.", 0) == 0 || ip == "::1";
}

}  // namespace

Result<std::string> storeListenAddress(const std::string& masterAddr) {
  BAGUA_ASSIGN_OR_RETURN(std::string asked, coreParams().storeListenAddr.get());
  if (!asked.empty()) {
    if (!isIpLiteral(asked)) {
      return BAGUA_ERROR(kInvalidArgument,
                         "BAGUA_STORE_LISTEN_ADDR='%s' is not an IP address (0.0.0.0 or :: for "
                         "every interface)",
                         asked.c_str());
    }
    return asked;
  }
  const std::string host = masterAddr == "localhost" ? "127.0.0.1" : masterAddr;
  if (isIpLiteral(host)) {
    return host;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "MASTER_ADDR=%s: cannot resolve it (%s); rank 0 listens on its address",
                       host.c_str(), gai_strerror(rc));
  }
  std::vector<std::string> resolved;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    std::string ip = addrText(ai->ai_addr);
    if (!ip.empty() && std::find(resolved.begin(), resolved.end(), ip) == resolved.end()) {
      resolved.push_back(ip);
    }
  }
  ::freeaddrinfo(res);
  std::set<std::string> local;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr &&
          (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6)) {
        local.insert(addrText(i->ifa_addr));
      }
    }
    ::freeifaddrs(ifs);
  }
  std::string all;
  for (const std::string& ip : resolved) {
    all += (all.empty() ? "" : ", ") + ip;
    if (local.count(ip) != 0 || isLoopback(ip)) {
      if (isLoopback(ip)) {
        BAGUA_LOG_WARN(kLogCore,
                       "MASTER_ADDR=%s is %s on this host, a loopback address: ranks on other "
                       "hosts cannot reach the store there (give MASTER_ADDR as this host's IP "
                       "address, or set BAGUA_STORE_LISTEN_ADDR)",
                       host.c_str(), ip.c_str());
      }
      return ip;
    }
  }
  return BAGUA_ERROR(kInvalidArgument,
                     "MASTER_ADDR=%s resolves to %s, none of which is an address of this host, "
                     "and rank 0 hosts the store: start rank 0 on that host, set MASTER_ADDR to "
                     "one of this host's addresses, or set BAGUA_STORE_LISTEN_ADDR (0.0.0.0: every "
                     "interface)",
                     host.c_str(), all.empty() ? "nothing" : all.c_str());
}

// ---- Client -------------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// The engine's whole-buffer loop (bagua/net/socket_io.h), its failures named after the store.
Status ioAll(int fd, uint8_t* data, size_t len, bool write, Clock::time_point deadline,
             const std::string& server) {
  Status s = write ? net::sendAll(fd, data, len, deadline) : net::recvAll(fd, data, len, deadline);
  if (!s.isOk()) {
    const char* hint = s.code() == StatusCode::kRemoteError ? " (did rank 0 exit?)"
                       : s.code() == StatusCode::kDeadlineExceeded
                           ? " (no answer: its host vanished or the network to it is cut?)"
                           : "";
    s.withContext(strPrintf("TCP store %s%s", server.c_str(), hint));
  }
  return s;
}

// One frame's body, its buffer grown as the bytes arrive (up to 1 MiB at a time).
Result<Bytes> readFrame(int fd, uint32_t maxFrame, Clock::time_point deadline,
                        const std::string& server, bool* closedFirst = nullptr) {
  uint8_t header[4];
  bool eof = false;
  Status s = net::recvAll(fd, header, 4, deadline, &eof);
  if (closedFirst != nullptr) {
    *closedFirst = !s.isOk() && eof;
  }
  if (!s.isOk()) {
    return s.withContext(strPrintf("TCP store %s", server.c_str()));
  }
  const uint32_t len = static_cast<uint32_t>(header[0]) | (static_cast<uint32_t>(header[1]) << 8) |
                       (static_cast<uint32_t>(header[2]) << 16) |
                       (static_cast<uint32_t>(header[3]) << 24);
  if (len == 0 || len > maxFrame) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s sent a bad frame length %u", server.c_str(),
                       len);
  }
  Bytes body;
  while (body.size() < len) {
    const size_t old = body.size();
    const size_t step = std::min<size_t>(len - old, 1 << 20);
    body.resize(old + step);
    BAGUA_RETURN_IF_ERROR(ioAll(fd, body.data() + old, step, false, deadline, server));
  }
  return body;
}

enum class Handshake { kOk, kRetry, kFail };

// The client's half of the challenge-response (store_wire.h). kRetry: the server closed the
// connection before its challenge (it may be shedding connections) or right after our hello.
Handshake handshake(int fd, sw::ClientSession& session, Clock::time_point deadline,
                    const std::string& server, Status* why) {
  bool closed = false;
  Result<Bytes> challenge = readFrame(fd, sw::kMaxUnauthenticatedFrame, deadline, server, &closed);
  if (!challenge.isOk()) {
    *why = challenge.takeStatus();
    return closed ? Handshake::kRetry : Handshake::kFail;
  }
  Result<Bytes> hello = session.answer(*challenge);
  if (!hello.isOk()) {
    *why = hello.takeStatus().withContext(strPrintf("TCP store %s", server.c_str()));
    return Handshake::kFail;
  }
  Status s = ioAll(fd, hello->data(), hello->size(), true, deadline, server);
  if (!s.isOk()) {
    *why = s;
    return Handshake::kRetry;
  }
  Result<Bytes> welcome = readFrame(fd, sw::kMaxUnauthenticatedFrame, deadline, server, &closed);
  if (!welcome.isOk()) {
    if (closed) {
      *why = BAGUA_ERROR(kInvalidArgument,
                         "TCP store %s closed the connection after this process's hello: it "
                         "refused this process's job key (BAGUA_JOB_KEY or BAGUA_JOB_KEY_FILE "
                         "must be the same on every rank; the store logs the refused address)",
                         server.c_str());
      return Handshake::kRetry;
    }
    *why = welcome.takeStatus();
    return Handshake::kFail;
  }
  s = session.welcome(*welcome);
  if (!s.isOk()) {
    *why = s.withContext(strPrintf("TCP store %s", server.c_str()));
    return Handshake::kFail;
  }
  return Handshake::kOk;
}

}  // namespace

TcpStore::TcpStore(int fd, std::string server, std::string localAddress,
                   std::unique_ptr<sw::ClientSession> session)
    : fd_(fd),
      session_(std::move(session)),
      server_(std::move(server)),
      localAddress_(std::move(localAddress)) {}

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const TcpStoreOptions& options) {
  const std::string server = strPrintf("%s:%d", options.host.c_str(), options.port);
  Millis deadPeer = options.deadPeerTimeout;
  if (deadPeer.count() < 0) {
    BAGUA_ASSIGN_OR_RETURN(Liveness live, livenessFromParams());
    deadPeer = live.timeout;
  }
  JobKey key;
  if (options.key.has_value()) {
    key = *options.key;
  } else {
    BAGUA_ASSIGN_OR_RETURN(key, jobKeyFromParams());
  }
  const Digest storeKey = key.derive("store");
  const auto deadline = Clock::now() + options.connectTimeout;
  std::string lastError = "no attempt";
  int attempts = 0;
  int refusals = 0;  // handshakes the server ended after our hello
  while (true) {
    ++attempts;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc =
        ::getaddrinfo(options.host.c_str(), std::to_string(options.port).c_str(), &hints, &res);
    if (rc != 0) {
      lastError = strPrintf("cannot resolve: %s", gai_strerror(rc));
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
          lastError = std::strerror(errno);
          continue;
        }
        int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r < 0 && errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          int left = std::max(1, std::min(remainingMs(deadline), 1000));
          if (::poll(&p, 1, left) == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            r = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (r != 0) {
          lastError = std::strerror(errno);
          ::close(fd);
          continue;
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        Status bound = setDeadPeerBound(fd, deadPeer);
        if (!bound.isOk()) {
          ::close(fd);
          ::freeaddrinfo(res);
          return bound.withContext(strPrintf("TCP store %s", server.c_str()));
        }
        Result<sw::Nonce> nonce = sw::freshNonce();
        if (!nonce.isOk()) {
          ::close(fd);
          ::freeaddrinfo(res);
          return nonce.takeStatus();
        }
        auto session = std::make_unique<sw::ClientSession>(storeKey, *nonce);
        // The server answers at once; a few seconds cover a loaded host.
        const auto hsDeadline = std::min(deadline, Clock::now() + Millis(10000));
        Status why;
        Handshake h = handshake(fd, *session, std::max(hsDeadline, Clock::now() + Millis(1000)),
                                server, &why);
        if (h != Handshake::kOk) {
          ::close(fd);
          lastError = why.message();
          // A refusal after our hello is a wrong key, or a server shedding connections under
          // a flood: a third one is the key.
          const bool refused = h == Handshake::kRetry && why.code() == StatusCode::kInvalidArgument;
          if (h == Handshake::kFail || (refused && ++refusals >= 3)) {
            ::freeaddrinfo(res);
            return why;
          }
          continue;
        }
        ::freeaddrinfo(res);
        sockaddr_storage local{};
        socklen_t llen = sizeof(local);
        std::string localIp = "127.0.0.1";
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0) {
          std::string ip = addrText(reinterpret_cast<sockaddr*>(&local));
          if (!ip.empty()) {
            localIp = ip;
          }
        }
        BAGUA_LOG_DEBUG(kLogInit, "connected to TCP store %s after %d attempt(s)", server.c_str(),
                        attempts);
        return std::unique_ptr<TcpStore>(new TcpStore(fd, server, localIp, std::move(session)));
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() >= deadline) {
      break;
    }
    std::this_thread::sleep_for(Millis(std::min(100, std::max(1, remainingMs(deadline)))));
  }
  return BAGUA_ERROR(kUnavailable,
                     "cannot reach the TCP store at %s within %lld ms (%d attempts, last error: "
                     "%s); check MASTER_ADDR/MASTER_PORT and that rank 0 is running",
                     server.c_str(), static_cast<long long>(options.connectTimeout.count()),
                     attempts, lastError.c_str());
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

Result<std::vector<Bytes>> TcpStore::request(uint8_t op, const std::vector<Bytes>& args,
                                             Millis timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "TCP store %s: connection unusable after an earlier failure",
                       server_.c_str());
  }
  // The server answers blocking requests itself at their deadline; allow it some slack.
  const auto deadline = Clock::now() + timeout + Millis(10000);
  Bytes frame = session_->request(op, args);
  Status s = ioAll(fd_, frame.data(), frame.size(), true, deadline, server_);
  Result<sw::Reply> reply = Status();
  if (s.isOk()) {
    Result<Bytes> body = readFrame(fd_, sw::kMaxFrame, deadline, server_);
    if (body.isOk()) {
      reply = session_->response(*body);
      if (!reply.isOk()) {
        s = reply.takeStatus().withContext(strPrintf("TCP store %s", server_.c_str()));
      }
    } else {
      s = body.takeStatus();
    }
  }
  if (!s.isOk()) {
    ::close(fd_);
    fd_ = -1;
    return s;
  }
  const uint8_t code = reply->code;
  std::vector<Bytes>& out = reply->args;
  if (code == sw::kDeadline) {
    std::string missing;
    for (size_t i = 0; i < out.size() && i < 8; ++i) {
      missing += (i ? ", " : "") + toString(out[i]);
    }
    return BAGUA_ERROR(kDeadlineExceeded,
                       "TCP store %s: waited %lld ms for keys that never appeared: %s",
                       server_.c_str(), static_cast<long long>(timeout.count()), missing.c_str());
  }
  if (code != sw::kOk) {
    return BAGUA_ERROR(kInvalidArgument, "TCP store %s rejected the request: %s", server_.c_str(),
                       out.empty() ? "?" : toString(out[0]).c_str());
  }
  return std::move(out);
}

using sw::bytesI64;
using sw::i64Bytes;

Status TcpStore::set(const std::string& key, const Bytes& value) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(sw::kSet, {toBytes(key), value}, Millis(0)));
  (void)r;
  return Status::ok();
}

Result<Bytes> TcpStore::get(const std::string& key, Millis timeout) {
  BAGUA_ASSIGN_OR_RETURN(auto r,
                         request(sw::kGet, {i64Bytes(timeout.count()), toBytes(key)}, timeout));
  if (r.size() != 1) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s: bad get response", server_.c_str());
  }
  return std::move(r[0]);
}

Status TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  if (keys.empty()) {
    return Status::ok();
  }
  std::vector<Bytes> args{i64Bytes(timeout.count())};
  for (const auto& k : keys) {
    args.push_back(toBytes(k));
  }
  BAGUA_ASSIGN_OR_RETURN(auto r, request(sw::kWait, args, timeout));
  (void)r;
  return Status::ok();
}

Result<int64_t> TcpStore::add(const std::string& key, int64_t delta) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(sw::kAdd, {toBytes(key), i64Bytes(delta)}, Millis(0)));
  if (r.size() != 1) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s: bad add response", server_.c_str());
  }
  return bytesI64(r[0]);
}

Result<Bytes> TcpStore::compareSet(const std::string& key, const Bytes& expected,
                                   const Bytes& desired) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(sw::kCas, {toBytes(key), expected, desired}, Millis(0)));
  if (r.size() != 1) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s: bad compareSet response", server_.c_str());
  }
  return std::move(r[0]);
}

Result<bool> TcpStore::check(const std::string& key) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(sw::kCheck, {toBytes(key)}, Millis(0)));
  return r.size() == 1 && r[0].size() == 1 && r[0][0] == 1;
}

}  // namespace bagua::core
