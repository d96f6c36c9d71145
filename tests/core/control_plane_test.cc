// The control plane against a stranger who can reach its ports but has no job key (core/README.md,
// "Security"), the store's half (the transports': control_plane_transport_test.cc): the TCP
// store's wire and server, a running rendezvous, where the store listens and where the key comes
// from, over real sockets, with the store's server in a process of its own where
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

#include "control_plane_support.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using namespace cptest;

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
