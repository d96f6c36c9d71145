// The control plane against a stranger who can reach its ports but has no job key (core/README.md,
// "Security"): the TCP store, the socket mesh's hello, the engine's connection proof and the
// heartbeat datagrams, over real sockets, with the store's server in a process of its own where
// its memory and descriptor limit are measured. Each case is one of the attacks the control plane
// used to fall to: reading or writing the store, claiming a rank, a heartbeat that changes what a
// rank believes, frame lengths that reserved memory, an accept error that stopped the acceptor,
// a bad or idle hello that failed the set-up.
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

#include "backend/host/control_wire.h"
#include "backend/host/peer_monitor.h"
#include "backend/host/transport.h"
#include "bagua/base/crypto.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/core/job_key.h"
#include "bagua/core/params.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "multi_rank.h"
#include "store_wire.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "control-plane-test-key-0123456789abcdef";
const std::string kOtherSecret = "another-job-entirely-0123456789abcdef";

JobKey keyOf(const std::string& secret) {
  return *JobKey::fromSecret(secret);
}

// ---- sockets and processes -------------------------------------------------------------------

int connectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (fd >= 0) {
      ::close(fd);
    }
    return -1;
  }
  return fd;
}

int portOf(const std::string& hostPort) {
  return std::atoi(hostPort.substr(hostPort.rfind(':') + 1).c_str());
}

void sendBytes(int fd, const void* data, size_t len) {
  (void)::send(fd, data, len, MSG_NOSIGNAL);
}

// Waits (bounded) until the peer closes `fd`; adds what arrived before to *received.
bool closedWithin(int fd, std::chrono::milliseconds bound, size_t* received = nullptr) {
  const auto until = Clock::now() + bound;
  char buf[4096];
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) {
      continue;
    }
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      return true;
    }
    if (n > 0 && received != nullptr) {
      *received += static_cast<size_t>(n);
    }
  }
  return false;
}

// Reads the store's challenge frame (4-byte length + body) off a fresh connection.
bool readChallenge(int fd) {
  uint8_t buf[4 + storewire::kChallengeBytes];
  size_t got = 0;
  const auto until = Clock::now() + 10s;
  while (got < sizeof(buf) && Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) {
      continue;
    }
    ssize_t n = ::recv(fd, buf + got, sizeof(buf) - got, 0);
    if (n <= 0) {
      return false;
    }
    got += static_cast<size_t>(n);
  }
  return got == sizeof(buf) && buf[0] == storewire::kChallengeBytes;
}

// control_worker serve-store in a child process; its stderr collected by a thread.
class StoreProcess {
 public:
  StoreProcess(const std::string& secret, long nofile = 0) {
    const std::string bin = processEnv("CONTROL_WORKER_BIN").value_or("");
    int in[2];
    int out[2];
    int err[2];
    EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      std::string n = std::to_string(nofile);
      ::execl(bin.c_str(), bin.c_str(), "serve-store", secret.c_str(), n.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    stdin_ = in[1];
    errReader_ = std::thread([this, fd = err[0]] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        err_.append(buf, static_cast<size_t>(n));
      }
      ::close(fd);
    });
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') {
      line += c;
    }
    ::close(out[0]);
    if (line.rfind("port ", 0) == 0) {
      port_ = std::atoi(line.c_str() + 5);
    }
  }
  ~StoreProcess() {
    ::close(stdin_);
    int st = 0;
    const auto until = Clock::now() + 10s;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (Clock::now() > until) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    errReader_.join();
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string err() {
    std::lock_guard<std::mutex> lock(mu_);
    return err_;
  }
  // Resident memory in KiB (VmRSS).
  long rssKib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) {
        return std::atol(line.c_str() + 6);
      }
    }
    return -1;
  }
  bool waitForErr(const std::string& text, std::chrono::milliseconds bound) {
    const auto until = Clock::now() + bound;
    while (Clock::now() < until) {
      if (err().find(text) != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int stdin_ = -1;
  std::thread errReader_;
  std::mutex mu_;
  std::string err_;
};

size_t countOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) {
    ++n;
  }
  return n;
}

Result<std::unique_ptr<TcpStore>> client(int port, std::optional<JobKey> key,
                                         Millis timeout = 10000ms) {
  TcpStoreOptions o;
  o.port = port;
  o.connectTimeout = timeout;
  o.key = std::move(key);
  return TcpStore::connect(o);
}

// Collects the log lines of one test.
class LogCapture {
 public:
  LogCapture() {
    setLogSink([this](LogLevel, const LogCategory&, const char*, int, const std::string& m) {
      std::lock_guard<std::mutex> lock(mu_);
      text_ += m + "\n";
    });
  }
  ~LogCapture() { setLogSink(nullptr); }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

// ---- the store's wire, without sockets -------------------------------------------------------

storewire::Nonce nonceOf(uint8_t fill) {
  storewire::Nonce n;
  n.fill(fill);
  return n;
}

Bytes bodyOf(const Bytes& frame) {
  return Bytes(frame.begin() + 4, frame.end());
}

TEST(StoreWire, HandshakeThenRequestsUnderTheSessionKey) {
  const Digest k = keyOf(kSecret).derive("store");
  storewire::ServerSession server(k, nonceOf(1));
  storewire::ClientSession clientSide(k, nonceOf(2));
  storewire::Data data;
  bool changed = false;
  auto hello = clientSide.answer(bodyOf(server.challengeFrame()));
  ASSERT_TRUE(hello.isOk()) << hello.status().toString();
  EXPECT_FALSE(server.authenticated());
  EXPECT_EQ(server.maxFrame(), storewire::kMaxUnauthenticatedFrame);
  auto a = server.onFrame(bodyOf(*hello), data, &changed);
  ASSERT_EQ(a.kind, storewire::ServerSession::Action::kSend) << a.reason;
  ASSERT_TRUE(clientSide.welcome(bodyOf(a.frame)).isOk());
  EXPECT_TRUE(server.authenticated());
  EXPECT_EQ(server.maxFrame(), storewire::kMaxFrame);

  a = server.onFrame(bodyOf(clientSide.request(storewire::kSet, {toBytes("k"), toBytes("v")})),
                     data, &changed);
  ASSERT_EQ(a.kind, storewire::ServerSession::Action::kSend) << a.reason;
  EXPECT_TRUE(changed);
  auto r = clientSide.response(bodyOf(a.frame));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->code, storewire::kOk);
  a = server.onFrame(bodyOf(clientSide.request(storewire::kCheck, {toBytes("k")})), data, &changed);
  r = clientSide.response(bodyOf(a.frame));
  ASSERT_TRUE(r.isOk());
  ASSERT_EQ(r->args.size(), 1u);
  EXPECT_EQ(r->args[0], Bytes{1});
}

TEST(StoreWire, WrongKeyReplayAndAlterationCloseTheConnection) {
  const Digest k = keyOf(kSecret).derive("store");
  const Digest other = keyOf(kOtherSecret).derive("store");
  storewire::Data data;
  bool changed = false;
  {  // A client under another key: closed at its hello; its own check of us fails too.
    storewire::ServerSession server(k, nonceOf(3));
    storewire::ClientSession stranger(other, nonceOf(4));
    auto a =
        server.onFrame(bodyOf(*stranger.answer(bodyOf(server.challengeFrame()))), data, &changed);
    EXPECT_EQ(a.kind, storewire::ServerSession::Action::kClose);
    EXPECT_NE(a.reason.find("proof"), std::string::npos) << a.reason;
    EXPECT_FALSE(server.authenticated());
  }
  {  // The old protocol's bare request as a first frame: closed.
    storewire::ServerSession server(k, nonceOf(5));
    auto a = server.onFrame(
        storewire::encodePayload(storewire::kSet, {toBytes("rdzv/rank/1"), toBytes("me")}), data,
        &changed);
    EXPECT_EQ(a.kind, storewire::ServerSession::Action::kClose);
    EXPECT_EQ(data.size(), 0u);
  }
  // A good session, its frames replayed, reordered, altered and moved to another connection.
  storewire::ServerSession server(k, nonceOf(6));
  storewire::ClientSession c(k, nonceOf(7));
  auto welcome = server.onFrame(bodyOf(*c.answer(bodyOf(server.challengeFrame()))), data, &changed);
  ASSERT_TRUE(c.welcome(bodyOf(welcome.frame)).isOk());
  const Bytes first = bodyOf(c.request(storewire::kSet, {toBytes("a"), toBytes("1")}));
  const Bytes second = bodyOf(c.request(storewire::kSet, {toBytes("b"), toBytes("2")}));
  {
    storewire::ServerSession copy = server;
    EXPECT_EQ(copy.onFrame(second, data, &changed).kind,
              storewire::ServerSession::Action::kClose);  // out of order
  }
  {
    storewire::ServerSession copy = server;
    Bytes altered = first;
    altered[7] ^= 1;
    EXPECT_EQ(copy.onFrame(altered, data, &changed).kind, storewire::ServerSession::Action::kClose);
  }
  {
    storewire::ServerSession elsewhere(k, nonceOf(8));
    storewire::ClientSession c2(k, nonceOf(9));
    auto w =
        elsewhere.onFrame(bodyOf(*c2.answer(bodyOf(elsewhere.challengeFrame()))), data, &changed);
    ASSERT_TRUE(c2.welcome(bodyOf(w.frame)).isOk());
    EXPECT_EQ(elsewhere.onFrame(first, data, &changed).kind,
              storewire::ServerSession::Action::kClose);  // another connection's frame
  }
  EXPECT_EQ(server.onFrame(first, data, &changed).kind, storewire::ServerSession::Action::kSend);
  EXPECT_EQ(server.onFrame(first, data, &changed).kind,
            storewire::ServerSession::Action::kClose);  // replayed
}

TEST(StoreWire, FrameReaderHoldsOnlyWhatArrived) {
  storewire::FrameReader r(storewire::kMaxFrame);
  const uint8_t header[4] = {0xff, 0xff, 0xff, 0x0f};  // 256 MiB - 1
  ASSERT_EQ(*r.feed(header, 4), 4u);
  EXPECT_EQ(r.buffered(), 4u);
  const uint8_t some[10] = {};
  ASSERT_EQ(*r.feed(some, 10), 10u);
  EXPECT_EQ(r.buffered(), 14u);
  EXPECT_FALSE(r.hasFrame());

  storewire::FrameReader small(storewire::kMaxUnauthenticatedFrame);
  EXPECT_FALSE(small.feed(header, 4).isOk());
  storewire::FrameReader zero(64);
  const uint8_t none[4] = {0, 0, 0, 0};
  EXPECT_FALSE(zero.feed(none, 4).isOk());
  // Two frames in one read: the reader stops at the end of the first.
  storewire::FrameReader two(64);
  const uint8_t bytes[] = {2, 0, 0, 0, 'a', 'b', 1, 0, 0, 0, 'c'};
  ASSERT_EQ(*two.feed(bytes, sizeof(bytes)), 6u);
  ASSERT_TRUE(two.hasFrame());
  EXPECT_EQ(two.take(), (Bytes{'a', 'b'}));
  ASSERT_EQ(*two.feed(bytes + 6, sizeof(bytes) - 6), 5u);
  EXPECT_EQ(two.take(), Bytes{'c'});
}

// ---- the TCP store against outsiders --------------------------------------------------------

TEST(TcpStoreAuth, AnOutsiderCannotReadWriteOrClaimARank) {
  LogCapture logs;
  TcpStoreServerOptions so;
  so.key = keyOf(kSecret);
  auto server = TcpStoreServer::start("127.0.0.1", 0, so);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const int port = (*server)->port();
  auto rank0 = client(port, keyOf(kSecret));
  ASSERT_TRUE(rank0.isOk()) << rank0.status().toString();
  ASSERT_TRUE((*rank0)->set("pg/default/nccl/id", toBytes("secret-id")).isOk());

  // Another job's key, and no key: refused with an error that names the variable.
  for (const std::optional<JobKey>& k :
       {std::optional<JobKey>(keyOf(kOtherSecret)), std::optional<JobKey>(JobKey())}) {
    const auto t0 = Clock::now();
    auto outsider = client(port, k, 20000ms);
    ASSERT_FALSE(outsider.isOk());
    EXPECT_NE(outsider.status().message().find("BAGUA_JOB_KEY"), std::string::npos)
        << outsider.status().toString();
    EXPECT_LT(Clock::now() - t0, 15s);  // refused, not timed out
  }
  // By hand: the old protocol's rank claim, and a hello with a made-up proof.
  int raw = connectTo(port);
  ASSERT_GE(raw, 0);
  ASSERT_TRUE(readChallenge(raw));
  const Bytes claim = storewire::frame(storewire::encodePayload(
      storewire::kCas, {toBytes("pg/default/rdzv/rank/1"), {}, toBytes("outsider")}));
  sendBytes(raw, claim.data(), claim.size());
  size_t got = 0;
  EXPECT_TRUE(closedWithin(raw, 10s, &got));
  EXPECT_EQ(got, 0u);
  ::close(raw);
  raw = connectTo(port);
  ASSERT_TRUE(readChallenge(raw));
  Bytes hello(storewire::kHelloBytes, 0x5a);
  hello[0] = storewire::kHello;
  const Bytes framed = storewire::frame(hello);
  sendBytes(raw, framed.data(), framed.size());
  got = 0;
  EXPECT_TRUE(closedWithin(raw, 10s, &got));
  EXPECT_EQ(got, 0u);
  ::close(raw);

  // Nothing changed, the job's own client still works, and the refusals were logged with the
  // outsiders' addresses.
  auto claimed = (*rank0)->check("pg/default/rdzv/rank/1");
  ASSERT_TRUE(claimed.isOk());
  EXPECT_FALSE(*claimed);
  auto id = (*rank0)->get("pg/default/nccl/id", 1000ms);
  ASSERT_TRUE(id.isOk());
  EXPECT_EQ(toString(*id), "secret-id");
  auto rank1 = client(port, keyOf(kSecret));
  ASSERT_TRUE(rank1.isOk());
  auto won = (*rank1)->compareSet("pg/default/rdzv/rank/1", {}, toBytes("rank1"));
  ASSERT_TRUE(won.isOk());
  EXPECT_EQ(toString(*won), "rank1");
  EXPECT_GE(countOf(logs.text(), "dropped the connection from 127.0.0.1:"), 4u) << logs.text();
}

TEST(TcpStoreAuth, WithoutAKeyEverythingStillWorks) {
  TcpStoreServerOptions so;
  so.key = JobKey();
  auto server = TcpStoreServer::start("127.0.0.1", 0, so);
  ASSERT_TRUE(server.isOk());
  auto c = client((*server)->port(), JobKey());
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  ASSERT_TRUE((*c)->set("a", toBytes("1")).isOk());
  auto v = (*c)->add("n", 5);
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(*v, 5);
  // A keyed client does not talk to an unkeyed store either: both ends prove the same key.
  EXPECT_FALSE(client((*server)->port(), keyOf(kSecret)).isOk());
}

// ---- the store's resources -------------------------------------------------------------------

TEST(StoreLimits, ConnectionsSendingOnlyFrameLengthsLeaveMemoryFlat) {
  StoreProcess store(kSecret);
  ASSERT_GT(store.port(), 0) << store.err();
  auto job = client(store.port(), keyOf(kSecret));
  ASSERT_TRUE(job.isOk()) << job.status().toString();
  ASSERT_TRUE((*job)->set("k", toBytes("v")).isOk());
  std::this_thread::sleep_for(200ms);
  const long before = store.rssKib();
  ASSERT_GT(before, 0);
  std::vector<int> fds;
  for (int i = 0; i < 64; ++i) {
    int fd = connectTo(store.port());
    ASSERT_GE(fd, 0);
    const uint8_t len[4] = {0xf0, 0xff, 0xff, 0x0f};  // "256 MiB follow"
    sendBytes(fd, len, sizeof(len));
    const uint8_t some[64] = {};
    sendBytes(fd, some, sizeof(some));
    fds.push_back(fd);
  }
  for (int fd : fds) {
    EXPECT_TRUE(closedWithin(fd, 10s));  // dropped at its first frame
    ::close(fd);
  }
  const long after = store.rssKib();
  EXPECT_LT(after - before, 16 * 1024) << "RSS " << before << " KiB -> " << after << " KiB";
  auto v = (*job)->get("k", 1000ms);
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(toString(*v), "v");
  EXPECT_NE(store.err().find("dropped the connection from 127.0.0.1:"), std::string::npos)
      << store.err();
}

TEST(StoreLimits, SilentConnectionsTimeOutAndTheOldestPendingGo) {
  TcpStoreServerOptions so;
  so.key = keyOf(kSecret);
  so.authTimeout = 500ms;
  so.maxPending = 4;
  auto server = TcpStoreServer::start("127.0.0.1", 0, so);
  ASSERT_TRUE(server.isOk());
  const int port = (*server)->port();
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    fds.push_back(connectTo(port));
    ASSERT_GE(fds.back(), 0);
    std::this_thread::sleep_for(5ms);  // accepted in this order
  }
  // The six oldest were pushed out by newer ones; the four newest time out.
  for (int fd : fds) {
    EXPECT_TRUE(closedWithin(fd, 10s));
    ::close(fd);
  }
  // Four silent ones again, then the job's client: it gets in (the oldest silent one goes).
  fds.clear();
  for (int i = 0; i < 4; ++i) {
    fds.push_back(connectTo(port));
  }
  auto job = client(port, keyOf(kSecret));
  ASSERT_TRUE(job.isOk()) << job.status().toString();
  EXPECT_TRUE((*job)->set("x", toBytes("y")).isOk());
  for (int fd : fds) {
    ::close(fd);
  }
}

TEST(StoreLimits, TheAcceptorSurvivesDescriptorExhaustion) {
  StoreProcess store(kSecret, 24);
  ASSERT_GT(store.port(), 0) << store.err();
  std::vector<int> fds;
  for (int i = 0; i < 60; ++i) {
    int fd = connectTo(store.port());
    if (fd >= 0) {
      fds.push_back(fd);
    }
  }
  EXPECT_TRUE(store.waitForErr("cannot accept connections", 20s)) << store.err();
  std::this_thread::sleep_for(1000ms);  // a storm: several retries, each freeing one descriptor
  for (int fd : fds) {
    ::close(fd);
  }
  // Accepting again: the job's client gets in and is served.
  auto job = client(store.port(), keyOf(kSecret), 30000ms);
  ASSERT_TRUE(job.isOk()) << job.status().toString() << "\n" << store.err();
  ASSERT_TRUE((*job)->set("after", toBytes("storm")).isOk());
  auto v = (*job)->get("after", 1000ms);
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(toString(*v), "storm");
  EXPECT_EQ(countOf(store.err(), "cannot accept connections"), 1u) << store.err();
}

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

// ---- the whole job: rendezvous, mesh and collectives over an authenticated store -------------

TEST(JobAuth, AnOutsiderCannotClaimARankOfARunningRendezvous) {
  TcpStoreServerOptions so;
  so.key = keyOf(kSecret);
  auto server = TcpStoreServer::start("127.0.0.1", 0, so);
  ASSERT_TRUE(server.isOk());
  const int port = (*server)->port();
  // The outsider tries first, while rank 1 has not started.
  auto outsider = client(port, keyOf(kOtherSecret));
  EXPECT_FALSE(outsider.isOk());
  auto failures = testing::runRanks(
      2,
      [&](int rank) -> std::string {
        auto c = client(port, keyOf(kSecret));
        if (!c.isOk()) {
          return c.status().toString();
        }
        ProcessGroupOptions o;
        o.rank = rank;
        o.worldSize = 2;
        o.hierarchical = false;
        o.hostTransport = HostTransport::kSocket;
        o.hostSharedMemory = false;
        std::shared_ptr<Store> store(std::move(*c));
        auto pg = ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        std::vector<float> x(1024, static_cast<float>(rank + 1));
        Status s = (*pg)
                       ->global()
                       .allReduce(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum)
                       ->wait(30s);
        if (!s.isOk()) {
          return s.toString();
        }
        return x[17] == 3.0f ? "" : strPrintf("sum %g", x[17]);
      },
      120s);
  EXPECT_EQ(testing::joinFailures(failures), "");
}

// ---- where the store listens, and where the key comes from ----------------------------------

TEST(StoreListenAddress, FollowsMasterAddrNeverEveryInterfaceUnlessAsked) {
  {
    ScopedEnvForTesting env(coreParams(), {});
    EXPECT_EQ(*storeListenAddress("127.0.0.1"), "127.0.0.1");
    EXPECT_EQ(*storeListenAddress("localhost"), "127.0.0.1");
    auto bad = storeListenAddress("no-such-host.invalid");
    ASSERT_FALSE(bad.isOk());
    EXPECT_NE(bad.status().message().find("MASTER_ADDR=no-such-host.invalid"), std::string::npos);
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    auto mine = storeListenAddress(name);
    if (mine.isOk()) {
      EXPECT_NE(*mine, "0.0.0.0");
      EXPECT_NE(*mine, "::");
      auto s = TcpStoreServer::start(*mine, 0);  // an address of this host: bindable
      EXPECT_TRUE(s.isOk()) << s.status().toString();
    }
  }
  {
    ScopedEnvForTesting env(coreParams(), {{"BAGUA_STORE_LISTEN_ADDR", "0.0.0.0"}});
    EXPECT_EQ(*storeListenAddress("no-such-host.invalid"), "0.0.0.0");
  }
  {
    ScopedEnvForTesting env(coreParams(), {{"BAGUA_STORE_LISTEN_ADDR", "eth0"}});
    auto bad = storeListenAddress("127.0.0.1");
    ASSERT_FALSE(bad.isOk());
    EXPECT_NE(bad.status().message().find("BAGUA_STORE_LISTEN_ADDR"), std::string::npos);
  }
}

TEST(JobKeyParams, VariableOrFileNeverBothNeverShown) {
  {
    ScopedEnvForTesting env(coreParams(), {});
    auto k = readJobKeyFromParams();
    ASSERT_TRUE(k.isOk());
    EXPECT_FALSE(k->present());
  }
  {
    ScopedEnvForTesting env(coreParams(), {{"BAGUA_JOB_KEY", "short-secret"}});
    auto k = readJobKeyFromParams();
    ASSERT_FALSE(k.isOk());
    EXPECT_NE(k.status().message().find("BAGUA_JOB_KEY"), std::string::npos);
    EXPECT_EQ(k.status().message().find("short-secret"), std::string::npos);  // never shown
    auto shown = coreParams().jobKey.valueString();
    ASSERT_TRUE(shown.isOk());
    EXPECT_EQ(*shown, "(set, 12 characters)");
  }
  {
    ScopedEnvForTesting env(coreParams(), {{"BAGUA_JOB_KEY", kSecret}});
    auto k = readJobKeyFromParams();
    ASSERT_TRUE(k.isOk());
    EXPECT_TRUE(*k == keyOf(kSecret));
    auto shown = coreParams().jobKey.valueString();
    ASSERT_TRUE(shown.isOk());
    EXPECT_EQ(shown->find(kSecret), std::string::npos) << *shown;
  }
  const std::string file =
      (std::filesystem::temp_directory_path() / ("bagua-key-" + std::to_string(::getpid())))
          .string();
  {
    std::ofstream(file) << "  " << kSecret << "\n";
    ::chmod(file.c_str(), 0600);
    ScopedEnvForTesting env(coreParams(), {{"BAGUA_JOB_KEY_FILE", file}});
    auto k = readJobKeyFromParams();
    ASSERT_TRUE(k.isOk()) << k.status().toString();
    EXPECT_TRUE(*k == keyOf(kSecret));
  }
  {
    ::chmod(file.c_str(), 0644);
    ScopedEnvForTesting env(coreParams(), {{"BAGUA_JOB_KEY_FILE", file}});
    auto k = readJobKeyFromParams();
    ASSERT_FALSE(k.isOk());
    EXPECT_NE(k.status().message().find("chmod 600"), std::string::npos) << k.status().toString();
  }
  {
    ::chmod(file.c_str(), 0600);
    ScopedEnvForTesting env(coreParams(),
                            {{"BAGUA_JOB_KEY_FILE", file}, {"BAGUA_JOB_KEY", kOtherSecret}});
    auto k = readJobKeyFromParams();
    ASSERT_FALSE(k.isOk());
    EXPECT_NE(k.status().message().find("set one of them"), std::string::npos);
  }
  std::filesystem::remove(file);
  const JobKey a = keyOf(kSecret);
  EXPECT_NE(a.derive("store"), a.derive("mesh"));
  EXPECT_NE(a.derive("store"), keyOf(kOtherSecret).derive("store"));
  EXPECT_EQ(JobKey().derive("store"), JobKey().derive("store"));
}

// The process's own key (the transports of ProcessGroup::create read it): the job's.
class ProcessKey : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_TRUE(coreParams().jobKey.setOverride(kSecret).isOk());
    auto k = jobKeyFromParams();
    ASSERT_TRUE(k.isOk() && k->present());
  }
};
const auto* const kProcessKey = ::testing::AddGlobalTestEnvironment(new ProcessKey);

}  // namespace
}  // namespace bagua::core
