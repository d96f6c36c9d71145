// The Bagua-Net engine's live settings (LiveSettings) changed between messages on a connected
// comm: ranges, active streams, chunk bounds, messages posted before a change, round robin.
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

// ---- live settings (LiveSettings): changed between messages on a connected comm ---------------

std::vector<uint64_t> deltaBytes(const std::vector<uint64_t>& after,
                                 const std::vector<uint64_t>& before) {
  std::vector<uint64_t> d(after.size());
  for (size_t i = 0; i < after.size(); ++i) {
    d[i] = after[i] - before[i];
  }
  return d;
}

// Clears the process-wide settings at scope exit so that one test cannot leak into the next.
struct ProcessLiveReset {
  ~ProcessLiveReset() { EXPECT_TRUE(setProcessLiveSettings(LiveSettings{}).isOk()); }
};

TEST(Live, ValidateRanges) {
  EXPECT_TRUE(LiveSettings{}.validate().isOk());
  EXPECT_TRUE((LiveSettings{8, 4096, 1 << 20}).validate().isOk());
  EXPECT_TRUE((LiveSettings{0, 1 << 20, 0}).validate().isOk()) << "max unset: no order check";
  EXPECT_FALSE((LiveSettings{-1, 0, 0}).validate().isOk());
  EXPECT_FALSE((LiveSettings{kMaxStreams + 1, 0, 0}).validate().isOk());
  EXPECT_FALSE((LiveSettings{0, 2 << 20, 1 << 20}).validate().isOk()) << "min above max";
  EXPECT_FALSE((LiveSettings{0, 0, (uint64_t{1} << 30) + 1}).validate().isOk());
  EXPECT_FALSE(setProcessLiveSettings(LiveSettings{kMaxStreams + 1, 0, 0}).isOk());
  EXPECT_EQ(processLiveSettings(), LiveSettings{}) << "a refused setting must not be stored";
}

// Active streams changed between messages: the new messages' bytes go only over the active
// streams, every byte arrives where it belongs, and the comm's own setting beats the process's.
TEST(Live, ActiveStreamsChangeBetweenMessages) {
  ProcessLiveReset reset;
  Pair p = connectPair(testOptions(8));
  ASSERT_TRUE(p.send && p.recv);
  const std::vector<size_t> sizes = {1 << 20, 300, (1 << 20) + 7, 200000, 0, 3 << 20};
  uint64_t chunked = 0;  // bytes of messages above the inline limit (they go over data streams)
  for (size_t s : sizes) {
    chunked += s > 256 ? s : 0;
  }
  EXPECT_EQ(p.send->effectiveLiveSettings(), (LiveSettings{8, 4096, 64 << 10}));

  std::vector<uint64_t> before = p.send->bytesPerStream();
  transfer(p, sizes, 4);
  std::vector<uint64_t> all = deltaBytes(p.send->bytesPerStream(), before);
  uint64_t sum = 0;
  int used = 0;
  for (uint64_t b : all) {
    sum += b;
    used += b > 0 ? 1 : 0;
  }
  EXPECT_EQ(sum, chunked);
  EXPECT_GE(used, 2) << "with 8 active streams the chunks should spread";

  struct Phase {
    LiveSettings comm;
    LiveSettings process;
    int expectActive;
  };
  const Phase phases[] = {
      {{2, 0, 0}, {}, 2},         // the comm's own setting
      {{}, {5, 0, 0}, 5},         // process-wide
      {{1, 0, 0}, {5, 0, 0}, 1},  // the comm's beats the process's
      {{3, 0, 0}, {}, 3},         // and back up
      {{40, 0, 0}, {}, 8},        // clamped to the established streams
  };
  for (const Phase& ph : phases) {
    ASSERT_TRUE(p.send->setLiveSettings(ph.comm).isOk());
    ASSERT_TRUE(setProcessLiveSettings(ph.process).isOk());
    EXPECT_EQ(p.send->effectiveLiveSettings().activeStreams, ph.expectActive);
    before = p.send->bytesPerStream();
    transfer(p, sizes, 4);
    std::vector<uint64_t> d = deltaBytes(p.send->bytesPerStream(), before);
    uint64_t activeSum = 0;
    for (int i = 0; i < 8; ++i) {
      if (i < ph.expectActive) {
        activeSum += d[static_cast<size_t>(i)];
      } else {
        EXPECT_EQ(d[static_cast<size_t>(i)], 0u)
            << "stream " << i << " carried bytes with " << ph.expectActive << " active";
      }
    }
    EXPECT_EQ(activeSum, chunked) << ph.expectActive << " active streams";
  }
}

// BAGUA_NET_LONE_CHUNKSIZE: a message posted when every earlier chunk is already claimed (here:
// one message at a time) is cut down to the lone size, not to the minimum; off (0), the minimum
// holds. 1 MiB messages with min = max = 1 MiB over 4 streams: 1 chunk each without it, 4 of
// 256 KiB (an even split, above the 128 KiB lone size) with it; every byte arrives either way.
TEST(Engine, LoneMessagesAreCutDownToTheLoneChunkSize) {
  constexpr size_t kMessage = 1 << 20;
  for (uint64_t lone : {uint64_t{0}, uint64_t{128} << 10}) {
    EngineOptions o = testOptions(4);
    o.minChunkBytes = kMessage;
    o.maxChunkBytes = kMessage;
    o.loneChunkBytes = lone;
    Pair p = connectPair(o);
    ASSERT_TRUE(p.send && p.recv);
    const uint64_t before = p.send->chunksPosted();
    transfer(p, {kMessage, kMessage, kMessage, kMessage + 3}, 1);
    const uint64_t chunks = p.send->chunksPosted() - before;
    if (lone == 0) {
      EXPECT_EQ(chunks, 3u + 2u) << "the minimum holds: one chunk per 1 MiB, two for 1 MiB + 3";
    } else {
      EXPECT_EQ(chunks, 4u * 3 + 4u) << "each lone message split over the 4 streams";
    }
  }
}

// Chunk bounds changed between messages: with min = max = the message size a message is one
// chunk (exactly one stream carries it); with small chunks it spreads again.
TEST(Live, ChunkBoundsChangeBetweenMessages) {
  ProcessLiveReset reset;
  Pair p = connectPair(testOptions(4));
  ASSERT_TRUE(p.send && p.recv);
  constexpr size_t kMessage = 1 << 20;
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(p.send->setLiveSettings({0, kMessage, kMessage}).isOk());
    EXPECT_EQ(p.send->effectiveLiveSettings().minChunkBytes, kMessage);
    std::vector<uint64_t> before = p.send->bytesPerStream();
    transfer(p, {kMessage}, 1);
    std::vector<uint64_t> d = deltaBytes(p.send->bytesPerStream(), before);
    int carriers = 0;
    for (uint64_t b : d) {
      EXPECT_TRUE(b == 0 || b == kMessage) << "a one-chunk message was split: " << b;
      carriers += b > 0 ? 1 : 0;
    }
    EXPECT_EQ(carriers, 1);

    // Process-wide small chunks (the comm's override cleared): 64 chunks of 16 KiB over 4
    // streams; every byte arrives.
    ASSERT_TRUE(p.send->setLiveSettings({}).isOk());
    ASSERT_TRUE(setProcessLiveSettings({0, 16 << 10, 16 << 10}).isOk());
    EXPECT_EQ(p.send->effectiveLiveSettings().maxChunkBytes, 16u << 10);
    before = p.send->bytesPerStream();
    transfer(p, {kMessage, kMessage + 5, 70000}, 3);
    d = deltaBytes(p.send->bytesPerStream(), before);
    EXPECT_EQ(d[0] + d[1] + d[2] + d[3], 2 * kMessage + 5 + 70000);
    ASSERT_TRUE(setProcessLiveSettings({}).isOk());
  }
}

// A message posted before the change keeps being served by every stream it was cut for, while
// the message posted after it only uses the new active count. The receiver posts nothing until
// both are posted, so the first is still in flight when the setting changes.
TEST(Live, MessagesPostedBeforeAChangeKeepTheirStreams) {
  EngineOptions o = testOptions(4);
  o.socketBufferBytes = 64 << 10;  // the first message cannot leave the sender before receives
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  constexpr size_t kFirst = 8 << 20;
  constexpr size_t kSecond = 4 << 20;
  std::vector<uint8_t> a(kFirst), b(kSecond), ra(kFirst, 0xee), rb(kSecond, 0xee);
  fillPattern(a, 0);
  fillPattern(b, 1);
  Result<Request*> s1 = p.send->isend(a.data(), a.size());
  ASSERT_TRUE(s1.isOk());
  ASSERT_TRUE(p.send->setLiveSettings({1, 0, 0}).isOk());
  Result<Request*> s2 = p.send->isend(b.data(), b.size());
  ASSERT_TRUE(s2.isOk());
  Result<Request*> r1 = p.recv->irecv(ra.data(), ra.size());
  Result<Request*> r2 = p.recv->irecv(rb.data(), rb.size());
  ASSERT_TRUE(r1.isOk() && r2.isOk());
  size_t n = 0;
  ASSERT_TRUE(waitRequest(*r1, &n).isOk());
  EXPECT_EQ(n, kFirst);
  ASSERT_TRUE(waitRequest(*r2, &n).isOk());
  EXPECT_EQ(n, kSecond);
  ASSERT_TRUE(waitRequest(*s1, &n).isOk());
  ASSERT_TRUE(waitRequest(*s2, &n).isOk());
  EXPECT_EQ(firstMismatch(ra.data(), ra.size(), 0), -1);
  EXPECT_EQ(firstMismatch(rb.data(), rb.size(), 1), -1);
  std::vector<uint64_t> d = p.send->bytesPerStream();
  EXPECT_EQ(d[0] + d[1] + d[2] + d[3], kFirst + kSecond);
  EXPECT_GE(d[0], kSecond) << "stream 0 alone carries the second message";
  EXPECT_GT(d[1] + d[2] + d[3], 0u) << "the first message was cut for 4 streams";
  EXPECT_LE(d[1] + d[2] + d[3], kFirst) << "streams 1..3 carried bytes of the second message";
}

// Round-robin keeps the established count (every stream walks every message); only the chunk
// bounds apply.
TEST(Live, RoundRobinKeepsTheEstablishedStreamCount) {
  EngineOptions o = testOptions(4);
  o.schedule = Schedule::kRoundRobin;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  ASSERT_TRUE(p.send->setLiveSettings({1, 8192, 0}).isOk());
  transfer(p, {4 << 20, 100, 65536 * 3 + 1, 0}, 2);
  std::vector<uint64_t> d = p.send->bytesPerStream();
  for (size_t i = 1; i < d.size(); ++i) {
    EXPECT_GT(d[i], 0u) << "round-robin stream " << i << " idle";
  }
}

}  // namespace
}  // namespace bagua::net
