// A connection over several rails (one device spanning several interfaces): the handle's rail
// list, and the streams spread over the listener's addresses, each leaving from its own local
// interface. Loopback stands in for the NICs (every 127/8 address is local); the shaped-link test
// (links_test.cc) runs the same over real veth links in two network namespaces.
#include <netinet/in.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bagua/net/engine.h"
#include "engine_pair.h"
#include "wire.h"

namespace bagua::net {
namespace {

using testing::connectPair;
using testing::Pair;
using testing::testOptions;
using testing::transfer;

std::string hostOf(const SocketAddress& a) {
  std::string s = a.toString();
  return s.substr(0, s.rfind(':'));
}

TEST(Rails, HandleCarriesEveryRail) {
  wire::HandleInfo in;
  in.address = *SocketAddress::parse("[fd00::1]:1000");
  for (size_t j = 0; j < wire::kMaxExtraRails; ++j) {
    in.extra.push_back(
        *SocketAddress::parse("10.0." + std::to_string(j) + ".9:" + std::to_string(2000 + j)));
  }
  in.nonce = 99;
  Handle h;
  h.fill(0xff);
  wire::encodeHandle(in, &h);
  for (size_t i = kHandleCallerOffset; i < kHandleBytes; ++i) {
    ASSERT_EQ(h[i], 0) << "caller area must start zeroed, byte " << i;
  }
  Result<wire::HandleInfo> out = wire::decodeHandle(h.data(), h.size());
  ASSERT_TRUE(out.isOk()) << out.status().toString();
  ASSERT_EQ(out->rails(), 1 + wire::kMaxExtraRails);
  EXPECT_EQ(out->rail(0).toString(), "[fd00::1]:1000");
  for (size_t j = 0; j < wire::kMaxExtraRails; ++j) {
    EXPECT_EQ(out->rail(j + 1).toString(),
              "10.0." + std::to_string(j) + ".9:" + std::to_string(2000 + j));
  }
  EXPECT_EQ(out->nonce, 99u);
}

TEST(Rails, HandleWithBadRailListIsRejected) {
  wire::HandleInfo in;
  in.address = *SocketAddress::parse("10.0.0.1:1000");
  in.extra.push_back(*SocketAddress::parse("10.0.1.1:1001"));
  Handle h;
  wire::encodeHandle(in, &h);
  Handle tooMany = h;
  tooMany[40] = static_cast<uint8_t>(wire::kMaxExtraRails + 1);
  Result<wire::HandleInfo> r = wire::decodeHandle(tooMany.data(), tooMany.size());
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("extra rails"), std::string::npos) << r.status().toString();
  Handle noPort = h;
  noPort[48 + 4] = 0;
  noPort[48 + 5] = 0;
  r = wire::decodeHandle(noPort.data(), noPort.size());
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("port 0"), std::string::npos) << r.status().toString();
}

// Data stream i goes to rail i mod 2 (the control stream to rail 0), every byte arrives.
TEST(Rails, StreamsSpreadOverTheListenersAddresses) {
  EngineOptions o = testOptions(4);
  Pair p = connectPair(o, {"127.0.0.1", "127.0.0.2"});
  ASSERT_TRUE(p.send && p.recv);
  std::vector<SocketAddress> peers = p.send->streamPeers();
  ASSERT_EQ(peers.size(), 4u);
  for (size_t i = 0; i < peers.size(); ++i) {
    EXPECT_EQ(hostOf(peers[i]), i % 2 == 0 ? "127.0.0.1" : "127.0.0.2") << "stream " << i;
  }
  EXPECT_EQ(hostOf(p.send->peer()), "127.0.0.1") << "the control stream is on rail 0";
  transfer(p, {1, 300, 100000, 3 << 20, 5 << 20}, 4);
  uint64_t total = 0;
  for (uint64_t b : p.send->bytesPerStream()) {
    total += b;
  }
  EXPECT_EQ(total, uint64_t{300 + 100000 + (3 << 20) + (5 << 20)}) << "all but the inline 1 B";
}

// With one local interface per rail, the streams of rail r leave from local[r].
TEST(Rails, EachRailLeavesFromItsLocalInterface) {
  EngineOptions o = testOptions(6);
  std::vector<NetInterface> local = {{"lo", *SocketAddress::parse("127.0.0.11")},
                                     {"lo", *SocketAddress::parse("127.0.0.12")},
                                     {"lo", *SocketAddress::parse("127.0.0.13")}};
  Pair p = connectPair(o, {"127.0.0.1", "127.0.0.2", "127.0.0.3"}, local);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<SocketAddress> from = p.recv->streamPeers();
  std::vector<SocketAddress> to = p.send->streamPeers();
  ASSERT_EQ(from.size(), 6u);
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_EQ(hostOf(to[i]), "127.0.0." + std::to_string(1 + i % 3)) << "stream " << i;
    EXPECT_EQ(hostOf(from[i]), "127.0.0." + std::to_string(11 + i % 3)) << "stream " << i;
  }
  transfer(p, {70000, 2 << 20}, 2);
}

// A local list that does not match the rails is not used for binding (the kernel routes).
TEST(Rails, MismatchedLocalListLeavesRoutingToTheKernel) {
  EngineOptions o = testOptions(2);
  std::vector<NetInterface> local = {{"lo", *SocketAddress::parse("127.0.0.21")}};
  Pair p = connectPair(o, {"127.0.0.1", "127.0.0.2"}, local);
  ASSERT_TRUE(p.send && p.recv);
  for (const SocketAddress& a : p.recv->streamPeers()) {
    EXPECT_NE(hostOf(a), "127.0.0.21");
  }
  transfer(p, {1 << 20}, 1);
}

TEST(Rails, ListenerRejectsBadRailLists) {
  EngineOptions o = testOptions(2);
  Result<std::unique_ptr<Listener>> l = Listener::create(
      std::vector<SocketAddress>{*SocketAddress::parse("127.0.0.1"), *SocketAddress::parse("::1")},
      o);
  ASSERT_FALSE(l.isOk());
  EXPECT_NE(l.status().message().find("not IPv4"), std::string::npos) << l.status().toString();
  std::vector<SocketAddress> many(1 + wire::kMaxExtraRails + 1, *SocketAddress::parse("127.0.0.1"));
  l = Listener::create(many, o);
  ASSERT_FALSE(l.isOk());
  EXPECT_NE(l.status().message().find("addresses"), std::string::npos) << l.status().toString();
  l = Listener::create(std::vector<SocketAddress>{}, o);
  EXPECT_FALSE(l.isOk());
}

}  // namespace
}  // namespace bagua::net
