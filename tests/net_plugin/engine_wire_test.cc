// Unit tests of the Bagua-Net engine's pieces that need no connection: wire formats (handles,
// hellos, control and chunk bounds), chunking, addresses, interface specs and parameters.
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

// ---- wire formats ------------------------------------------------------------------------------

TEST(Wire, HandleRoundTripIpv4) {
  wire::HandleInfo in;
  in.address = *SocketAddress::parse("10.1.2.3:4567");
  in.nonce = 0x0123456789abcdefULL;
  Handle h;
  h.fill(0xff);
  wire::encodeHandle(in, &h);
  for (size_t i = kHandleCallerOffset; i < kHandleBytes; ++i) {
    ASSERT_EQ(h[i], 0) << "caller area must start zeroed, byte " << i;
  }
  Result<wire::HandleInfo> out = wire::decodeHandle(h.data(), h.size());
  ASSERT_TRUE(out.isOk()) << out.status().toString();
  EXPECT_EQ(out->address.toString(), "10.1.2.3:4567");
  EXPECT_EQ(out->nonce, in.nonce);
}

TEST(Wire, HandleRoundTripIpv6WithScope) {
  wire::HandleInfo in;
  in.address = *SocketAddress::parse("[fd00::1234:5678]:65535");
  reinterpret_cast<sockaddr_in6*>(&in.address.storage)->sin6_scope_id = 7;
  in.nonce = 42;
  Handle h;
  wire::encodeHandle(in, &h);
  Result<wire::HandleInfo> out = wire::decodeHandle(h.data(), h.size());
  ASSERT_TRUE(out.isOk()) << out.status().toString();
  EXPECT_EQ(out->address.toString(), "[fd00::1234:5678]:65535");
  EXPECT_EQ(reinterpret_cast<sockaddr_in6*>(&out->address.storage)->sin6_scope_id, 7u);
}

TEST(Wire, HandleFromAnotherVersionOrPluginIsRejected) {
  wire::HandleInfo in;
  in.address = *SocketAddress::parse("127.0.0.1:1000");
  Handle h;
  wire::encodeHandle(in, &h);
  Handle other = h;
  other[4] = 9;  // version
  Result<wire::HandleInfo> r = wire::decodeHandle(other.data(), other.size());
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("version 9"), std::string::npos) << r.status().message();
  other = h;
  other[0] ^= 1;  // magic
  r = wire::decodeHandle(other.data(), other.size());
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("magic"), std::string::npos);
  other = h;
  other[6] = 5;  // family
  EXPECT_FALSE(wire::decodeHandle(other.data(), other.size()).isOk());
  EXPECT_FALSE(wire::decodeHandle(h.data(), 10).isOk());
}

TEST(Wire, HelloRoundTripAndValidation) {
  wire::Hello in;
  in.kind = wire::StreamKind::kData;
  in.index = 5;
  in.nStreams = 8;
  in.nonce = 0xfeedULL;
  in.connId = 0xabcdefULL;
  uint8_t buf[wire::kHelloBytes];
  wire::encodeHello(in, buf);
  Result<wire::Hello> out = wire::decodeHello(buf, sizeof(buf));
  ASSERT_TRUE(out.isOk());
  EXPECT_EQ(out->kind, wire::StreamKind::kData);
  EXPECT_EQ(out->index, 5);
  EXPECT_EQ(out->nStreams, 8);
  EXPECT_EQ(out->nonce, 0xfeedULL);
  EXPECT_EQ(out->connId, 0xabcdefULL);
  in.index = 8;  // out of range
  wire::encodeHello(in, buf);
  EXPECT_FALSE(wire::decodeHello(buf, sizeof(buf)).isOk());
  std::memcpy(buf, "GET / HTTP/1.1\r\nHost: x\r\n\r\n12345", wire::kHelloBytes);
  Result<wire::Hello> bad = wire::decodeHello(buf, sizeof(buf));
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kRemoteError);
}

TEST(Wire, ControlAndChunkBounds) {
  uint8_t buf[wire::kChunkBytes];
  wire::ControlRecord c{7, 100, 100};
  wire::encodeControl(c, buf);
  Result<wire::ControlRecord> rc = wire::decodeControl(buf, wire::kControlBytes, 1024);
  ASSERT_TRUE(rc.isOk());
  EXPECT_EQ(rc->seq, 7u);
  EXPECT_EQ(rc->size, 100u);
  EXPECT_FALSE(wire::decodeControl(buf, wire::kControlBytes, 64).isOk()) << "inline over limit";
  c = {1, 5000, 100};  // inline length must equal size
  wire::encodeControl(c, buf);
  EXPECT_FALSE(wire::decodeControl(buf, wire::kControlBytes, 1024).isOk());

  wire::ChunkHeader h{3, 1 << 20, 65536};
  wire::encodeChunk(h, buf);
  Result<wire::ChunkHeader> rh = wire::decodeChunk(buf, sizeof(buf), 1 << 20);
  ASSERT_TRUE(rh.isOk());
  EXPECT_EQ(rh->seq, 3u);
  EXPECT_EQ(rh->offset, 1u << 20);
  EXPECT_EQ(rh->length, 65536u);
  EXPECT_FALSE(wire::decodeChunk(buf, sizeof(buf), 4096).isOk()) << "chunk over limit";
  h = {3, UINT64_MAX - 10, 100};
  wire::encodeChunk(h, buf);
  EXPECT_FALSE(wire::decodeChunk(buf, sizeof(buf), 1 << 20).isOk()) << "offset overflow";
  h = {3, 0, 0};
  wire::encodeChunk(h, buf);
  EXPECT_FALSE(wire::decodeChunk(buf, sizeof(buf), 1 << 20).isOk()) << "empty chunk";
}

TEST(Chunking, EvenSplitClampedToMinAndMax) {
  const uint64_t kMin = 128 << 10, kMax = 1 << 20;
  EXPECT_EQ(wire::chunkBytesFor(1 << 20, 8, kMin, kMax), 128u << 10);  // 1 MiB over 8 streams
  EXPECT_EQ(wire::chunkBytesFor(100, 8, kMin, kMax), kMin);            // small: one chunk
  EXPECT_EQ(wire::chunkBytesFor(64ull << 20, 8, kMin, kMax), kMax);    // big: many chunks
  EXPECT_EQ(wire::chunkBytesFor(3 << 20, 2, kMin, kMax), kMax);
  EXPECT_EQ(wire::chunkBytesFor(1 << 20, 1, kMin, 4 << 20), 1u << 20);
  EXPECT_EQ(wire::chunkBytesFor((1 << 20) + 1, 8, kMin, kMax), (128u << 10) + 1);
  EXPECT_EQ(wire::chunkCount(0, kMin), 0u);
  EXPECT_EQ(wire::chunkCount(kMin + 1, kMin), 2u);
  EXPECT_EQ(wire::chunkCount(64ull << 20, kMax), 64u);
}

// ---- addresses, interface specs, parameters ----------------------------------------------------

TEST(Address, ParseForms) {
  EXPECT_EQ(SocketAddress::parse("127.0.0.1")->toString(), "127.0.0.1:0");
  EXPECT_EQ(SocketAddress::parse("127.0.0.1:80")->toString(), "127.0.0.1:80");
  EXPECT_EQ(SocketAddress::parse("::1")->toString(), "[::1]:0");
  EXPECT_EQ(SocketAddress::parse("[::1]:8080")->toString(), "[::1]:8080");
  EXPECT_EQ(SocketAddress::parse("[::1]:8080")->family(), AF_INET6);
  EXPECT_FALSE(SocketAddress::parse("localhost").isOk());
  EXPECT_FALSE(SocketAddress::parse("1.2.3.4:99999").isOk());
  EXPECT_FALSE(SocketAddress::parse("[::1").isOk());
}

TEST(IfnameSpec, NcclSyntax) {
  IfnameSpec p = IfnameSpec::parse("eth,ib");
  EXPECT_TRUE(p.matches("eth0"));
  EXPECT_TRUE(p.matches("ib1"));
  EXPECT_FALSE(p.matches("lo"));
  IfnameSpec x = IfnameSpec::parse("^docker,lo");
  EXPECT_TRUE(x.exclude);
  EXPECT_FALSE(x.matches("docker0"));
  EXPECT_FALSE(x.matches("lo"));
  EXPECT_TRUE(x.matches("eth0"));
  IfnameSpec e = IfnameSpec::parse("=eth0");
  EXPECT_TRUE(e.exact);
  EXPECT_TRUE(e.matches("eth0"));
  EXPECT_FALSE(e.matches("eth0.100"));
  IfnameSpec ex = IfnameSpec::parse("^=eth0,lo");
  EXPECT_TRUE(ex.exclude && ex.exact);
  EXPECT_FALSE(ex.matches("eth0"));
  EXPECT_TRUE(ex.matches("eth01"));
  EXPECT_TRUE(ex.matches("lo0"));
  EXPECT_EQ(IfnameSpec::parse("a,,b,").names.size(), 2u);
}

TEST(IfnameSpec, AddressFamilyStrings) {
  EXPECT_EQ(*parseAddressFamily(""), AF_UNSPEC);
  EXPECT_EQ(*parseAddressFamily("AF_INET"), AF_INET);
  EXPECT_EQ(*parseAddressFamily("AF_INET6"), AF_INET6);
  EXPECT_FALSE(parseAddressFamily("4").isOk());
}

TEST(Interfaces, LoopbackWhenAsked) {
  Result<std::vector<NetInterface>> r = findInterfaces("=lo", AF_INET);
  if (!r.isOk()) {
    GTEST_SKIP() << "no IPv4 loopback interface here: " << r.status().toString();
  }
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].name, "lo");
  EXPECT_EQ((*r)[0].address.family(), AF_INET);
  Result<std::vector<NetInterface>> none = findInterfaces("=no-such-if0", AF_UNSPEC);
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("NCCL_SOCKET_IFNAME"), std::string::npos);
  Result<std::vector<NetInterface>> any = findInterfaces("", AF_UNSPEC);
  ASSERT_TRUE(any.isOk()) << "the default must fall back to lo at least";
  EXPECT_FALSE(any->empty());
}

TEST(Params, DefaultsEnvAndStrictParsing) {
  {
    ScopedEnvForTesting env(netParams(), {});
    Result<EngineOptions> o = EngineOptions::fromParams();
    ASSERT_TRUE(o.isOk()) << o.status().toString();
    EXPECT_EQ(o->nStreams, 8);
    EXPECT_EQ(o->minChunkBytes, 256u << 10);
    EXPECT_EQ(o->inlineBytes, 64u << 10);
  }
  {
    ScopedEnvForTesting env(netParams(), {{"BAGUA_NET_NSTREAMS", "3"},
                                          {"BAGUA_NET_MIN_CHUNKSIZE", "64K"},
                                          {"BAGUA_NET_MAX_CHUNKSIZE", "2MiB"}});
    Result<EngineOptions> o = EngineOptions::fromParams();
    ASSERT_TRUE(o.isOk()) << o.status().toString();
    EXPECT_EQ(o->nStreams, 3);
    EXPECT_EQ(o->minChunkBytes, 64u << 10);
    EXPECT_EQ(o->maxChunkBytes, 2u << 20);
    EXPECT_EQ(netParams().nStreams.source(), ParamSource::kEnvironment);
  }
  {
    ScopedEnvForTesting env(netParams(), {{"BAGUA_NET_NSTREAMS", "65"}});
    Result<EngineOptions> o = EngineOptions::fromParams();
    ASSERT_FALSE(o.isOk());
    EXPECT_NE(o.status().message().find("BAGUA_NET_NSTREAMS"), std::string::npos);
  }
  {
    ScopedEnvForTesting env(netParams(),
                            {{"BAGUA_NET_MIN_CHUNKSIZE", "4M"}, {"BAGUA_NET_MAX_CHUNKSIZE", "1M"}});
    EXPECT_FALSE(EngineOptions::fromParams().isOk()) << "min > max must be rejected";
  }
  {
    ScopedEnvForTesting env(netParams(), {{"NCCL_SOCKET_FAMILY", "AF_INET7"}});
    EXPECT_FALSE(netParams().family.get().isOk());
  }
}

}  // namespace
}  // namespace bagua::net
