#include "backend/host/peer_monitor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "backend/host/transport.h"
#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/core/params.h"

namespace bagua::core::host {

namespace {

using Clock = std::chrono::steady_clock;

using wire::kBeat;
using wire::kBye;
using wire::kLost;
constexpr char kSep = '\x1f';  // field separator of the published value

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

std::string sockaddrText(const std::vector<unsigned char>& sa) {
  if (sa.size() < sizeof(sockaddr)) {
    return "?";
  }
  const auto* a = reinterpret_cast<const sockaddr*>(sa.data());
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a->sa_family == AF_INET && sa.size() >= sizeof(sockaddr_in)) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(sa.data());
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof(buf));
    return strPrintf("%s:%d", buf, ntohs(v4->sin_port));
  }
  if (a->sa_family == AF_INET6 && sa.size() >= sizeof(sockaddr_in6)) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(sa.data());
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof(buf));
    return strPrintf("[%s]:%d", buf, ntohs(v6->sin6_port));
  }
  return buf;
}

// The same family, address and port (the published sockaddr against recvfrom's).
bool sameEndpoint(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  if (a.size() < sizeof(sockaddr) || b.size() < sizeof(sockaddr)) {
    return false;
  }
  const auto* x = reinterpret_cast<const sockaddr*>(a.data());
  const auto* y = reinterpret_cast<const sockaddr*>(b.data());
  if (x->sa_family != y->sa_family) {
    return false;
  }
  if (x->sa_family == AF_INET && a.size() >= sizeof(sockaddr_in) &&
      b.size() >= sizeof(sockaddr_in)) {
    const auto* p = reinterpret_cast<const sockaddr_in*>(a.data());
    const auto* q = reinterpret_cast<const sockaddr_in*>(b.data());
    return p->sin_port == q->sin_port && p->sin_addr.s_addr == q->sin_addr.s_addr;
  }
  if (x->sa_family == AF_INET6 && a.size() >= sizeof(sockaddr_in6) &&
      b.size() >= sizeof(sockaddr_in6)) {
    const auto* p = reinterpret_cast<const sockaddr_in6*>(a.data());
    const auto* q = reinterpret_cast<const sockaddr_in6*>(b.data());
    return p->sin6_port == q->sin6_port &&
           std::memcmp(&p->sin6_addr, &q->sin6_addr, sizeof(in6_addr)) == 0;
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
  JobKey key;
  if (options.key.has_value()) {
    key = *options.key;
  } else {
    BAGUA_ASSIGN_OR_RETURN(key, jobKeyFromParams());
  }
  const Digest hk = key.derive("heartbeat");
  m->key_ = std::make_unique<HmacSha256>(hk.data(), hk.size());
  BAGUA_ASSIGN_OR_RETURN(m->nonce_, wire::freshNonce());
  const std::string me = hostIdentity();
  const std::string value = ip + kSep + std::to_string(port) + kSep + wire::nonceHex(m->nonce_) +
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
    if (f.size() != 5 || !toSockaddr(f[0], std::atoi(f[1].c_str()), &peer.sockaddr) ||
        !wire::parseNonceHex(f[2], &peer.nonce)) {
      return BAGUA_ERROR(kRemoteError, "heartbeat: rank %d published a bad address '%s'", p,
                         toString(b).c_str());
    }
    peer.address = f[0] + ":" + f[1];
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
  if (key_ == nullptr) {
    return;  // start() failed before the key was set: nobody to tell
  }
  wire::Beat beat;
  beat.kind = kind;
  beat.from = static_cast<uint32_t>(rank_);
  beat.about = about;
  beat.counter = ++counter_;
  const wire::Datagram d = wire::encodeBeat(*key_, nonce_, beat);
  for (size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (static_cast<int>(r) == rank_ || (watchedOnly && !p.watched)) {
      continue;
    }
    // Errors (no route while our own link is down, ICMP unreachable) are what the peer's
    // silence will tell us anyway.
    (void)::sendto(fd_, d.data(), d.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
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

void PeerMonitor::rejected(const std::vector<unsigned char>& from, const std::string& why) {
  ++rejected_;
  if (rejected_ <= 10 || rejected_ % 1000 == 0) {
    BAGUA_LOG_WARN(kLogCore, "rank %d: heartbeat: ignored a datagram from %s: %s (%llu so far)",
                   rank_, sockaddrText(from).c_str(), why.c_str(),
                   static_cast<unsigned long long>(rejected_));
  }
}

void PeerMonitor::drain(Clock::time_point now) {
  unsigned char d[128];
  std::vector<unsigned char> source(sizeof(sockaddr_storage));
  while (true) {
    socklen_t slen = sizeof(sockaddr_storage);
    source.resize(sizeof(sockaddr_storage));
    ssize_t n = ::recvfrom(fd_, d, sizeof(d), MSG_DONTWAIT,
                           reinterpret_cast<sockaddr*>(source.data()), &slen);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return;  // EAGAIN, or a queued ICMP error: nothing more to read now
    }
    source.resize(std::min<size_t>(slen, sizeof(sockaddr_storage)));
    Result<wire::Beat> beat = wire::parseBeat(d, static_cast<size_t>(n));
    if (!beat.isOk()) {
      rejected(source, beat.status().message());
      continue;
    }
    const uint32_t from = beat->from;
    if (from >= peers_.size() || static_cast<int>(from) == rank_) {
      rejected(source, strPrintf("claims rank %u", from));
      continue;
    }
    if (!wire::verifyBeat(d, *key_, peers_[from].nonce)) {
      rejected(source, strPrintf("claims rank %u without the job key's proof", from));
      continue;
    }
    if (!sameEndpoint(source, peers_[from].sockaddr)) {
      rejected(source, strPrintf("claims rank %u, which sends from %s", from,
                                 peers_[from].address.c_str()));
      continue;
    }
    if (beat->counter <= peers_[from].counter) {
      rejected(source, strPrintf("rank %u's counter %llu again (a replay)", from,
                                 static_cast<unsigned long long>(beat->counter)));
      continue;
    }
    peers_[from].counter = beat->counter;
    const uint32_t kind = beat->kind;
    const uint32_t about = beat->about;
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
