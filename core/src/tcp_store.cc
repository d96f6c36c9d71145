// The TCP store: a Boost.Asio server on one thread and a POSIX-socket client.
//
// Wire format (both directions): u32 frame length, then the frame. Request frame: u8 op,
// u32 argument count, each argument as u32 length + bytes. Response frame: u8 code
// (0 ok, 1 deadline, 2 bad request), then arguments the same way. Integers are little endian.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <list>
#include <set>
#include <thread>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/store.h"
#include "bagua/net/socket_io.h"
#include "liveness.h"

namespace bagua::core {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCas = 5, kCheck = 6 };
enum Code : uint8_t { kOk = 0, kDeadline = 1, kBad = 2 };

constexpr uint32_t kMaxFrame = 256u << 20;

uint32_t getU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
Bytes i64Bytes(int64_t v) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
  }
  return b;
}
int64_t bytesI64(const Bytes& b) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < b.size(); ++i) {
    v |= static_cast<uint64_t>(b[i]) << (8 * i);
  }
  return static_cast<int64_t>(v);
}

void writeU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

// Frame: u32 body length, then head byte + args. Sized once and filled with memcpy (g++ 13's
// -Wstringop-overflow misreads the equivalent chain of vector inserts at -O3).
Bytes encodeFrame(uint8_t head, const std::vector<Bytes>& args) {
  size_t body = 1 + 4;
  for (const auto& a : args) {
    body += 4 + a.size();
  }
  Bytes frame(4 + body);
  uint8_t* p = frame.data();
  writeU32(p, static_cast<uint32_t>(body));
  p += 4;
  *p++ = head;
  writeU32(p, static_cast<uint32_t>(args.size()));
  p += 4;
  for (const auto& a : args) {
    writeU32(p, static_cast<uint32_t>(a.size()));
    p += 4;
    if (!a.empty()) {
      std::memcpy(p, a.data(), a.size());
      p += a.size();
    }
  }
  return frame;
}

bool decodeBody(const Bytes& body, uint8_t* head, std::vector<Bytes>* args) {
  if (body.size() < 5) {
    return false;
  }
  *head = body[0];
  uint32_t n = getU32(&body[1]);
  size_t pos = 5;
  args->clear();
  for (uint32_t i = 0; i < n; ++i) {
    if (pos + 4 > body.size()) {
      return false;
    }
    uint32_t len = getU32(&body[pos]);
    pos += 4;
    if (pos + len > body.size()) {
      return false;
    }
    args->emplace_back(body.begin() + static_cast<ptrdiff_t>(pos),
                       body.begin() + static_cast<ptrdiff_t>(pos + len));
    pos += len;
  }
  return pos == body.size();
}

}  // namespace

// ---- Server ----------------------------------------------------------------------------------

class TcpStoreServer::Impl {
 public:
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* server, tcp::socket socket)
        : server_(server), socket_(std::move(socket)), timer_(server->io_) {}

    void start() { readHeader(); }
    void close() {
      boost::system::error_code ec;
      timer_.cancel();
      socket_.close(ec);
    }

    // A parked get/wait: respond if its keys are all present now. Returns true if answered.
    bool tryComplete() {
      for (const auto& k : waitKeys_) {
        if (server_->data_.find(k) == server_->data_.end()) {
          return false;
        }
      }
      timer_.cancel();
      if (waitOp_ == kGet) {
        respond(kOk, {server_->data_[waitKeys_[0]]});
      } else {
        respond(kOk, {});
      }
      return true;
    }

   private:
    void readHeader() {
      auto self = shared_from_this();
      asio::async_read(socket_, asio::buffer(header_, 4),
                       [this, self](boost::system::error_code ec, size_t) {
                         if (ec) {
                           return;  // peer closed: the session ends with its last handler
                         }
                         uint32_t len = getU32(header_);
                         if (len > kMaxFrame || len < 5) {
                           close();
                           return;
                         }
                         body_.resize(len);
                         readBody();
                       });
    }
    void readBody() {
      auto self = shared_from_this();
      asio::async_read(socket_, asio::buffer(body_),
                       [this, self](boost::system::error_code ec, size_t) {
                         if (ec) {
                           return;
                         }
                         handle();
                       });
    }

    void handle() {
      uint8_t op = 0;
      std::vector<Bytes> args;
      if (!decodeBody(body_, &op, &args)) {
        respond(kBad, {toBytes("malformed request")});
        return;
      }
      auto& data = server_->data_;
      switch (op) {
      case kSet:
        if (args.size() != 2) {
          break;
        }
        data[toString(args[0])] = args[1];
        respond(kOk, {});
        server_->notifyWaiters();
        return;
      case kCheck:
        if (args.size() != 1) {
          break;
        }
        respond(kOk, {Bytes{static_cast<uint8_t>(data.count(toString(args[0])) ? 1 : 0)}});
        return;
      case kAdd: {
        if (args.size() != 2) {
          break;
        }
        std::string key = toString(args[0]);
        int64_t v = 0;
        auto it = data.find(key);
        if (it != data.end() && !it->second.empty()) {
          std::string s = toString(it->second);
          char* end = nullptr;
          v = std::strtoll(s.c_str(), &end, 10);
          if (end == s.c_str() || *end != '\0') {
            respond(kBad, {toBytes("key '" + key + "' does not hold an integer counter")});
            return;
          }
        }
        v += bytesI64(args[1]);
        data[key] = toBytes(std::to_string(v));
        respond(kOk, {i64Bytes(v)});
        server_->notifyWaiters();
        return;
      }
      case kCas: {
        if (args.size() != 3) {
          break;
        }
        std::string key = toString(args[0]);
        auto it = data.find(key);
        Bytes current = it == data.end() ? Bytes{} : it->second;
        if (current == args[1]) {
          data[key] = args[2];
          current = args[2];
        }
        respond(kOk, {current});
        server_->notifyWaiters();
        return;
      }
      case kGet:
      case kWait: {
        if (args.size() < 2) {
          break;
        }
        int64_t timeoutMs = bytesI64(args[0]);
        waitOp_ = op;
        waitKeys_.clear();
        for (size_t i = 1; i < args.size(); ++i) {
          waitKeys_.push_back(toString(args[i]));
        }
        if (tryComplete()) {
          return;
        }
        server_->waiters_.insert(shared_from_this());
        timer_.expires_after(std::chrono::milliseconds(timeoutMs));
        auto self = shared_from_this();
        timer_.async_wait([this, self](boost::system::error_code ec) {
          if (ec || server_->waiters_.erase(self) == 0) {
            return;
          }
          std::vector<Bytes> missing;
          for (const auto& k : waitKeys_) {
            if (server_->data_.find(k) == server_->data_.end()) {
              missing.push_back(toBytes(k));
            }
          }
          respond(kDeadline, missing);
        });
        return;
      }
      default:
        break;
      }
      respond(kBad, {toBytes(strPrintf("bad request op %u with %zu args", op, args.size()))});
    }

    void respond(uint8_t code, const std::vector<Bytes>& args) {
      out_ = encodeFrame(code, args);
      auto self = shared_from_this();
      asio::async_write(socket_, asio::buffer(out_),
                        [this, self](boost::system::error_code ec, size_t) {
                          if (!ec) {
                            readHeader();
                          }
                        });
    }

    Impl* server_;
    tcp::socket socket_;
    asio::steady_timer timer_;
    uint8_t header_[4] = {};
    Bytes body_;
    Bytes out_;
    uint8_t waitOp_ = 0;
    std::vector<std::string> waitKeys_;
  };

  Impl() : acceptor_(io_) {}

  Status listen(const std::string& host, int port) {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
    if (ec) {
      return BAGUA_ERROR(kInvalidArgument, "TCP store: '%s' is not an IP address: %s", host.c_str(),
                         ec.message().c_str());
    }
    tcp::endpoint ep(addr, static_cast<uint16_t>(port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) {
      acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    }
    if (!ec) {
      acceptor_.bind(ep, ec);
    }
    if (!ec) {
      acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    }
    if (ec) {
      return BAGUA_ERROR(kUnavailable,
                         "TCP store: cannot listen on %s:%d: %s (is another job using the port? "
                         "pick another MASTER_PORT: baguarun --master_port P, or 0 for a free "
                         "one)",
                         host.c_str(), port, ec.message().c_str());
    }
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::jthread([this] {
      setThreadName("bagua-store");
      io_.run();
    });
    return Status::ok();
  }

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) {
        return;  // acceptor closed
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      // A client whose host vanished: its session (and parked waits) go within the bound
      // instead of lingering for TCP's two hours.
      (void)setDeadPeerBound(socket.native_handle(), deadPeerTimeout_);
      auto s = std::make_shared<Session>(this, std::move(socket));
      sessions_.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
      sessions_.push_back(s);
      s->start();
      accept();
    });
  }

  void notifyWaiters() {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->tryComplete()) {
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void stop() {
    if (stopped_) {
      return;
    }
    stopped_ = true;
    io_.stop();
    if (thread_.joinable()) {
      thread_.join();
    }
    // The io thread is gone: close everything here; the io_context's destructor drops the
    // cancelled handlers (which own the sessions).
    boost::system::error_code ec;
    acceptor_.close(ec);
    for (auto& w : sessions_) {
      if (auto s = w.lock()) {
        s->close();
      }
    }
    waiters_.clear();
  }

  ~Impl() { stop(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  asio::io_context io_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  Millis deadPeerTimeout_{0};
  bool stopped_ = false;
  std::map<std::string, Bytes> data_;
  std::set<std::shared_ptr<Session>> waiters_;
  std::list<std::weak_ptr<Session>> sessions_;
  std::jthread thread_;
};

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, int port) {
  auto impl = std::make_unique<Impl>();
  BAGUA_ASSIGN_OR_RETURN(Liveness live, livenessFromParams());
  impl->deadPeerTimeout_ = live.timeout;
  BAGUA_RETURN_IF_ERROR(impl->listen(host, port));
  BAGUA_LOG_INFO(kLogInit, "TCP store server listening on %s:%d", host.c_str(), impl->port_);
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() {
  stop();
}
int TcpStoreServer::port() const {
  return impl_->port_;
}
void TcpStoreServer::stop() {
  if (impl_) {
    impl_->stop();
  }
}

// ---- Client ----------------------------------------------------------------------------------

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

}  // namespace

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const TcpStoreOptions& options) {
  const std::string server = strPrintf("%s:%d", options.host.c_str(), options.port);
  Millis deadPeer = options.deadPeerTimeout;
  if (deadPeer.count() < 0) {
    BAGUA_ASSIGN_OR_RETURN(Liveness live, livenessFromParams());
    deadPeer = live.timeout;
  }
  const auto deadline = Clock::now() + options.connectTimeout;
  std::string lastError = "no attempt";
  int attempts = 0;
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
        if (r == 0) {
          ::freeaddrinfo(res);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          Status bound = setDeadPeerBound(fd, deadPeer);
          if (!bound.isOk()) {
            ::close(fd);
            return bound.withContext(strPrintf("TCP store %s", server.c_str()));
          }
          sockaddr_storage local{};
          socklen_t llen = sizeof(local);
          char buf[INET6_ADDRSTRLEN] = "127.0.0.1";
          if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0) {
            if (local.ss_family == AF_INET) {
              ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, buf,
                          sizeof(buf));
            } else if (local.ss_family == AF_INET6) {
              ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, buf,
                          sizeof(buf));
            }
          }
          BAGUA_LOG_DEBUG(kLogInit, "connected to TCP store %s after %d attempt(s)", server.c_str(),
                          attempts);
          return std::unique_ptr<TcpStore>(new TcpStore(fd, server, buf));
        }
        lastError = std::strerror(errno);
        ::close(fd);
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
                       "TCP store %s: connection unusable after an earlier timeout",
                       server_.c_str());
  }
  // The server answers blocking requests itself at their deadline; allow it some slack.
  const auto deadline = Clock::now() + timeout + Millis(10000);
  Bytes frame = encodeFrame(op, args);
  Status s = ioAll(fd_, frame.data(), frame.size(), true, deadline, server_);
  uint8_t header[4];
  if (s.isOk()) {
    s = ioAll(fd_, header, 4, false, deadline, server_);
  }
  Bytes body;
  if (s.isOk()) {
    uint32_t len = getU32(header);
    if (len > kMaxFrame || len < 5) {
      s = BAGUA_ERROR(kRemoteError, "TCP store %s sent a bad frame length %u", server_.c_str(),
                      len);
    } else {
      body.resize(len);
      s = ioAll(fd_, body.data(), len, false, deadline, server_);
    }
  }
  if (!s.isOk()) {
    ::close(fd_);
    fd_ = -1;
    return s;
  }
  uint8_t code = 0;
  std::vector<Bytes> out;
  if (!decodeBody(body, &code, &out)) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s sent a malformed response", server_.c_str());
  }
  if (code == kDeadline) {
    std::string missing;
    for (size_t i = 0; i < out.size() && i < 8; ++i) {
      missing += (i ? ", " : "") + toString(out[i]);
    }
    return BAGUA_ERROR(kDeadlineExceeded,
                       "TCP store %s: waited %lld ms for keys that never appeared: %s",
                       server_.c_str(), static_cast<long long>(timeout.count()), missing.c_str());
  }
  if (code != kOk) {
    return BAGUA_ERROR(kInvalidArgument, "TCP store %s rejected the request: %s", server_.c_str(),
                       out.empty() ? "?" : toString(out[0]).c_str());
  }
  return out;
}

Status TcpStore::set(const std::string& key, const Bytes& value) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(kSet, {toBytes(key), value}, Millis(0)));
  (void)r;
  return Status::ok();
}

Result<Bytes> TcpStore::get(const std::string& key, Millis timeout) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(kGet, {i64Bytes(timeout.count()), toBytes(key)}, timeout));
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
  BAGUA_ASSIGN_OR_RETURN(auto r, request(kWait, args, timeout));
  (void)r;
  return Status::ok();
}

Result<int64_t> TcpStore::add(const std::string& key, int64_t delta) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(kAdd, {toBytes(key), i64Bytes(delta)}, Millis(0)));
  if (r.size() != 1) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s: bad add response", server_.c_str());
  }
  return bytesI64(r[0]);
}

Result<Bytes> TcpStore::compareSet(const std::string& key, const Bytes& expected,
                                   const Bytes& desired) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(kCas, {toBytes(key), expected, desired}, Millis(0)));
  if (r.size() != 1) {
    return BAGUA_ERROR(kRemoteError, "TCP store %s: bad compareSet response", server_.c_str());
  }
  return std::move(r[0]);
}

Result<bool> TcpStore::check(const std::string& key) {
  BAGUA_ASSIGN_OR_RETURN(auto r, request(kCheck, {toBytes(key)}, Millis(0)));
  return r.size() == 1 && r[0].size() == 1 && r[0][0] == 1;
}

}  // namespace bagua::core
