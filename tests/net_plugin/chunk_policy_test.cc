// The send side's per-message chunk policy (bagua/net/chunk_policy.h): planChunks as a pure
// function, its parameter, and the engine applying it (chunks counted per message, bytes per
// stream, the plan each message reports against the policy run on what the comm reported seeing).
// No timing assertions: the measured inputs (wake-up, rates) vary with the host, so the engine
// tests check the relation between what the comm saw and what it did, not particular values.
#include "bagua/net/chunk_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/net/engine.h"
#include "engine_pair.h"
#include "net_test_util.h"
#include "wire.h"

namespace bagua::net {
namespace {

using testing::connectPair;
using testing::fillPattern;
using testing::firstMismatch;
using testing::Pair;
using testing::testOptions;
using testing::transfer;
using testing::waitRequest;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

ChunkRules adaptiveRules() {
  ChunkRules r;
  r.adaptive = true;
  r.inlineBytes = 64 * kKiB;
  r.minChunk = 256 * kKiB;
  r.maxChunk = 1 * kMiB;
  return r;
}

// A load with every one of `streams` measured at `rate` bytes/s and the given wake-up.
CommLoad measured(uint64_t size, int streams, double rate, double wakeSeconds) {
  CommLoad l;
  l.size = size;
  l.streams = streams;
  for (int i = 0; i < streams; ++i) {
    l.streamRates[static_cast<size_t>(i)] = rate;
  }
  l.wakeSeconds = wakeSeconds;
  return l;
}

// Every plan covers the message exactly: chunks x chunk >= size > (chunks - 1) x chunk.
void expectCovers(const ChunkPlan& p, uint64_t size) {
  ASSERT_GT(p.chunk, 0u);
  EXPECT_GE(p.chunks * p.chunk, size);
  EXPECT_LT((p.chunks - 1) * p.chunk, size);
}

// ---- the pure function -------------------------------------------------------------------------

TEST(ChunkPolicy, InlineUpToTheLimitAndEmptyMessages) {
  ChunkRules r = adaptiveRules();
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, 64 * kKiB}) {
    ChunkPlan p = planChunks(measured(size, 8, 5e9, 20e-6), r);
    EXPECT_EQ(p, ChunkPlan{}) << size << " bytes must travel inline";
    EXPECT_EQ(p.reason, PlanReason::kInline);
  }
  r.inlineBytes = 0;
  EXPECT_EQ(planChunks(measured(0, 8, 5e9, 20e-6), r).reason, PlanReason::kInline)
      << "an empty message has no chunk to send";
  EXPECT_EQ(planChunks(measured(1, 8, 5e9, 20e-6), r).chunks, 1u);
}

// The fixed rule is the static one: ceil(size / streams) clamped to [min, max], the lone floor
// only for a message with nothing queued before it.
TEST(ChunkPolicy, FixedRuleIsTheStaticSplit) {
  ChunkRules r;
  r.inlineBytes = 64 * kKiB;
  r.minChunk = 256 * kKiB;
  r.maxChunk = 1 * kMiB;
  for (uint64_t size : {65 * kKiB, 300 * kKiB, 1 * kMiB, 2 * kMiB + 7, 64 * kMiB}) {
    for (int n : {1, 2, 8}) {
      CommLoad l = measured(size, n, 5e9, 20e-6);  // measurements do not matter to it
      ChunkPlan p = planChunks(l, r);
      EXPECT_EQ(p.reason, PlanReason::kFixed);
      EXPECT_EQ(p.chunk, wire::chunkBytesFor(size, n, r.minChunk, r.maxChunk))
          << size << " bytes over " << n;
      expectCovers(p, size);
      EXPECT_EQ(p.wake, static_cast<int>(std::min<uint64_t>(p.chunks, n)));
    }
  }
  r.loneChunk = 64 * kKiB;
  CommLoad lone = measured(1 * kMiB, 8, 0, 0);
  EXPECT_EQ(planChunks(lone, r).chunk, 128 * kKiB) << "lone: cut for 8 streams down to 64 KiB";
  lone.queuedBytes = 1;
  EXPECT_EQ(planChunks(lone, r).chunk, 256 * kKiB) << "queued: the minimum holds";
}

// Until the wake-up and at least one stream are measured, the adaptive rule cuts as the fixed one
// with the minimum chunk; a stream without a rate yet is left out of the median (here 7 streams
// at 5 GB/s and a 20 us wake-up: 100 KB, so a lone 1 MiB message in 8 chunks of 128 KiB).
TEST(ChunkPolicy, AdaptiveStartsFromTheMinimumUntilMeasured) {
  ChunkRules r = adaptiveRules();
  CommLoad l = measured(1 * kMiB, 8, 5e9, 0);  // wake-up not measured
  ChunkPlan p = planChunks(l, r);
  EXPECT_EQ(p.reason, PlanReason::kUnmeasured);
  EXPECT_EQ(p.chunk, 256 * kKiB);
  EXPECT_EQ(p.chunks, 4u);
  l = measured(1 * kMiB, 8, 0, 20e-6);  // no stream measured
  EXPECT_EQ(planChunks(l, r).reason, PlanReason::kUnmeasured);
  l = measured(1 * kMiB, 8, 5e9, 20e-6);
  l.streamRates[7] = 0;  // one active stream never sent
  p = planChunks(l, r);
  EXPECT_EQ(p.reason, PlanReason::kLone);
  EXPECT_EQ(p.chunk, 128 * kKiB);
}

// Idle cores: a wake-up of 10 us at 6.4 GB/s is worth 64 KB, so a lone 1 MiB message goes over all
// 8 streams at once (128 KiB each).
TEST(ChunkPolicy, LoneMessageOnAnIdleHostSpreadsOverEveryStream) {
  ChunkPlan p = planChunks(measured(1 * kMiB, 8, 6.4e9, 10e-6), adaptiveRules());
  EXPECT_EQ(p.reason, PlanReason::kLone);
  EXPECT_EQ(p.chunk, 128 * kKiB);
  EXPECT_EQ(p.chunks, 8u);
  EXPECT_EQ(p.wake, 8);
  // 256 KiB: 4 chunks of the 64 KiB floor, 4 streams woken, 4 left asleep.
  p = planChunks(measured(256 * kKiB, 8, 6.4e9, 10e-6), adaptiveRules());
  EXPECT_EQ(p.chunk, 64 * kKiB);
  EXPECT_EQ(p.chunks, 4u);
  EXPECT_EQ(p.wake, 4);
}

// Busy cores: a wake-up of 250 us at 5 GB/s is worth 1.25 MB, more than the minimum chunk: the
// floor stays at the minimum (256 KiB), the static rule's cut, never coarser. In between, 20 us x
// 5 GB/s = 100 KB: a lone 1 MiB message in chunks of 128 KiB (its even split over 8 streams,
// above the 100 KB floor); a lone 512 KiB one in 100 KB chunks (6, the last one shorter).
TEST(ChunkPolicy, LoneMessageOnABusyHostKeepsTheMinimumChunk) {
  for (uint64_t size : {512 * kKiB, 1 * kMiB, 3 * kMiB}) {
    ChunkPlan p = planChunks(measured(size, 8, 5e9, 250e-6), adaptiveRules());
    EXPECT_EQ(p.reason, PlanReason::kLone);
    EXPECT_EQ(p.chunk, wire::chunkBytesFor(size, 8, 256 * kKiB, 1 * kMiB)) << size;
  }
  ChunkPlan p = planChunks(measured(1 * kMiB, 8, 5e9, 20e-6), adaptiveRules());
  EXPECT_EQ(p.chunk, 128 * kKiB);
  EXPECT_EQ(p.chunks, 8u);
  p = planChunks(measured(512 * kKiB, 8, 5e9, 20e-6), adaptiveRules());
  EXPECT_EQ(p.chunk, 100000u);
  EXPECT_EQ(p.chunks, 6u);
}

// Bytes of earlier messages still unclaimed: every stream has work waiting, so splitting finer
// cannot start the message earlier; at least the minimum chunk.
TEST(ChunkPolicy, QueuedMessageKeepsTheMinimumChunk) {
  CommLoad l = measured(1 * kMiB, 8, 6.4e9, 10e-6);
  l.queuedBytes = 4 * kMiB;
  ChunkPlan p = planChunks(l, adaptiveRules());
  EXPECT_EQ(p.reason, PlanReason::kQueued);
  EXPECT_EQ(p.chunk, 256 * kKiB);
  EXPECT_EQ(p.chunks, 4u);
  // Busy host: the minimum as well (the measured floor is capped at it).
  l = measured(1 * kMiB, 8, 5e9, 250e-6);
  l.queuedBytes = 1;
  EXPECT_EQ(planChunks(l, adaptiveRules()).chunk, 256 * kKiB);
}

// Nothing queued but messages in flight: each may hold a stream, so the message is cut for the
// streams still free (here 2 of 8), and never for fewer than one.
TEST(ChunkPolicy, MessagesInFlightLeaveFewerStreamsToCutFor) {
  CommLoad l = measured(1 * kMiB, 8, 6.4e9, 10e-6);
  l.inFlight = 6;
  ChunkPlan p = planChunks(l, adaptiveRules());
  EXPECT_EQ(p.reason, PlanReason::kLone);
  EXPECT_EQ(p.chunk, 512 * kKiB);
  EXPECT_EQ(p.chunks, 2u);
  l.inFlight = 40;
  EXPECT_EQ(planChunks(l, adaptiveRules()).chunk, 1 * kMiB) << "all busy: cut for one stream";
}

// One stream at a tenth of the others: its chunk must not outlast the message on all of them, so
// chunks shrink to its share (8 MiB x 0.64 / 45.44 GB/s = 118 KB), and the fast streams take more
// of them. Without the slow stream the same message goes in 1 MiB chunks.
TEST(ChunkPolicy, UnevenStreamsGetFinerChunks) {
  CommLoad l = measured(8 * kMiB, 8, 6.4e9, 10e-6);
  EXPECT_EQ(planChunks(l, adaptiveRules()).chunk, 1 * kMiB);
  l.streamRates[3] = 0.64e9;
  ChunkPlan p = planChunks(l, adaptiveRules());
  EXPECT_EQ(p.reason, PlanReason::kUneven);
  EXPECT_NEAR(static_cast<double>(p.chunk), 8.0 * kMiB * 0.64 / (7 * 6.4 + 0.64), 1.0);
  expectCovers(p, 8 * kMiB);
  EXPECT_EQ(p.wake, 8);
  // Never below the adaptive floor: a 512 KiB message's share would be 7 KB.
  l.size = 512 * kKiB;
  EXPECT_EQ(planChunks(l, adaptiveRules()).chunk, kAdaptiveFloor);
  // A slow stream at just above a quarter of the median is not "slow".
  l = measured(8 * kMiB, 8, 6.4e9, 10e-6);
  l.streamRates[3] = 0.26 * 6.4e9;
  EXPECT_EQ(planChunks(l, adaptiveRules()).reason, PlanReason::kLone);
}

// Bounds hold whatever is measured: no chunk above maxChunk (even one below the adaptive floor),
// none below minChunk when queued (unless a slow stream caps it), streams clamped to [1,
// kMaxStreams], every plan covering its message, never more wake-ups than chunks or streams.
TEST(ChunkPolicy, BoundsHoldOverAGridOfLoads) {
  const std::vector<uint64_t> sizes = {65 * kKiB, 100 * kKiB, 1 * kMiB, 7 * kMiB + 3, 256 * kMiB};
  const std::vector<double> wakes = {0, 1e-6, 30e-6, 5e-3};
  const std::vector<double> rates = {0, 1e8, 3e9, 2e10};
  for (uint64_t maxChunk : {16 * kKiB, 1 * kMiB, 4 * kMiB}) {
    ChunkRules r = adaptiveRules();
    r.maxChunk = maxChunk;
    r.minChunk = std::min<uint64_t>(256 * kKiB, maxChunk);
    for (uint64_t size : sizes) {
      for (double w : wakes) {
        for (double rate : rates) {
          for (int streams : {0, 1, 3, 8, 64, 100}) {
            for (uint64_t queued : {uint64_t{0}, 5 * kMiB}) {
              CommLoad l = measured(size, std::clamp(streams, 1, kMaxStreams), rate, w);
              l.streams = streams;
              l.queuedBytes = queued;
              l.streamRates[0] = rate / 7;  // sometimes slow, sometimes unmeasured
              ChunkPlan p = planChunks(l, r);
              SCOPED_TRACE(::testing::Message()
                           << size << " B, wake " << w << ", rate " << rate << ", " << streams
                           << " streams, queued " << queued << ", max " << maxChunk);
              expectCovers(p, size);
              EXPECT_LE(p.chunk, maxChunk);
              if (queued > 0 && p.reason != PlanReason::kUneven) {
                EXPECT_GE(p.chunk, std::min(r.minChunk, size));
              }
              EXPECT_GE(p.wake, 1);
              EXPECT_LE(static_cast<uint64_t>(p.wake), p.chunks);
              EXPECT_LE(p.wake, std::clamp(streams, 1, kMaxStreams));
            }
          }
        }
      }
    }
  }
}

// Rule 7: a lone one-chunk message smaller than the break-even chunk is the caller's to send (its
// copy costs less than the wake-up it saves); not a queued one, not one behind a message still in
// flight, not one of several chunks, not one as large as the break-even, never under the fixed
// rule.
TEST(ChunkPolicy, CallerSendsALoneOneChunkMessageCheaperThanAWakeUp) {
  // 250 us x 5 GB/s: 1.25 MB.
  ChunkPlan p = planChunks(measured(kCallerSendMax, 8, 5e9, 250e-6), adaptiveRules());
  EXPECT_EQ(p.chunks, 1u);
  EXPECT_TRUE(p.callerSends);
  ChunkRules large = adaptiveRules();
  large.minChunk = 1 * kMiB;  // one chunk up to 1 MiB
  p = planChunks(measured(kCallerSendMax + 1, 8, 5e9, 250e-6), large);
  EXPECT_EQ(p.chunks, 1u);
  EXPECT_FALSE(p.callerSends) << "above the bound: the proxy thread's copy would hold up others";
  CommLoad queued = measured(256 * kKiB, 8, 5e9, 250e-6);
  queued.queuedBytes = 1;
  EXPECT_FALSE(planChunks(queued, adaptiveRules()).callerSends) << "streams have work waiting";
  CommLoad busy = measured(256 * kKiB, 8, 5e9, 250e-6);
  busy.inFlight = 1;
  EXPECT_FALSE(planChunks(busy, adaptiveRules()).callerSends) << "a message still in flight";
  EXPECT_FALSE(planChunks(measured(3 * kMiB, 8, 5e9, 250e-6), adaptiveRules()).callerSends)
      << "three chunks";
  // 20 us x 5 GB/s = 100 KB: a 96 KiB message is one chunk (floor 100 KB) and cheaper than the
  // wake-up. 10 us x 5 GB/s = 50 KB: a 60 KiB message is one chunk (the 64 KiB floor) but its
  // copy costs more than the wake-up.
  EXPECT_TRUE(planChunks(measured(96 * kKiB, 8, 5e9, 20e-6), adaptiveRules()).callerSends);
  ChunkRules smallInline = adaptiveRules();
  smallInline.inlineBytes = 32 * kKiB;
  ChunkPlan p60 = planChunks(measured(60 * kKiB, 8, 5e9, 10e-6), smallInline);
  EXPECT_EQ(p60.chunks, 1u);
  EXPECT_FALSE(p60.callerSends);
  ChunkRules fixed = adaptiveRules();
  fixed.adaptive = false;
  EXPECT_FALSE(planChunks(measured(256 * kKiB, 8, 5e9, 250e-6), fixed).callerSends);
  EXPECT_FALSE(planChunks(measured(256 * kKiB, 8, 0, 0), adaptiveRules()).callerSends)
      << "nothing measured: no break-even to compare with";
}

TEST(ChunkPolicy, RoundRobinSplitsEvenlyOverEveryStream) {
  ChunkRules r = adaptiveRules();
  r.roundRobin = true;
  r.maxChunk = wire::kMaxChunkWire;
  ChunkPlan p = planChunks(measured(64 * kMiB, 8, 6.4e9, 10e-6), r);
  EXPECT_EQ(p.reason, PlanReason::kFixed);
  EXPECT_EQ(p.chunk, 8 * kMiB) << "no 1 MiB clamp under the equal split";
  EXPECT_EQ(p.chunks, 8u);
}

// ---- the parameter -----------------------------------------------------------------------------

TEST(ChunkPolicyParam, AdaptiveByDefaultAndPinnedByAFloorSetByHand) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> env;
    bool adaptive;
  };
  const Case cases[] = {
      {{}, true},
      {{{"BAGUA_NET_CHUNK_POLICY", "fixed"}}, false},
      {{{"BAGUA_NET_MIN_CHUNKSIZE", "64K"}}, false},
      {{{"BAGUA_NET_LONE_CHUNKSIZE", "64K"}}, false},
      {{{"BAGUA_NET_MIN_CHUNKSIZE", "512K"}, {"BAGUA_NET_CHUNK_POLICY", "adaptive"}}, true},
      {{{"BAGUA_NET_MAX_CHUNKSIZE", "4M"}}, true},
  };
  for (const Case& c : cases) {
    std::string what;
    for (const auto& [k, v] : c.env) {
      what += k + "=" + v + " ";
    }
    ScopedEnvForTesting env(netParams(), c.env);
    Result<EngineOptions> o = EngineOptions::fromParams();
    ASSERT_TRUE(o.isOk()) << what << o.status().toString();
    EXPECT_EQ(o->adaptiveChunks, c.adaptive) << what;
  }
  ScopedEnvForTesting env(netParams(), {{"BAGUA_NET_CHUNK_POLICY", "fast"}});
  Result<EngineOptions> o = EngineOptions::fromParams();
  ASSERT_FALSE(o.isOk());
  EXPECT_NE(o.status().message().find("BAGUA_NET_CHUNK_POLICY"), std::string::npos)
      << o.status().message();
}

// ---- the engine applies it ---------------------------------------------------------------------

EngineOptions adaptiveOptions(int streams) {
  EngineOptions o = testOptions(streams);
  o.adaptiveChunks = true;
  o.minChunkBytes = 256 * kKiB;
  o.maxChunkBytes = 1 * kMiB;
  o.inlineBytes = 64 * kKiB;
  return o;
}

// Sends `size` alone (nothing else in flight), every byte checked; returns the comm's plan and
// the chunks and per-stream bytes the message produced.
struct Sent {
  MessagePlan plan;
  uint64_t chunks = 0;                 // chunksPosted(): the cuts isend made
  std::vector<uint64_t> bytes;         // per stream
  std::vector<uint64_t> streamChunks;  // chunks each stream sent
};

Sent sendAlone(Pair& p, size_t size, uint64_t tag) {
  Sent out;
  std::vector<uint8_t> sbuf(size), rbuf(size, 0xee);
  fillPattern(sbuf, tag);
  const uint64_t chunks0 = p.send->chunksPosted();
  const std::vector<uint64_t> bytes0 = p.send->bytesPerStream();
  const std::vector<uint64_t> streamChunks0 = p.send->chunksPerStream();
  Result<Request*> r = p.recv->irecv(rbuf.data(), rbuf.size());
  Result<Request*> s = p.send->isend(sbuf.data(), sbuf.size());
  EXPECT_TRUE(r.isOk() && s.isOk());
  if (!r.isOk() || !s.isOk()) {
    return out;
  }
  out.plan = p.send->lastPlan();
  size_t n = 0;
  EXPECT_TRUE(waitRequest(*s, &n).isOk());
  EXPECT_TRUE(waitRequest(*r, &n).isOk());
  EXPECT_EQ(n, size);
  EXPECT_EQ(firstMismatch(rbuf.data(), size, tag), -1);
  out.chunks = p.send->chunksPosted() - chunks0;
  const std::vector<uint64_t> bytes1 = p.send->bytesPerStream();
  const std::vector<uint64_t> streamChunks1 = p.send->chunksPerStream();
  for (size_t i = 0; i < bytes1.size(); ++i) {
    out.bytes.push_back(bytes1[i] - bytes0[i]);
    out.streamChunks.push_back(streamChunks1[i] - streamChunks0[i]);
  }
  return out;
}

// Each message reports what the comm saw and the plan it was cut by: the plan is the policy's on
// that input, the message produced exactly plan.chunks chunks of plan.chunk bytes (so no stream
// carried more than ceil(chunks / streams used) of them), and once the streams have sent, the
// plans come from measurements (lone, nothing queued) instead of the starting minimum.
TEST(ChunkPolicyEngine, EveryMessageIsCutAsItsPlanSays) {
  Pair p = connectPair(adaptiveOptions(4));
  ASSERT_TRUE(p.send && p.recv);
  int measuredPlans = 0;
  for (int i = 0; i < 60; ++i) {
    const size_t size = (i % 3 == 0) ? 3 * kMiB + 5 : (i % 3 == 1) ? 1 * kMiB : 200 * kKiB;
    Sent sent = sendAlone(p, size, static_cast<uint64_t>(i));
    const MessagePlan& m = sent.plan;
    ASSERT_TRUE(m.rules.adaptive);
    EXPECT_EQ(m.load.size, size);
    EXPECT_EQ(m.load.streams, 4);
    EXPECT_EQ(m.load.queuedBytes, 0u) << "one message at a time: nothing waits to be claimed";
    EXPECT_EQ(planChunks(m.load, m.rules), m.plan) << "message " << i;
    EXPECT_EQ(sent.chunks, m.plan.chunks) << "message " << i << " (" << size << " B)";
    uint64_t total = 0;
    uint64_t chunks = 0;
    int carriers = 0;
    const uint64_t tail = size % m.plan.chunk;
    for (size_t s = 0; s < sent.bytes.size(); ++s) {
      const uint64_t b = sent.bytes[s];
      total += b;
      chunks += sent.streamChunks[s];
      carriers += b > 0 ? 1 : 0;
      // Whole chunks of plan.chunk bytes, one stream also the shorter tail.
      EXPECT_TRUE(b % m.plan.chunk == 0 || b % m.plan.chunk == tail)
          << "stream " << s << " carried " << b << " B of chunks of " << m.plan.chunk;
    }
    EXPECT_EQ(chunks, m.plan.chunks) << "chunks the data threads sent, message " << i;
    EXPECT_EQ(total, size);
    EXPECT_LE(static_cast<uint64_t>(carriers), m.plan.chunks);
    if (m.plan.chunks == 1) {
      EXPECT_EQ(carriers, 1) << "a one-chunk message on one stream";
    }
    if (m.plan.reason != PlanReason::kUnmeasured) {
      ++measuredPlans;
      EXPECT_GT(m.load.wakeSeconds, 0.0);
      EXPECT_GT(*std::max_element(m.load.streamRates.begin(), m.load.streamRates.begin() + 4), 0.0);
    }
  }
  EXPECT_GT(measuredPlans, 0) << "60 messages over 4 streams never measured a stream";
}

// Messages posted while earlier ones still wait for a stream see the unclaimed bytes (kQueued
// once measured) and keep at least the minimum chunk; the fixed rule never looks at it.
TEST(ChunkPolicyEngine, MessagesBehindUnclaimedBytesKeepTheMinimum) {
  EngineOptions o = adaptiveOptions(2);
  o.socketBufferBytes = 64 << 10;  // the first message cannot leave before receives are posted
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  // Warm up until every stream and the wake-up are measured.
  sendAlone(p, 2 * kMiB, 99);
  for (int i = 0; i < 40 && p.send->lastPlan().plan.reason == PlanReason::kUnmeasured; ++i) {
    sendAlone(p, 2 * kMiB, 100 + static_cast<uint64_t>(i));
  }
  ASSERT_NE(p.send->lastPlan().plan.reason, PlanReason::kUnmeasured);

  constexpr size_t kCount = 4;
  std::vector<std::vector<uint8_t>> sbufs(kCount), rbufs(kCount);
  std::vector<Request*> sends;
  std::vector<MessagePlan> plans;
  for (size_t i = 0; i < kCount; ++i) {
    sbufs[i].resize(4 * kMiB);
    fillPattern(sbufs[i], i);
    rbufs[i].assign(4 * kMiB, 0xee);
    Result<Request*> s = p.send->isend(sbufs[i].data(), sbufs[i].size());
    ASSERT_TRUE(s.isOk());
    sends.push_back(*s);
    plans.push_back(p.send->lastPlan());
  }
  std::vector<Request*> recvs;
  for (size_t i = 0; i < kCount; ++i) {
    Result<Request*> r = p.recv->irecv(rbufs[i].data(), rbufs[i].size());
    ASSERT_TRUE(r.isOk());
    recvs.push_back(*r);
  }
  for (size_t i = 0; i < kCount; ++i) {
    size_t n = 0;
    ASSERT_TRUE(waitRequest(recvs[i], &n).isOk());
    EXPECT_EQ(n, 4 * kMiB);
    EXPECT_EQ(firstMismatch(rbufs[i].data(), n, i), -1) << "message " << i;
    ASSERT_TRUE(waitRequest(sends[i], &n).isOk());
  }
  for (size_t i = 1; i < kCount; ++i) {
    const MessagePlan& m = plans[i];
    EXPECT_EQ(planChunks(m.load, m.rules), m.plan);
    EXPECT_GT(m.load.queuedBytes, 0u) << "message " << i << " was posted behind message 0";
    EXPECT_GE(m.load.inFlight, 1u);
    // Queued, unless the streams' rates (measured while the kernel held their sends back) came
    // out uneven enough for rule 5.
    EXPECT_TRUE(m.plan.reason == PlanReason::kQueued || m.plan.reason == PlanReason::kUneven)
        << "message " << i << ": " << planReasonName(m.plan.reason);
    if (m.plan.reason == PlanReason::kQueued) {
      EXPECT_GE(m.plan.chunk, 256 * kKiB);
    }
  }
}

// A live minimum chunk (the autotuner's) pins the fixed rule; clearing it brings the policy back.
// Options built without adaptiveChunks keep the fixed rule throughout.
TEST(ChunkPolicyEngine, LiveFloorAndHandBuiltOptionsUseTheFixedRule) {
  Pair p = connectPair(adaptiveOptions(4));
  ASSERT_TRUE(p.send && p.recv);
  ASSERT_TRUE(p.send->setLiveSettings({0, 512 * kKiB, 0}).isOk());
  Sent sent = sendAlone(p, 2 * kMiB, 1);
  EXPECT_FALSE(sent.plan.rules.adaptive);
  EXPECT_EQ(sent.plan.plan.reason, PlanReason::kFixed);
  EXPECT_EQ(sent.plan.plan.chunk, 512 * kKiB);
  EXPECT_EQ(sent.chunks, 4u);
  ASSERT_TRUE(p.send->setLiveSettings({}).isOk());
  EXPECT_TRUE(sendAlone(p, 2 * kMiB, 2).plan.rules.adaptive);

  Pair fixed = connectPair(testOptions(4));
  ASSERT_TRUE(fixed.send && fixed.recv);
  for (int i = 0; i < 10; ++i) {
    Sent f = sendAlone(fixed, 1 * kMiB, 10 + static_cast<uint64_t>(i));
    EXPECT_EQ(f.plan.plan.reason, PlanReason::kFixed);
    EXPECT_EQ(f.chunks, 16u) << "1 MiB in the test options' 64 KiB chunks";
  }
}

// Rule 7 applied: with the measurements seeded (a 1 s wake-up, every stream at 5 GB/s: every lone
// one-chunk message is cheaper to copy than a wake-up), isend writes each message itself on a
// parked stream, one chunk on one stream. A socket buffer far smaller than the message makes every
// such non-blocking send partial, so the stream's thread finishes it; every byte checked. One
// message in 16 still goes through a woken stream (so the wake-up stays measured).
TEST(ChunkPolicyEngine, CallerSentChunksArriveWholeAndPartialOnesAreFinishedByTheStream) {
  EngineOptions o = adaptiveOptions(4);
  o.socketBufferBytes = 16 << 10;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  int callerSent = 0;
  for (int i = 0; i < 40; ++i) {
    // Seeded again before each message: the rates the threads measure through so small a buffer
    // are the receiver's pace, uneven enough at times for rule 5.
    p.send->seedMeasurementsForTesting(1.0, 5e9);
    const size_t size = (i % 2 == 0) ? kCallerSendMax : 100 * kKiB + 3;
    Sent sent = sendAlone(p, size, 300 + static_cast<uint64_t>(i));
    const MessagePlan& m = sent.plan;
    EXPECT_EQ(planChunks(m.load, m.rules), m.plan);
    ASSERT_EQ(m.plan.chunks, 1u) << "message " << i << ": wake-up " << m.load.wakeSeconds
                                 << " s, stream 0 at " << m.load.streamRates[0] << " B/s";
    EXPECT_TRUE(m.plan.callerSends) << "message " << i;
    callerSent += m.callerSent ? 1 : 0;
    int carriers = 0;
    uint64_t chunks = 0;
    for (size_t s = 0; s < sent.bytes.size(); ++s) {
      carriers += sent.bytes[s] > 0 ? 1 : 0;
      chunks += sent.streamChunks[s];
    }
    EXPECT_EQ(carriers, 1) << "message " << i;
    EXPECT_EQ(chunks, 1u) << "message " << i;
  }
  EXPECT_GE(callerSent, 30) << "isend found no parked stream for most of 40 one-at-a-time messages";
  EXPECT_LT(callerSent, 40) << "one in 16 goes through a woken stream";
}

// A comm destroyed while a caller-sent chunk waits for room (no receive posted, so the socket never
// drains) shuts down without hanging: the stream's thread is in a blocking send that shutdown(2)
// ends.
TEST(ChunkPolicyEngine, CloseWithACallerSentChunkPendingIsClean) {
  EngineOptions o = adaptiveOptions(2);
  o.socketBufferBytes = 16 << 10;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  p.send->seedMeasurementsForTesting(1.0, 5e9);
  // Until isend finds a parked stream (just after connecting there may be none): a message that
  // went through a woken stream is received in full and the next one tried; the caller-sent one is
  // never received, so it stays stuck in its socket.
  std::vector<uint8_t> buf(kCallerSendMax, 0x42);
  std::vector<uint8_t> rbuf(kCallerSendMax);
  bool callerSent = false;
  for (int i = 0; i < 20 && !callerSent; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    p.send->seedMeasurementsForTesting(1.0, 5e9);
    Result<Request*> s = p.send->isend(buf.data(), buf.size());
    ASSERT_TRUE(s.isOk());
    callerSent = p.send->lastPlan().callerSent;
    if (!callerSent) {
      Result<Request*> r = p.recv->irecv(rbuf.data(), rbuf.size());
      ASSERT_TRUE(r.isOk());
      size_t n = 0;
      ASSERT_TRUE(waitRequest(*r, &n).isOk());
      ASSERT_TRUE(waitRequest(*s, &n).isOk());
    }
  }
  EXPECT_TRUE(callerSent) << "20 messages, 5 ms apart, never found a parked stream";
  p.send.reset();
  p.recv.reset();
}

// One stream paced far below the others (the kernel's SO_MAX_PACING_RATE): once measured, a lone
// message's chunks shrink below the even split (kUneven) and the paced stream carries less than
// its equal share. Every byte checked.
TEST(ChunkPolicyEngine, APacedStreamMakesChunksFiner) {
  EngineOptions o = adaptiveOptions(4);
  o.socketBufferBytes = 128 << 10;  // back-pressure from the paced stream comes early
  o.slowStreamBytesPerSec = 4 << 20;
  Pair p = connectPair(o);
  ASSERT_TRUE(p.send && p.recv);
  bool uneven = false;
  uint64_t slow = 0;
  uint64_t total = 0;
  for (int i = 0; i < 30 && !uneven; ++i) {
    Sent sent = sendAlone(p, 4 * kMiB, 200 + static_cast<uint64_t>(i));
    EXPECT_EQ(planChunks(sent.plan.load, sent.plan.rules), sent.plan.plan);
    EXPECT_EQ(sent.chunks, sent.plan.plan.chunks);
    uneven = sent.plan.plan.reason == PlanReason::kUneven;
    if (uneven) {
      EXPECT_LT(sent.plan.plan.chunk, 1 * kMiB) << "the even split of 4 MiB over 4 streams";
      // The paced stream is the slowest of the measured ones (a stream without 8 chunks yet
      // reports no rate).
      const auto& r = sent.plan.load.streamRates;
      for (size_t k = 1; k < 4; ++k) {
        EXPECT_TRUE(r[k] == 0 || r[0] < r[k]) << "stream " << k << " at " << r[k] << " B/s";
      }
    }
    slow += sent.bytes[0];
    total += 4 * kMiB;
  }
  EXPECT_TRUE(uneven) << "30 messages never saw stream 0 as slow";
  EXPECT_LT(slow, total / 4) << "the paced stream carried its equal share or more";
}

}  // namespace
}  // namespace bagua::net
