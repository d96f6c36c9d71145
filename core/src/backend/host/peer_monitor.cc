#include "backend/host/peer_monitor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/host/transport.h"
#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/params.h"

namespace bagua::core::host {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x42474842;  // "BGHB"
constexpr uint32_t kBeat = 1;
constexpr uint32_t kBye = 2;
constexpr uint32_t kLost = 3;     // `about` is the rank the sender declared lost
constexpr size_t kDatagram = 24;  // magic, kind, rank, about (u32 each), sender's token (u64)
constexpr char kSep = '\x1f';     // field separator of the published value

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == kSep) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

// A numeric IPv4/IPv6 address and port as a sockaddr.
bool toSockaddr(const std::string& ip, int port, std::vector<unsigned char>* out) {
  sockaddr_in a4{};
  sockaddr_in6 a6{};
  if (::inet_pton(AF_INET, ip.c_str(), &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    a4.sin_port = htons(static_cast<uint16_t>(port));
    out->assign(reinterpret_cast<unsigned char*>(&a4), reinterpret_cast<unsigned char*>(&a4 + 1));
    return true;
  }
  if (::inet_pton(AF_INET6, ip.c_str(), &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons(static_cast<uint16_t>(port));
    out->assign(reinterpret_cast<unsigned char*>(&a6), reinterpret_cast<unsigned char*>(&a6 + 1));
    return true;
  }
  return false;
}

std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

Result<std::unique_ptr<PeerMonitor>> PeerMonitor::start(Store& store, int rank, int size,
                                                        const PeerMonitorOptions& options,
                                                        LostFn onLost) {
  const std::string ip = options.bindAddress.empty() ? store.localAddress() : options.bindAddress;
  std::vector<unsigned char> bindAddr;
  if (!toSockaddr(ip, 0, &bindAddr)) {
    return BAGUA_ERROR(kInvalidArgument, "heartbeat: '%s' is not an IP address", ip.c_str());
  }
  std::unique_ptr<PeerMonitor> m(new PeerMonitor());
  m->rank_ = rank;
  m->options_ = options;
  m->onLost_ = std::move(onLost);
  const int family = reinterpret_cast<const sockaddr*>(bindAddr.data())->sa_family;
  m->fd_ = ::socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (m->fd_ < 0) {
    return BAGUA_ERRNO(errno, "heartbeat: socket(UDP)");
  }
  if (::bind(m->fd_, reinterpret_cast<const sockaddr*>(bindAddr.data()),
             static_cast<socklen_t>(bindAddr.size())) != 0) {
    return BAGUA_ERRNO(errno, strPrintf("heartbeat: bind to %s", ip.c_str()));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(m->fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return BAGUA_ERRNO(errno, "heartbeat: getsockname");
  }
  const int port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  std::random_device rd;
  m->token_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const std::string me = hostIdentity();
  const std::string value = ip + kSep + std::to_string(port) + kSep + std::to_string(m->token_) +
                            kSep + me + kSep + hostName();
  BAGUA_RETURN_IF_ERROR(store.set(strPrintf("hb/%d", rank), toBytes(value)));
  const auto setupDeadline = Clock::now() + options.setupTimeout;
  m->peers_.resize(size);
  int watched = 0;
  for (int p = 0; p < size; ++p) {
    if (p == rank) {
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(setupDeadline - Clock::now());
    BAGUA_ASSIGN_OR_RETURN(
        Bytes b, store.get(strPrintf("hb/%d", p), std::max(left, std::chrono::milliseconds(1))));
    std::vector<std::string> f = split(toString(b));
    Peer& peer = m->peers_[p];
    if (f.size() != 5 || !toSockaddr(f[0], std::atoi(f[1].c_str()), &peer.sockaddr)) {
      return BAGUA_ERROR(kRemoteError, "heartbeat: rank %d published a bad address '%s'", p,
                         toString(b).c_str());
    }
    peer.address = f[0] + ":" + f[1];
    peer.token = std::strtoull(f[2].c_str(), nullptr, 10);
    peer.host = f[4];
    peer.watched = f[3] != me;  // same host: its death closes our sockets
    watched += peer.watched ? 1 : 0;
  }
  if (watched == 0) {
    return std::unique_ptr<PeerMonitor>();
  }
  BAGUA_LOG_DEBUG(kLogCore,
                  "rank %d: heartbeat on %s:%d to %d peer(s) on other hosts, every %lld ms, lost "
                  "after %lld ms",
                  rank, ip.c_str(), port, watched, static_cast<long long>(options.interval.count()),
                  static_cast<long long>(options.timeout.count()));
  PeerMonitor* raw = m.get();
  m->thread_ = std::jthread([raw](std::stop_token st) { raw->loop(st); });
  return m;
}

PeerMonitor::~PeerMonitor() {
  stop();
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void PeerMonitor::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) {
      return;
    }
    stopped_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  if (fd_ >= 0) {
    sendAll(kBye, 0, false);
    sendAll(kBye, 0, false);  // a second copy: one lost datagram must not make us look lost
  }
}

std::string PeerMonitor::waitLost(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, grace, [&] { return !lost_.empty() || stopped_; });
  return lost_;
}

int PeerMonitor::watchedPeers() const {
  return static_cast<int>(
      std::count_if(peers_.begin(), peers_.end(), [](const Peer& p) { return p.watched; }));
}

std::string PeerMonitor::describe(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size()) || rank == rank_) {
    return strPrintf("rank %d", rank);
  }
  const Peer& p = peers_[rank];
  return strPrintf("rank %d at %s (host %s)", rank, p.address.c_str(), p.host.c_str());
}

void PeerMonitor::sendAll(uint32_t kind, uint32_t about, bool watchedOnly) {
  unsigned char d[kDatagram];
  const uint32_t magic = kMagic;
  const uint32_t rank = static_cast<uint32_t>(rank_);
  std::memcpy(d, &magic, 4);
  std::memcpy(d + 4, &kind, 4);
  std::memcpy(d + 8, &rank, 4);
  std::memcpy(d + 12, &about, 4);
  std::memcpy(d + 16, &token_, 8);
  for (size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (static_cast<int>(r) == rank_ || (watchedOnly && !p.watched)) {
      continue;
    }
    // Errors (no route while our own link is down, ICMP unreachable) are what the peer's
    // silence will tell us anyway.
    (void)::sendto(fd_, d, sizeof(d), MSG_DONTWAIT | MSG_NOSIGNAL,
                   reinterpret_cast<const sockaddr*>(p.sockaddr.data()),
                   static_cast<socklen_t>(p.sockaddr.size()));
  }
}

void PeerMonitor::declareLost(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.empty()) {
      return;
    }
    lost_ = why;
  }
  cv_.notify_all();
  BAGUA_LOG_WARN(kLogCore, "rank %d: %s", rank_, why.c_str());
  onLost_(why);
}

void PeerMonitor::drain(Clock::time_point now) {
  unsigned char d[64];
  while (true) {
    ssize_t n = ::recv(fd_, d, sizeof(d), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return;  // EAGAIN, or a queued ICMP error: nothing more to read now
    }
    if (n != static_cast<ssize_t>(kDatagram)) {
      continue;
    }
    uint32_t magic = 0;
    uint32_t kind = 0;
    uint32_t from = 0;
    uint32_t about = 0;
    uint64_t token = 0;
    std::memcpy(&magic, d, 4);
    std::memcpy(&kind, d + 4, 4);
    std::memcpy(&from, d + 8, 4);
    std::memcpy(&about, d + 12, 4);
    std::memcpy(&token, d + 16, 8);
    if (magic != kMagic || from >= peers_.size() || static_cast<int>(from) == rank_ ||
        peers_[from].token != token) {
      continue;
    }
    Peer& p = peers_[from];
    p.lastHeard = now;
    if (kind == kBye && !p.departed) {
      p.departed = true;
      BAGUA_LOG_DEBUG(kLogCore, "rank %d: heartbeat: rank %u left in order", rank_, from);
    } else if (kind == kLost && static_cast<int>(about) != rank_) {
      declareLost(
          strPrintf("%s is lost: rank %u has not heard from it for "
                    "BAGUA_PEER_TIMEOUT_MS=%lld ms (its host vanished, froze, or the "
                    "network to it is cut)",
                    describe(static_cast<int>(about)).c_str(), from,
                    static_cast<long long>(options_.timeout.count())));
    } else if (kind == kLost) {
      declareLost(
          strPrintf("%s has not heard from this rank for BAGUA_PEER_TIMEOUT_MS=%lld ms "
                    "and left the group (is this host's network cut?)",
                    describe(static_cast<int>(from)).c_str(),
                    static_cast<long long>(options_.timeout.count())));
    }
  }
}

void PeerMonitor::loop(std::stop_token stop) {
  setThreadName("bagua-heartbeat");
  const auto start = Clock::now();
  for (Peer& p : peers_) {
    p.lastHeard = start;
  }
  auto nextSend = start;
  while (!stop.stop_requested()) {
    auto now = Clock::now();
    if (now >= nextSend) {
      sendAll(kBeat, 0, true);
      nextSend = now + options_.interval;
    }
    // Read everything queued before judging anyone: after a stall of this thread the peers'
    // beats are waiting in the socket buffer.
    drain(now);
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = !lost_.empty();
    }
    for (size_t r = 0; r < peers_.size() && !known; ++r) {
      const Peer& p = peers_[r];
      if (!p.watched || p.departed || now - p.lastHeard <= options_.timeout) {
        continue;
      }
      const double silent = std::chrono::duration<double>(now - p.lastHeard).count();
      // Tell the others first, so that a survivor our abort disconnects already knows why.
      sendAll(kLost, static_cast<uint32_t>(r), false);
      declareLost(
          strPrintf("%s has not been heard from for %.1f s (BAGUA_PEER_TIMEOUT_MS=%lld): "
                    "its host vanished, froze, or the network to it is cut",
                    describe(static_cast<int>(r)).c_str(), silent,
                    static_cast<long long>(options_.timeout.count())));
      known = true;
    }
    auto wait = std::min<Clock::duration>(nextSend - Clock::now(), std::chrono::milliseconds(200));
    int ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()));
    pollfd p{fd_, POLLIN, 0};
    (void)::poll(&p, 1, ms);
  }
}

}  // namespace bagua::core::host
