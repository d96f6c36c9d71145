// The control plane against a stranger who can reach its ports but has no job key (core/README.md,
// "Security"), the transports' half: the socket mesh's hello (bad, idle and replayed hellos, a rank
// with another key), the engine's connection proof, and heartbeat datagrams that are forged,
// replayed or misaddressed, over real sockets. The process's key is set by the environment
// control_plane_test.cc registers (same executable).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "control_plane_support.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using namespace cptest;

// ---- the socket mesh's hello -----------------------------------------------------------------

// A view of a store whose get of one key waits until the test opens the gate: rank 1 connects
// only after the outsider has had its go at rank 0's listener.
class GatedStore final : public Store {
 public:
  GatedStore(std::shared_ptr<Store> base, std::string gatedKey)
      : base_(std::move(base)), gated_(std::move(gatedKey)) {}
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  Status set(const std::string& k, const Bytes& v) override { return base_->set(k, v); }
  Result<Bytes> get(const std::string& k, Millis timeout) override {
    if (k == gated_) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, timeout, [&] { return open_; });
    }
    return base_->get(k, timeout);
  }
  Status wait(const std::vector<std::string>& k, Millis t) override { return base_->wait(k, t); }
  Result<int64_t> add(const std::string& k, int64_t d) override { return base_->add(k, d); }
  Result<Bytes> compareSet(const std::string& k, const Bytes& e, const Bytes& d) override {
    return base_->compareSet(k, e, d);
  }
  Result<bool> check(const std::string& k) override { return base_->check(k); }

 private:
  std::shared_ptr<Store> base_;
  std::string gated_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

host::SocketTransportOptions meshOptions(const std::string& secret) {
  host::SocketTransportOptions o;
  o.connectTimeout = 30000ms;
  o.sharedMemory = false;  // the TCP path, which strangers can reach
  o.key = keyOf(secret);
  o.helloTimeout = 1000ms;
  return o;
}

// Moves 1 MiB each way between the two ranks and checks every byte.
std::string exchangeCheck(host::Transport& t) {
  const int me = t.rank();
  const int peer = 1 - me;
  std::vector<uint32_t> out(1 << 18);
  std::vector<uint32_t> in(out.size(), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint32_t>(i * 7 + me);
  }
  host::SendOp s{peer, out.data(), out.size() * 4, nullptr};
  host::RecvOp r;
  r.peer = peer;
  r.data = in.data();
  r.len = in.size() * 4;
  Status st = t.exchange({&s, 1}, {&r, 1}, Clock::now() + 30s);
  if (!st.isOk()) {
    return st.toString();
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != static_cast<uint32_t>(i * 7 + peer)) {
      return strPrintf("rank %d: element %zu is %u", me, i, in[i]);
    }
  }
  return "";
}

TEST(SocketMesh, BadIdleAndReplayedHellosNeitherJoinNorFailTheSetUp) {
  LogCapture logs;
  auto base = std::make_shared<InMemoryStore>();
  auto gated = std::make_shared<GatedStore>(base, "addr/0");
  std::unique_ptr<host::Transport> t0;
  std::unique_ptr<host::Transport> t1;
  std::string err0;
  std::string err1;
  std::thread rank0([&] {
    auto t = host::connectSocketTransport(*base, 0, 2, meshOptions(kSecret));
    t.isOk() ? (void)(t0 = std::move(*t)) : (void)(err0 = t.status().toString());
  });
  std::thread rank1([&] {
    auto t = host::connectSocketTransport(*gated, 1, 2, meshOptions(kSecret));
    t.isOk() ? (void)(t1 = std::move(*t)) : (void)(err1 = t.status().toString());
  });
  auto where = base->get("addr/0", 20000ms);
  ASSERT_TRUE(where.isOk()) << where.status().toString();
  std::string hostPort;
  host::wire::Nonce nonce{};
  ASSERT_TRUE(host::wire::parseListener(toString(*where), &hostPort, &nonce)) << toString(*where);
  const int port = portOf(hostPort);

  std::vector<int> attacks;
  auto attack = [&](const void* bytes, size_t len) {
    int fd = connectTo(port);
    ASSERT_GE(fd, 0);
    if (len > 0) {
      sendBytes(fd, bytes, len);
    }
    attacks.push_back(fd);
  };
  {  // Claims rank 1 with a made-up proof.
    host::wire::Hello h{};
    HmacSha256 wrong(std::string_view("not the job's key at all, not at all"));
    h = host::wire::encodeHello(wrong, nonce, 1, 0);
    attack(h.data(), h.size());
  }
  {  // A hello with the job key but for another listener (recorded at another set-up).
    const Digest mk = keyOf(kSecret).derive("mesh");
    HmacSha256 k(mk.data(), mk.size());
    host::wire::Nonce elsewhere = nonce;
    elsewhere[0] ^= 1;
    host::wire::Hello h = host::wire::encodeHello(k, elsewhere, 1, 0);
    attack(h.data(), h.size());
  }
  {  // Claims a rank this communicator does not have; the old 8-byte hello; garbage.
    const Digest mk = keyOf(kSecret).derive("mesh");
    HmacSha256 k(mk.data(), mk.size());
    host::wire::Hello h = host::wire::encodeHello(k, nonce, 7, 0);
    attack(h.data(), h.size());
    const uint32_t old[2] = {0xBA6A0C0Du, 1};
    attack(old, sizeof(old));
    std::vector<uint8_t> junk(host::wire::kHelloBytes, 0xee);
    attack(junk.data(), junk.size());
  }
  for (int i = 0; i < 6; ++i) {
    attack(nullptr, 0);  // idle
  }
  // Long enough for the silent ones to time out while rank 0 still waits for rank 1.
  std::this_thread::sleep_for(1500ms);
  gated->open();
  rank0.join();
  rank1.join();
  ASSERT_TRUE(err0.empty()) << err0;
  ASSERT_TRUE(err1.empty()) << err1;
  std::string e0;
  std::string e1;
  std::thread x0([&] { e0 = exchangeCheck(*t0); });
  std::thread x1([&] { e1 = exchangeCheck(*t1); });
  x0.join();
  x1.join();
  EXPECT_EQ(e0, "");
  EXPECT_EQ(e1, "");
  for (int fd : attacks) {
    size_t got = 0;
    EXPECT_TRUE(closedWithin(fd, 10s, &got));
    EXPECT_EQ(got, 0u);  // not one byte of the job's data
    ::close(fd);
  }
  const std::string text = logs.text();
  EXPECT_NE(text.find("without the job key's proof"), std::string::npos) << text;
  EXPECT_NE(text.find("claiming rank 7"), std::string::npos) << text;
  EXPECT_NE(text.find("no complete hello within"), std::string::npos) << text;
}

TEST(SocketMesh, ARankWithAnotherKeyIsNotLetIn) {
  LogCapture logs;
  InMemoryStore store;
  std::string err0;
  std::unique_ptr<host::Transport> t1;
  auto o0 = meshOptions(kSecret);
  o0.connectTimeout = 3000ms;
  std::thread rank0([&] {
    auto t = host::connectSocketTransport(store, 0, 2, o0);
    err0 = t.isOk() ? "" : t.status().message();
  });
  auto o1 = meshOptions(kOtherSecret);
  o1.connectTimeout = 3000ms;
  auto t = host::connectSocketTransport(store, 1, 2, o1);  // sends its hello and goes on
  rank0.join();
  EXPECT_NE(err0.find("ranks [1] never connected"), std::string::npos) << err0;
  EXPECT_NE(logs.text().find("claiming rank 1 without the job key's proof"), std::string::npos)
      << logs.text();
}

// ---- the engine's connection proof -----------------------------------------------------------

TEST(EngineAuth, ConnectionsProveTheKeyBeforeDataMoves) {
  {
    InMemoryStore store;
    std::unique_ptr<host::Transport> t[2];
    std::string err[2];
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        host::EngineTransportOptions o;
        o.connectTimeout = 30000ms;
        o.key = keyOf(kSecret);
        auto x = host::connectEngineTransport(store, r, 2, o);
        x.isOk() ? (void)(t[r] = std::move(*x)) : (void)(err[r] = x.status().toString());
      });
    }
    for (auto& th : ranks) {
      th.join();
    }
    ASSERT_EQ(err[0], "");
    ASSERT_EQ(err[1], "");
    std::string e[2];
    std::thread a([&] { e[0] = exchangeCheck(*t[0]); });
    std::thread b([&] { e[1] = exchangeCheck(*t[1]); });
    a.join();
    b.join();
    EXPECT_EQ(e[0], "");
    EXPECT_EQ(e[1], "");
  }
  {  // Rank 1 holds another key (it could read the handles, as one that learnt them could).
    InMemoryStore store;
    std::string err[2];
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        host::EngineTransportOptions o;
        o.connectTimeout = 20000ms;
        o.key = keyOf(r == 0 ? kSecret : kOtherSecret);
        auto x = host::connectEngineTransport(store, r, 2, o);
        err[r] = x.isOk() ? "" : x.status().message();
      });
    }
    for (auto& th : ranks) {
      th.join();
    }
    EXPECT_NE(err[0].find("did not prove the job key"), std::string::npos) << err[0];
    EXPECT_NE(err[1].find("did not prove the job key"), std::string::npos) << err[1];
  }
}

// ---- heartbeats ------------------------------------------------------------------------------

// Rank 1 played by the test at the datagram level: its UDP socket, its nonce, its counter.
struct FakePeer {
  int fd = -1;
  int port = 0;
  host::wire::Nonce nonce{};
  std::unique_ptr<HmacSha256> key;
  std::atomic<uint64_t> counter{100};

  FakePeer() {
    fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    EXPECT_TRUE(randomBytes(nonce.data(), nonce.size()).isOk());
    const Digest hk = keyOf(kSecret).derive("heartbeat");
    key = std::make_unique<HmacSha256>(hk.data(), hk.size());
  }
  ~FakePeer() { ::close(fd); }
  std::string published() const {
    const char sep = '\x1f';
    return std::string("127.0.0.1") + sep + std::to_string(port) + sep +
           host::wire::nonceHex(nonce) + sep + "another-host/boot/netns" + sep + "fakehost";
  }
  host::wire::Datagram datagram(uint32_t kind, uint32_t about, uint64_t counterValue) {
    host::wire::Beat b;
    b.kind = kind;
    b.from = 1;
    b.about = about;
    b.counter = counterValue;
    return host::wire::encodeBeat(*key, nonce, b);
  }
};

void sendDatagram(int fd, int port, const void* d, size_t len) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::sendto(fd, d, len, 0, reinterpret_cast<sockaddr*>(&a), sizeof(a));
}

TEST(Heartbeat, ForgedReplayedAndMisaddressedDatagramsChangeNothing) {
  LogCapture logs;
  InMemoryStore store;
  FakePeer fake;
  ASSERT_TRUE(store.set("hb/1", toBytes(fake.published())).isOk());
  std::mutex mu;
  std::vector<std::string> lost;
  host::PeerMonitorOptions mo;
  mo.timeout = 1500ms;
  mo.interval = 100ms;
  mo.setupTimeout = 5000ms;
  mo.bindAddress = "127.0.0.1";
  mo.key = keyOf(kSecret);
  auto monitor = host::PeerMonitor::start(store, 0, 2, mo, [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    lost.push_back(why);
  });
  ASSERT_TRUE(monitor.isOk()) << monitor.status().toString();
  ASSERT_NE(*monitor, nullptr);
  auto hb0 = store.get("hb/0", 1000ms);
  ASSERT_TRUE(hb0.isOk());
  std::string v = toString(*hb0);
  const int port0 = std::atoi(v.substr(v.find('\x1f') + 1).c_str());
  // Rank 0's own datagrams verify under its published nonce (the encoding both ends share).
  host::wire::Nonce nonce0{};
  {
    std::string rest = v.substr(v.find('\x1f') + 1);
    rest = rest.substr(rest.find('\x1f') + 1);
    ASSERT_TRUE(host::wire::parseNonceHex(rest.substr(0, rest.find('\x1f')), &nonce0));
  }

  // The real rank 1 keeps beating.
  std::atomic<bool> beating{true};
  std::thread beats([&] {
    while (beating.load()) {
      auto d = fake.datagram(host::wire::kBeat, 0, ++fake.counter);
      sendDatagram(fake.fd, port0, d.data(), d.size());
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(300ms);

  int outsider = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  {  // The old 24-byte datagram: "rank 1 declares rank 0 lost".
    uint32_t old[6] = {0x42474842, 3, 1, 0, 0, 0};
    sendDatagram(outsider, port0, old, sizeof(old));
  }
  {  // The new format with a made-up tag.
    auto d = fake.datagram(host::wire::kLost, 0, 1u << 30);
    d[30] ^= 1;
    sendDatagram(outsider, port0, d.data(), d.size());
  }
  {  // Correctly tagged (a copy of a real one) but from the outsider's address: lost, and bye.
    auto d = fake.datagram(host::wire::kLost, 0, 1u << 30);
    sendDatagram(outsider, port0, d.data(), d.size());
    auto b = fake.datagram(host::wire::kBye, 0, (1u << 30) + 1);
    sendDatagram(outsider, port0, b.data(), b.size());
  }
  {  // Replays from rank 1's own address: counters already used.
    auto d = fake.datagram(host::wire::kLost, 0, 5);
    sendDatagram(fake.fd, port0, d.data(), d.size());
    auto b = fake.datagram(host::wire::kBye, 0, 6);
    sendDatagram(fake.fd, port0, b.data(), b.size());
  }
  std::this_thread::sleep_for(1000ms);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(lost.empty()) << lost.front();
  }
  // Rank 0 sends verifiable beats to rank 1.
  {
    uint8_t d[128];
    ssize_t n = ::recv(fake.fd, d, sizeof(d), MSG_DONTWAIT);
    ASSERT_EQ(n, static_cast<ssize_t>(host::wire::kDatagramBytes));
    auto beat = host::wire::parseBeat(d, static_cast<size_t>(n));
    ASSERT_TRUE(beat.isOk());
    EXPECT_EQ(beat->from, 0u);
    const Digest hk = keyOf(kSecret).derive("heartbeat");
    HmacSha256 k(hk.data(), hk.size());
    EXPECT_TRUE(host::wire::verifyBeat(d, k, nonce0));
  }
  // Rank 1 falls silent: the forged bye did not stop rank 0 from watching it.
  beating = false;
  beats.join();
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < 15s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!lost.empty()) {
        break;
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_NE(lost[0].find("rank 1 at 127.0.0.1:" + std::to_string(fake.port)), std::string::npos)
        << lost[0];
  }
  ::close(outsider);
  const std::string text = logs.text();
  EXPECT_NE(text.find("not a bagua heartbeat"), std::string::npos) << text;
  EXPECT_NE(text.find("without the job key's proof"), std::string::npos) << text;
  EXPECT_NE(text.find("which sends from 127.0.0.1:" + std::to_string(fake.port)), std::string::npos)
      << text;
  EXPECT_NE(text.find("(a replay)"), std::string::npos) << text;
}

}  // namespace
}  // namespace bagua::core
