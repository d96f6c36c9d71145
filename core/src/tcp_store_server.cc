// The TCP store's server: Boost.Asio on one thread ("bagua-store"), every session, the data and
// the waiters on it, with its resources bounded (pending connections, their memory and time).
// The wire format, the handshake and the request semantics are store_wire.h's; the client, and
// where the server listens (storeListenAddress), are tcp_store_client.cc's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <list>
#include <set>
#include <thread>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/params.h"
#include "bagua/core/store.h"
#include "liveness.h"
#include "store_wire.h"

namespace bagua::core {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace sw = storewire;

namespace {

std::string endpointText(const tcp::socket& s) {
  boost::system::error_code ec;
  tcp::endpoint ep = s.remote_endpoint(ec);
  if (ec) {
    return "?";
  }
  return ep.address().is_v6() ? "[" + ep.address().to_string() + "]:" + std::to_string(ep.port())
                              : ep.address().to_string() + ":" + std::to_string(ep.port());
}

// 1, 2, ..., 10, then 100, 1000, ...: how often a repeated event is worth a log line.
bool worthLogging(uint64_t n) {
  if (n <= 10) {
    return true;
  }
  while (n % 10 == 0) {
    n /= 10;
  }
  return n == 1;
}

}  // namespace
class TcpStoreServer::Impl {
 public:
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* server, tcp::socket socket, const sw::Nonce& nonce)
        : server_(server),
          socket_(std::move(socket)),
          peer_(endpointText(socket_)),
          timer_(server->io_),
          core_(server->storeKey_, nonce),
          reader_(sw::kMaxUnauthenticatedFrame),
          inbuf_(512) {}

    const std::string& peer() const { return peer_; }
    bool authenticated() const { return core_.authenticated(); }

    void start() {
      auto self = shared_from_this();
      // Until it proves the key: a deadline, and a small buffer.
      timer_.expires_after(server_->options_.authTimeout);
      timer_.async_wait([this, self](boost::system::error_code ec) {
        if (!ec && !core_.authenticated()) {
          drop(strPrintf("no hello within %lld ms",
                         static_cast<long long>(server_->options_.authTimeout.count())));
        }
      });
      send(core_.challengeFrame());
    }

    void close() {
      if (closed_) {
        return;
      }
      closed_ = true;
      boost::system::error_code ec;
      timer_.cancel();
      socket_.close(ec);
      server_->forget(this);
    }

    // A stranger (or a rank with another key): logged with its address, then closed.
    void drop(const std::string& why) {
      if (closed_) {
        return;
      }
      server_->stranger(peer_, why);
      close();
    }

    // A parked get/wait: answered if its keys are all present now. Returns true if answered.
    bool tryComplete() {
      if (closed_ || !server_->data_.ready(parked_)) {
        return false;
      }
      timer_.cancel();
      send(core_.respond(server_->data_.complete(parked_)));
      return true;
    }

   private:
    void readSome() {
      auto self = shared_from_this();
      socket_.async_read_some(asio::buffer(inbuf_),
                              [this, self](boost::system::error_code ec, size_t n) {
                                if (ec || closed_) {
                                  close();  // peer closed: the session ends with this handler
                                  return;
                                }
                                inPos_ = 0;
                                inLen_ = n;
                                process();
                              });
    }

    // Frames in what was read, one at a time: a request is answered before the next is read.
    void process() {
      while (!busy_ && !closed_ && inPos_ < inLen_) {
        Result<size_t> used = reader_.feed(inbuf_.data() + inPos_, inLen_ - inPos_);
        if (!used.isOk()) {
          if (core_.authenticated()) {
            BAGUA_LOG_WARN(kLogCore, "TCP store: closing the connection of %s: %s", peer_.c_str(),
                           used.status().message().c_str());
            close();
          } else {
            drop(used.status().message());
          }
          return;
        }
        inPos_ += *used;
        if (reader_.hasFrame()) {
          handle(reader_.take());
        }
      }
      if (!busy_ && !closed_) {
        readSome();
      }
    }

    void handle(const Bytes& body) {
      const bool wasAuthed = core_.authenticated();
      bool changed = false;
      sw::ServerSession::Action a = core_.onFrame(body, server_->data_, &changed);
      if (a.kind == sw::ServerSession::Action::kClose) {
        if (wasAuthed) {
          BAGUA_LOG_WARN(kLogCore, "TCP store: closing the connection of %s: %s", peer_.c_str(),
                         a.reason.c_str());
          close();
        } else {
          drop(a.reason);
        }
        return;
      }
      if (!wasAuthed) {
        timer_.cancel();
        reader_.setMaxFrame(sw::kMaxFrame);
        inbuf_.resize(4096);  // the data after inPos_ stays where it is
        server_->admitted(this);
      }
      if (a.kind == sw::ServerSession::Action::kPark) {
        park(std::move(a.parked));
      } else {
        send(std::move(a.frame));
      }
      if (changed) {
        server_->notifyWaiters();
      }
    }

    void park(sw::Parked p) {
      parked_ = std::move(p);
      busy_ = true;
      auto self = shared_from_this();
      server_->waiters_.insert(self);
      timer_.expires_after(std::chrono::milliseconds(parked_.timeoutMs));
      timer_.async_wait([this, self](boost::system::error_code ec) {
        if (ec || server_->waiters_.erase(self) == 0) {
          return;
        }
        send(core_.respond(server_->data_.complete(parked_)));
      });
    }

    void send(Bytes frame) {
      busy_ = true;
      out_ = std::move(frame);
      auto self = shared_from_this();
      asio::async_write(socket_, asio::buffer(out_),
                        [this, self](boost::system::error_code ec, size_t) {
                          if (ec) {
                            close();
                            return;
                          }
                          busy_ = false;
                          process();
                        });
    }

    Impl* server_;
    tcp::socket socket_;
    std::string peer_;
    asio::steady_timer timer_;  // the hello deadline, then a parked request's
    sw::ServerSession core_;
    sw::FrameReader reader_;
    std::vector<uint8_t> inbuf_;
    size_t inPos_ = 0;
    size_t inLen_ = 0;
    Bytes out_;
    bool busy_ = false;  // a reply is being written, or a request is parked
    bool closed_ = false;
    sw::Parked parked_;
  };

  Impl() : acceptor_(io_), acceptRetry_(io_) {}

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
    address_ = host;
    accept();
    thread_ = std::jthread([this] {
      setThreadName("bagua-store");
      io_.run();
    });
    return Status::ok();
  }

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || stopped_) {
        return;  // acceptor closed
      }
      if (ec) {
        acceptFailed(ec);
        return;
      }
      if (acceptErrors_ > 0) {
        BAGUA_LOG_INFO(kLogCore,
                       "TCP store %s:%d accepts connections again (after %llu failed "
                       "accepts)",
                       address_.c_str(), port_, static_cast<unsigned long long>(acceptErrors_));
        acceptErrors_ = 0;
      }
      Result<sw::Nonce> nonce = sw::freshNonce();
      if (nonce.isOk()) {
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        // A client whose host vanished: its session (and parked waits) go within the bound
        // instead of lingering for TCP's two hours.
        (void)setDeadPeerBound(socket.native_handle(), deadPeerTimeout_);
        auto s = std::make_shared<Session>(this, std::move(socket), *nonce);
        while (pending_.size() >= options_.maxPending) {
          std::shared_ptr<Session> oldest = pending_.front().lock();
          pending_.pop_front();
          if (oldest) {
            oldest->drop(
                strPrintf("more than %zu connections waiting to authenticate; the oldest "
                          "goes",
                          options_.maxPending));
          }
        }
        sessions_.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
        sessions_.push_back(s);
        pending_.push_back(s);
        s->start();
      } else {
        BAGUA_LOG_ERROR(kLogCore, "TCP store: no random nonce for a connection: %s",
                        nonce.status().message().c_str());
      }
      accept();
    });
  }

  // Every accept error is survived. Out of descriptors or memory: close the oldest connection
  // still waiting to authenticate (strangers hold descriptors too), back off and retry, one log
  // line per episode. Anything else (a connection reset while queued): retry soon.
  void acceptFailed(const boost::system::error_code& ec) {
    const int e = ec.value();
    const bool exhausted = e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
    const auto now = std::chrono::steady_clock::now();
    ++acceptErrors_;
    if (exhausted) {
      // One line per minute at most: a storm alternates failures with the successes that each
      // freed descriptor allows.
      if (exhaustedLogged_ && now - lastExhaustedLog_ < std::chrono::seconds(60)) {
        ++exhaustedSilenced_;
      } else {
        BAGUA_LOG_WARN(kLogCore,
                       "TCP store %s:%d cannot accept connections: %s; retrying every 100 ms "
                       "(raise the descriptor limit, ulimit -n, if this job needs more)%s",
                       address_.c_str(), port_, ec.message().c_str(),
                       exhaustedSilenced_ > 0
                           ? strPrintf(" (%llu more since the last report)",
                                       static_cast<unsigned long long>(exhaustedSilenced_))
                                 .c_str()
                           : "");
        exhaustedLogged_ = true;
        lastExhaustedLog_ = now;
        exhaustedSilenced_ = 0;
      }
    } else if (acceptErrors_ == 1) {
      BAGUA_LOG_DEBUG(kLogCore, "TCP store %s:%d: accept failed: %s; retrying", address_.c_str(),
                      port_, ec.message().c_str());
    }
    if (exhausted && !pending_.empty()) {
      std::shared_ptr<Session> oldest = pending_.front().lock();
      pending_.pop_front();
      if (oldest) {
        oldest->drop("descriptors exhausted; the oldest unauthenticated connection goes");
      }
    }
    acceptRetry_.expires_after(std::chrono::milliseconds(exhausted ? 100 : 10));
    acceptRetry_.async_wait([this](boost::system::error_code tec) {
      if (!tec && !stopped_) {
        accept();
      }
    });
  }

  void admitted(Session* s) {
    pending_.remove_if([s](const std::weak_ptr<Session>& w) {
      auto p = w.lock();
      return !p || p.get() == s;
    });
    BAGUA_LOG_DEBUG(kLogCore, "TCP store: %s authenticated", s->peer().c_str());
  }
  void forget(Session* s) {
    pending_.remove_if([s](const std::weak_ptr<Session>& w) {
      auto p = w.lock();
      return !p || p.get() == s;
    });
  }

  void stranger(const std::string& peer, const std::string& why) {
    ++strangers_;
    if (worthLogging(strangers_)) {
      BAGUA_LOG_WARN(kLogCore,
                     "TCP store %s:%d: dropped the connection from %s: %s (%llu dropped "
                     "so far)",
                     address_.c_str(), port_, peer.c_str(), why.c_str(),
                     static_cast<unsigned long long>(strangers_));
    }
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
    acceptRetry_.cancel();
    for (auto& w : sessions_) {
      if (auto s = w.lock()) {
        s->close();
      }
    }
    waiters_.clear();
    pending_.clear();
  }

  ~Impl() { stop(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer acceptRetry_;
  TcpStoreServerOptions options_;
  Digest storeKey_{};
  std::string address_;
  int port_ = 0;
  Millis deadPeerTimeout_{0};
  std::atomic<bool> stopped_{false};
  uint64_t acceptErrors_ = 0;  // failed accepts since the last success (io thread)
  bool exhaustedLogged_ = false;
  std::chrono::steady_clock::time_point lastExhaustedLog_{};
  uint64_t exhaustedSilenced_ = 0;
  uint64_t strangers_ = 0;  // connections dropped before authenticating (io thread)
  sw::Data data_;
  std::set<std::shared_ptr<Session>> waiters_;
  std::list<std::weak_ptr<Session>> sessions_;
  std::list<std::weak_ptr<Session>> pending_;  // not yet authenticated, oldest first
  std::jthread thread_;
};

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(
    const std::string& host, int port, const TcpStoreServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  BAGUA_ASSIGN_OR_RETURN(Liveness live, livenessFromParams());
  impl->deadPeerTimeout_ = live.timeout;
  impl->options_ = options;
  impl->options_.maxPending = std::max<size_t>(1, options.maxPending);
  JobKey key;
  if (options.key.has_value()) {
    key = *options.key;
  } else {
    BAGUA_ASSIGN_OR_RETURN(key, jobKeyFromParams());
  }
  impl->storeKey_ = key.derive("store");
  BAGUA_RETURN_IF_ERROR(impl->listen(host, port));
  BAGUA_LOG_INFO(kLogInit, "TCP store server listening on %s:%d (%s)", host.c_str(), impl->port_,
                 key.present() ? "job key required" : "no job key: unauthenticated");
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

}  // namespace bagua::core
