// Loopback tests of the Bagua-Net engine (no NCCL): real transfers between threads over
// 127.0.0.1 / ::1, the stream schedules, the rate cap, wake-ups, large and inline messages, and
// the failures (truncation, a peer gone, strangers and garbage, nothing to connect to).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"
#include "bagua/net/engine.h"
#include "engine_pair.h"
#include "net_test_util.h"
#include "wire.h"

namespace bagua::net {
namespace {

using namespace testing;  // engine_pair.h, net_test_util.h: bagua::net::testing

// ---- loopback transfers ------------------------------------------------------------------------

class Transfer : public ::testing::TestWithParam<int> {};

TEST_P(Transfer, SizesAroundInlineAndChunkBoundaries) {
  EngineOptions o = testOptions(GetParam());
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  EXPECT_EQ(p.send->nStreams(), GetParam());
  EXPECT_EQ(p.recv->nStreams(), GetParam());
  std::vector<size_t> sizes = {0,     1,    255,     256,           257,     4095,
                               4096,  4097, 65535,   65536,         65537,   (64 << 10) * 3 + 1,
                               12345, 0,    1 << 20, (1 << 20) + 7, 3 << 20, 1};
  transfer(p, sizes, 8, /*recvSlack=*/16);
}

TEST_P(Transfer, ThirtyTwoOutstandingRequests) {
  Pair p = connectPair(testOptions(GetParam()));
  ASSERT_TRUE(p.send && p.recv);
  std::vector<size_t> sizes;
  for (int i = 0; i < 200; ++i) {
    sizes.push_back(static_cast<size_t>((i * 7919) % 200000));
  }
  transfer(p, sizes, kMinRequestsInFlight);
}

INSTANTIATE_TEST_SUITE_P(Streams, Transfer, ::testing::Values(1, 2, 8));

TEST(Engine, RoundRobinScheduleDeliversEveryByte) {
  for (int n : {1, 3, 8}) {
    EngineOptions o = testOptions(n);
    o.schedule = Schedule::kRoundRobin;
    Pair p = connectPair(o);
    ASSERT_TRUE(p.send && p.recv);
    transfer(p, {0, 1, 300, 5000, 4096 * 3 + 1, 1 << 20, 17, (2 << 20) + 9, 0}, 4);
  }
}

// One slow flow among fast ones (stream 0 paced by the kernel to 2 MiB/s): the dynamic schedule
// routes chunks around it, the equal split (NCCL Socket's and the old Bagua-Net's rule) has to
// wait for it. Asserted on how the bytes were spread, never on time: the equal split gives every
// stream the same share exactly, the dynamic schedule leaves the slow stream less than its share.
// The pace is far below what the other streams carry even on a 2-core VM at load average 20, so
// the fast streams claim the chunks the slow one cannot take. (How much time this saves is a
// benchmark's question: bagua-net-bench --slow-stream.)
TEST(Engine, DynamicScheduleRoutesAroundASlowStream) {
  constexpr size_t kMessage = 2 << 20;
  constexpr size_t kMessages = 8;
  std::vector<size_t> sizes(kMessages, kMessage);
  auto run = [&](Schedule schedule) {
    EngineOptions o = testOptions(4);
    o.maxChunkBytes = 256 << 10;
    o.socketBufferBytes = 128 << 10;  // back-pressure from the slow stream comes early
    o.slowStreamBytesPerSec = 2 << 20;
    o.schedule = schedule;
    Pair p = connectPair(o);
    EXPECT_TRUE(p.send && p.recv);
    if (!p.send || !p.recv) {
      return std::vector<uint64_t>{};
    }
    transfer(p, sizes, 4);
    return p.send->bytesPerStream();
  };
  std::vector<uint64_t> dyn = run(Schedule::kDynamic);
  std::vector<uint64_t> rr = run(Schedule::kRoundRobin);
  ASSERT_EQ(dyn.size(), 4u);
  ASSERT_EQ(rr.size(), 4u);
  uint64_t total = kMessage * kMessages;
  EXPECT_EQ(dyn[0] + dyn[1] + dyn[2] + dyn[3], total);
  for (uint64_t b : rr) {
    EXPECT_EQ(b, total / 4) << "the equal split gives every stream the same share";
  }
  EXPECT_LT(dyn[0], total / 5) << "dynamic scheduling should give the slow stream less than its "
                               << "equal share; it sent " << dyn[0] << " of " << total << " bytes";
}

// BAGUA_NET_SEND_RATE_MBPS (link emulation for bench/ddp): two connections of one process,
// sending at once, share one pacing clock, so 4 MiB in total at 64 Mbit/s take >= 0.52 s however
// the bytes are spread over comms and streams; inline messages count too. Every byte arrives.
TEST(Engine, SendRateCapIsOneClockPerProcess) {
  EngineOptions o = testOptions(4);
  o.sendRateMbps = 64;
  Pair a = connectPair(o);
  Pair b = connectPair(o);
  ASSERT_TRUE(a.send && a.recv && b.send && b.recv);
  std::vector<size_t> sizes(8, 256 << 10);
  sizes.push_back(100);  // inline (o.inlineBytes is 256)
  auto t0 = std::chrono::steady_clock::now();
  std::thread other([&] { transfer(b, sizes, 4); });
  transfer(a, sizes, 4);
  other.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double bytes = 2.0 * (8 * (256 << 10) + 100);
  const double floor = bytes * 8 / 64e6;
  EXPECT_GE(seconds, 0.95 * floor) << "the cap let " << bytes << " bytes through in " << seconds
                                   << " s (64 Mbit/s needs " << floor << " s)";
  EXPECT_LT(seconds, 10 * floor) << "paced far below the cap";  // a bound against a hang only
}

// isend wakes only as many parked streams as a message has chunks. A lost wake-up would not lose
// data (parked threads re-check for work every parkRecheckMs) but would hold the message until
// the re-check. Here the re-check is 30 s, so a single lost wake-up among 200 two-chunk messages
// sent one at a time shows as a message that takes seconds; each must finish within 5 s (a bound
// against that stall, not a speed claim: they take about 0.1 ms).
TEST(Engine, FewChunkMessagesDoNotWaitForTheParkTimeout) {
  EngineOptions o = testOptions(8);
  o.minChunkBytes = 64 << 10;
  o.maxChunkBytes = 1 << 20;
  o.spinUs = 0;  // the default: idle streams park at once, so every message needs its wake-ups
  o.parkRecheckMs = 30000;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> sbuf(128 << 10), rbuf(128 << 10);  // 2 chunks, 6 streams stay idle
  fillPattern(sbuf, 5);
  double slowest = 0;
  for (int i = 0; i < 200; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(exchangeOne(p, sbuf, rbuf), rbuf.size());
    slowest = std::max(
        slowest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  EXPECT_EQ(firstMismatch(rbuf.data(), rbuf.size(), 5), -1);
  EXPECT_LT(slowest, 5.0) << "a message waited for the parked streams' re-check (lost wake-up)";
}

// Voluntary context switches of this process's threads named `name` (/proc/self/task/*/comm).
static long switchesOf(const std::string& name) {
  long total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string n;
    std::getline(comm, n);
    if (n != name) {
      continue;
    }
    std::ifstream st(task.path() / "status");
    std::string line;
    while (std::getline(st, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        total += std::stol(line.substr(line.find(':') + 1));
      }
    }
  }
  return total;
}

TEST(Engine, ReceiveControlThreadStaysOffTheStreamWhileTheCallerPolls) {
  // NCCL's proxy polls test() on every outstanding request, and test() reads the control stream
  // itself; the receive control thread steps in only after the caller has not been seen for a
  // grace period. Asserted per message: the thread may wake for a small share of the records
  // (the caller descheduled past the grace on a loaded host: 4-85 of 2000 with `yes` on four
  // threads of the 2-core VM), never for most of them (one per record without the rule, 1909 of
  // 2000; 215-389 when a test() that found its request done did not count as seen).
  EngineOptions o = testOptions(2);
  o.inlineBytes = 16 << 10;
  o.spinUs = 0;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> sbuf(8 << 10), rbuf(8 << 10);  // inline: control stream only
  fillPattern(sbuf, 3);
  const int kMessages = 2000;
  long before = switchesOf("bagua-net-rc");
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(exchangeOne(p, sbuf, rbuf), rbuf.size());
  }
  long woken = switchesOf("bagua-net-rc") - before;
  EXPECT_EQ(firstMismatch(rbuf.data(), rbuf.size(), 3), -1);
  EXPECT_LE(woken, kMessages / 10) << "the receive control thread woke for " << woken << " of "
                                   << kMessages << " records while the caller polled";
}

TEST(Engine, ChunkedMessagesCostAboutOneWakeUpPerChunkOnEachSide) {
  // 2 MiB over 8 streams: 8 chunks of 256 KiB, so each message wakes up to 8 parked send threads
  // and 8 receive threads blocked in recv. Parks used to notify while holding their lock, so a
  // woken thread often woke only to block on that lock: 20-23 voluntary context switches per
  // message in this process, 12-13 since wakeAll notifies after releasing it.
  EngineOptions o = testOptions(8);
  o.minChunkBytes = 64 << 10;
  o.maxChunkBytes = 1 << 20;
  o.inlineBytes = 64 << 10;
  o.spinUs = 0;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> sbuf(2 << 20), rbuf(2 << 20);
  fillPattern(sbuf, 9);
  const int kMessages = 300;
  const double kBound = 2 * 8 + 2;  // one wake-up per chunk on each side, plus the callers'
  double best = 1e9;
  for (int attempt = 0; attempt < 3 && best > kBound; ++attempt) {
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    std::thread sender([&] {
      for (int i = 0; i < kMessages; ++i) {
        Result<Request*> s = p.send->isend(sbuf.data(), sbuf.size());
        ASSERT_TRUE(s.isOk());
        size_t n = 0;
        ASSERT_TRUE(waitRequest(*s, &n).isOk());
      }
    });
    for (int i = 0; i < kMessages; ++i) {
      Result<Request*> r = p.recv->irecv(rbuf.data(), rbuf.size());
      ASSERT_TRUE(r.isOk());
      size_t n = 0;
      ASSERT_TRUE(waitRequest(*r, &n).isOk());
      ASSERT_EQ(n, rbuf.size());
    }
    sender.join();
    getrusage(RUSAGE_SELF, &after);
    double perMessage = double(after.ru_nvcsw - before.ru_nvcsw) / kMessages;
    best = std::min(best, perMessage);
  }
  EXPECT_EQ(firstMismatch(rbuf.data(), rbuf.size(), 9), -1);
  EXPECT_LE(best, kBound) << "best of up to 3 runs";
}

TEST(Engine, InlineLimitUpTo4MiBWhenBothSidesAgree) {
  EngineOptions o = testOptions(4);
  o.inlineBytes = 1 << 20;
  ASSERT_TRUE(o.validate().isOk());
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  transfer(p, {1 << 20, 1000, (1 << 20) + 1, 1 << 20}, 2);  // inline, inline, chunked, inline
  o.inlineBytes = (4 << 20) + 1;
  Status s = o.validate();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("above 4 MiB"), std::string::npos) << s.toString();
}

TEST(Engine, LargeMessages64MiBPlus) {
  EngineOptions o = testOptions(8);
  o.maxChunkBytes = 1 << 20;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  transfer(p, {(64u << 20) + 3, 5u << 20}, 2);
}

TEST(Engine, Ipv6Loopback) {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (fd >= 0) {
    ::close(fd);
  }
  if (!ok) {
    GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  }
  Pair p = connectPair(testOptions(2), "::1");
  ASSERT_TRUE(p.send && p.recv);
  EXPECT_EQ(p.recv->peer().family(), AF_INET6);
  transfer(p, {0, 1, 300, 100000}, 4);
}

TEST(Engine, RequestPoolFullIsUnavailableNotAnError) {
  std::vector<uint8_t> buf(16);  // outlives the comms (buffers must stay valid until close)
  Pair p = connectPair(testOptions(2));
  ASSERT_TRUE(p.recv);
  std::vector<Request*> reqs;
  for (;;) {
    Result<Request*> r = p.recv->irecv(buf.data(), buf.size());
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().toString();
      break;
    }
    reqs.push_back(*r);
    ASSERT_LE(reqs.size(), 1000u);
  }
  EXPECT_GE(reqs.size(), static_cast<size_t>(kMinRequestsInFlight));
  // Closing with all of them in flight must be clean.
}

TEST(Engine, TruncatedReceiveIsAClearError) {
  std::vector<uint8_t> big(100000, 1), small(1000, 0);  // outlive the comms
  Pair p = connectPair(testOptions(2));
  ASSERT_TRUE(p.send && p.recv);
  Result<Request*> s = p.send->isend(big.data(), big.size());
  ASSERT_TRUE(s.isOk());
  Result<Request*> r = p.recv->irecv(small.data(), small.size());
  ASSERT_TRUE(r.isOk());
  size_t n = 0;
  Status st = waitRequest(*r, &n, 10);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.toString();
  // Later receives report the failure too.
  Result<Request*> again = p.recv->irecv(small.data(), small.size());
  EXPECT_FALSE(again.isOk());
}

TEST(Engine, TruncatedInlineReceive) {
  std::vector<uint8_t> msg(200, 1), small(10, 0);  // outlive the comms
  Pair p = connectPair(testOptions(1));
  ASSERT_TRUE(p.send && p.recv);
  ASSERT_TRUE(p.send->isend(msg.data(), msg.size()).isOk());
  Result<Request*> r = p.recv->irecv(small.data(), small.size());
  ASSERT_TRUE(r.isOk());
  size_t n = 0;
  Status st = waitRequest(*r, &n, 10);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  for (size_t i = 0; i < small.size(); ++i) {
    EXPECT_EQ(small[i], 0) << "nothing written on truncation";
  }
}

TEST(Engine, PeerClosingMidReceiveFailsPendingReceiveInBoundedTime) {
  std::vector<uint8_t> buf(1 << 20);  // outlives the comms
  Pair p = connectPair(testOptions(4));
  ASSERT_TRUE(p.send && p.recv);
  Result<Request*> r = p.recv->irecv(buf.data(), buf.size());
  ASSERT_TRUE(r.isOk());
  auto t0 = std::chrono::steady_clock::now();
  p.send.reset();  // the peer goes away
  size_t n = 0;
  Status st = waitRequest(*r, &n, 10);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kRemoteError) << st.toString();
  EXPECT_LT(secs, 5.0);
}

TEST(Engine, ReceiverGoneFailsSendsInBoundedTime) {
  std::vector<uint8_t> buf(8 << 20, 3);  // outlives the comms
  Pair p = connectPair(testOptions(2));
  ASSERT_TRUE(p.send && p.recv);
  p.recv.reset();
  Status last;
  bool failed = pollFor(10, [&] {
    Result<Request*> r = p.send->isend(buf.data(), buf.size());
    if (!r.isOk()) {
      last = r.takeStatus();
      return last.code() != StatusCode::kUnavailable;
    }
    size_t n = 0;
    last = waitRequest(*r, &n, 10);
    return !last.isOk();
  });
  ASSERT_TRUE(failed) << "sending to a closed peer never failed";
  EXPECT_TRUE(last.code() == StatusCode::kRemoteError || last.code() == StatusCode::kSystemError)
      << last.toString();
}

TEST(Engine, StrangersAndGarbageAreDropped) {
  EngineOptions o = testOptions(2);
  o.helloTimeoutMs = 100;
  Result<std::unique_ptr<Listener>> l = Listener::create(*SocketAddress::parse("127.0.0.1"), o);
  ASSERT_TRUE(l.isOk());
  const SocketAddress& addr = (*l)->address();
  // A stranger that sends garbage, one that sends nothing, one with a valid hello but a wrong
  // nonce.
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.length), 0);
    fds.push_back(fd);
  }
  const char garbage[] = "GET / HTTP/1.1\r\nHost: bagua\r\n\r\n";
  ASSERT_GT(::send(fds[0], garbage, sizeof(garbage), 0), 0);
  wire::Hello h;
  h.nStreams = 2;
  h.nonce = 12345;
  uint8_t hello[wire::kHelloBytes];
  wire::encodeHello(h, hello);
  ASSERT_GT(::send(fds[2], hello, sizeof(hello), 0), 0);
  for (int i = 0; i < 20; ++i) {
    Result<std::unique_ptr<RecvComm>> r = (*l)->accept();
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(*r, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // All three were dropped: the listener closed them.
  for (int fd : fds) {
    char c;
    pollFor(2, [&] { return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0; });
    EXPECT_EQ(::recv(fd, &c, 1, MSG_DONTWAIT), 0) << "stranger socket not closed";
    ::close(fd);
  }
  // A real connector still works afterwards.
  Result<std::unique_ptr<Connector>> c = Connector::start((*l)->handle(), o);
  ASSERT_TRUE(c.isOk());
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_TRUE(pollFor(10, [&] {
    if (!s) {
      s = (*c)->poll().value();
    }
    if (!r) {
      r = (*l)->accept().value();
    }
    return s && r;
  }));
  Pair p{std::move(s), std::move(r)};
  transfer(p, {10, 100000}, 2);
}

TEST(Engine, GarbageOnAnEstablishedDataStreamFailsTheComm) {
  // Build a receive comm by hand: a connector-like client that sends valid hellos and then junk.
  EngineOptions o = testOptions(1);
  Result<std::unique_ptr<Listener>> l = Listener::create(*SocketAddress::parse("127.0.0.1"), o);
  ASSERT_TRUE(l.isOk());
  Result<wire::HandleInfo> info = wire::decodeHandle((*l)->handle().data(), kHandleBytes);
  ASSERT_TRUE(info.isOk());
  const SocketAddress& addr = (*l)->address();
  int fds[2];
  for (int i = 0; i < 2; ++i) {
    fds[i] = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fds[i], reinterpret_cast<const sockaddr*>(&addr.storage), addr.length), 0);
    wire::Hello h;
    h.kind = i == 0 ? wire::StreamKind::kControl : wire::StreamKind::kData;
    h.index = 0;
    h.nStreams = 1;
    h.nonce = info->nonce;
    h.connId = 99;
    uint8_t hello[wire::kHelloBytes];
    wire::encodeHello(h, hello);
    ASSERT_EQ(::send(fds[i], hello, sizeof(hello), 0), static_cast<ssize_t>(sizeof(hello)));
  }
  std::unique_ptr<RecvComm> r;
  ASSERT_TRUE(pollFor(5, [&] {
    r = (*l)->accept().value();
    return r != nullptr;
  }));
  std::vector<uint8_t> buf(1 << 16);
  Result<Request*> req = r->irecv(buf.data(), buf.size());
  ASSERT_TRUE(req.isOk());
  std::vector<uint8_t> junk(4096, 0x5a);
  ASSERT_GT(::send(fds[1], junk.data(), junk.size(), 0), 0);
  size_t n = 0;
  Status st = waitRequest(*req, &n, 10);
  EXPECT_EQ(st.code(), StatusCode::kRemoteError) << st.toString();
  r.reset();
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(Engine, ManyCommsAtOnce) {
  constexpr int kComms = 12;
  std::vector<Pair> pairs;
  for (int i = 0; i < kComms; ++i) {
    pairs.push_back(connectPair(testOptions(1 + i % 3)));
    ASSERT_TRUE(pairs.back().send && pairs.back().recv);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kComms; ++i) {
    threads.emplace_back([&, i] {
      std::vector<size_t> sizes;
      for (int k = 0; k < 20; ++k) {
        sizes.push_back(static_cast<size_t>((k * 104729 + i * 7) % 300000));
      }
      transfer(pairs[static_cast<size_t>(i)], sizes, 8);
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
}

TEST(Engine, CloseWithRequestsInFlightIsClean) {
  for (int round = 0; round < 5; ++round) {
    Pair p = connectPair(testOptions(4));
    ASSERT_TRUE(p.send && p.recv);
    std::vector<uint8_t> out(4 << 20, 1), in(4 << 20);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(p.send->isend(out.data(), out.size()).isOk());
      ASSERT_TRUE(p.recv->irecv(in.data(), in.size()).isOk());
    }
    if (round % 2 == 0) {
      p.recv.reset();
      p.send.reset();
    } else {
      p.send.reset();
      p.recv.reset();
    }
  }
}

TEST(Engine, ConnectToNothingFails) {
  // Take a port, close it, connect there: refused.
  EngineOptions o = testOptions(1);
  Handle h;
  {
    Result<std::unique_ptr<Listener>> l = Listener::create(*SocketAddress::parse("127.0.0.1"), o);
    ASSERT_TRUE(l.isOk());
    h = (*l)->handle();
  }
  Result<std::unique_ptr<Connector>> c = Connector::start(h, o);
  if (!c.isOk()) {
    EXPECT_NE(c.status().code(), StatusCode::kOk);
    return;
  }
  Status last;
  ASSERT_TRUE(pollFor(10, [&] {
    Result<std::unique_ptr<SendComm>> s = (*c)->poll();
    if (!s.isOk()) {
      last = s.takeStatus();
      return true;
    }
    return false;
  }));
  EXPECT_EQ(last.code(), StatusCode::kRemoteError) << last.toString();
}

}  // namespace
}  // namespace bagua::net
