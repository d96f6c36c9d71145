// The tuner's transport knobs over the host backend, ranks as threads over loopback: the host
// segment size and the engine's streams and chunk size switched live on every rank together,
// ranks that disagree refused, engine knobs skipped without the engine. Shared knobs: one owner
// per resource (KnobOwners), a second tuner on the same group drops them, the owner's decisions
// are what is in force, a later tuner takes them over; ranks that keep different knobs all fail
// create().
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "autotune_harness.h"
#include "bagua/autotune/autotuner.h"
#include "bagua/autotune/knob_owners.h"
#include "bagua/autotune/transport_knobs.h"
#include "bagua/core/host_tuning.h"
#include "multi_rank.h"

namespace bagua::autotune {
namespace {

using namespace std::chrono_literals;
using namespace tunetest;

// ---- live transport knobs ----------------------------------------------------------------------

core::ProcessGroupOptions engineGroup(int rank, int world) {
  core::ProcessGroupOptions po = groupOptions(rank, world);
  po.hostTransport = core::HostTransport::kEngine;
  po.hostSharedMemory = false;
  return po;
}

struct TuningLog {
  std::vector<core::HostTuningState> perIter;  // after each iteration's onIterationEnd
  std::vector<std::map<std::string, int64_t>> knobs;
  std::vector<bool> decided;  // the tuner had applied a decision by then
  std::vector<int64_t> switches;
};

// The tuner switches the host segment size and the engine's active streams and chunk size live:
// every rank applies the same values at the same iteration (compared iteration by iteration, and
// against the decided setting), and every reduced gradient stays exact under every value.
TEST(TransportKnobs, HostEngineKnobsSwitchLiveOnEveryRankTogether) {
  constexpr int kWorld = 3;
  constexpr int kSteps = 70;
  constexpr int kSamples = 7;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<TuningLog> logs(kWorld);
  std::vector<std::vector<std::string>> knobNames(kWorld);
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, engineGroup(r, kWorld));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model m("", 11, 40);  // 40 KiB .. 420 KiB tensors: pieces above the inline limit
        auto algo = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        AutotuneOptions o = fastOptions(kSamples);
        o.minBucketBytes = 64 << 10;
        TransportKnobRanges ranges;
        ranges.minSegmentBytes = 16 << 10;
        ranges.maxSegmentBytes = 1 << 20;
        ranges.minChunkBytes = 8 << 10;
        ranges.maxChunkBytes = 512 << 10;
        o.knobs = transportKnobs(**pg, ranges);
        for (const Knob& k : o.knobs) {
          knobNames[r].push_back(k.dimension.name);
        }
        auto tuner = Autotuner::create(**ddp, *algo, o);
        if (!tuner.isOk()) {
          return tuner.status().toString();
        }
        for (int i = 0; i < kSteps; ++i) {
          std::string e = trainStep(**ddp, m, r, kWorld);
          if (!e.empty()) {
            return strPrintf("iteration %d: %s", i, e.c_str());
          }
          Status s = (*tuner)->onIterationEnd();
          if (!s.isOk()) {
            return s.toString();
          }
          auto st = core::hostTuning(**pg);
          if (!st.isOk()) {
            return st.status().toString();
          }
          logs[r].perIter.push_back(*st);
          logs[r].knobs.push_back((*tuner)->current().knobs);
          logs[r].decided.push_back(!(*tuner)->switchSteps().empty());
        }
        logs[r].switches = (*tuner)->switchSteps();
        return "";
      },
      150s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_EQ(knobNames[0],
            (std::vector<std::string>{"host_segment_bytes", "net_streams", "net_chunk_bytes"}));
  std::set<size_t> segments;
  std::set<int> streams;
  std::set<size_t> chunks;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(logs[r].switches, logs[0].switches) << "rank " << r;
    ASSERT_EQ(logs[r].perIter.size(), static_cast<size_t>(kSteps));
    for (int i = 0; i < kSteps; ++i) {
      const core::HostTuningState& a = logs[r].perIter[i];
      const core::HostTuningState& b = logs[0].perIter[i];
      ASSERT_EQ(a.segmentBytes, b.segmentBytes) << "rank " << r << " iteration " << i;
      ASSERT_EQ(a.activeStreams, b.activeStreams) << "rank " << r << " iteration " << i;
      ASSERT_EQ(a.engineChunkBytes, b.engineChunkBytes) << "rank " << r << " iteration " << i;
      // The engine's parameters stay what the environment gave (the net_chunk_bytes knob's
      // starting point): BAGUA_NET_MIN_CHUNKSIZE's default here.
      ASSERT_EQ(a.engineMinChunkBytes, size_t{256} << 10) << "rank " << r << " iteration " << i;
      // What is in force is what the tuner decided (applied at the decision, before the next
      // iteration's collectives); before its first decision, the parameters' values.
      if (!logs[r].decided[i]) {
        continue;
      }
      const auto& k = logs[r].knobs[i];
      ASSERT_EQ(a.segmentBytes, static_cast<size_t>(k.at("host_segment_bytes")));
      ASSERT_EQ(a.activeStreams, k.at("net_streams"));
      ASSERT_EQ(a.engineChunkBytes, static_cast<size_t>(k.at("net_chunk_bytes")));
      EXPECT_EQ(a.transport, "engine");
      segments.insert(a.segmentBytes);
      streams.insert(a.activeStreams);
      chunks.insert(a.engineChunkBytes);
    }
  }
  EXPECT_GE(segments.size(), 3u) << "the segment size should have been switched";
  EXPECT_GE(chunks.size(), 3u) << "the chunk size should have been switched";
  EXPECT_GE(streams.size(), 2u) << "the stream count should have been switched";
}

// The contract of setHostTuning: ranks passing different values get InvalidArgument on every
// rank, nothing is applied anywhere, and the communicator stays usable; equal values apply.
TEST(TransportKnobs, SetHostTuningRefusesRanksThatDisagree) {
  constexpr int kWorld = 3;
  auto store = std::make_shared<core::InMemoryStore>();
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, engineGroup(r, kWorld));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        auto before = core::hostTuning(**pg);
        if (!before.isOk()) {
          return before.status().toString();
        }
        core::HostTuning bad;
        bad.segmentBytes = r == 1 ? (64 << 10) : (128 << 10);
        Status s = core::setHostTuning(**pg, bad, 20000ms);
        if (s.code() != StatusCode::kInvalidArgument ||
            s.message().find("rank 1") == std::string::npos) {
          return "mismatch not refused as expected: " + s.toString();
        }
        core::HostTuning tooMany;
        tooMany.engineStreams = before->establishedStreams + 1;
        if (core::setHostTuning(**pg, tooMany, 20000ms).code() != StatusCode::kInvalidArgument) {
          return "a stream count above the established one was accepted";
        }
        auto after = core::hostTuning(**pg);
        if (after->segmentBytes != before->segmentBytes ||
            after->activeStreams != before->activeStreams) {
          return "a refused tuning was applied";
        }
        core::HostTuning good;
        good.segmentBytes = 32 << 10;
        good.engineStreams = 1;
        good.engineChunkBytes = 16 << 10;
        s = core::setHostTuning(**pg, good, 20000ms);
        if (!s.isOk()) {
          return s.toString();
        }
        after = core::hostTuning(**pg);
        if (after->segmentBytes != (32u << 10) || after->activeStreams != 1 ||
            after->engineChunkBytes != (16u << 10)) {
          return "the agreed tuning was not applied";
        }
        // Still usable, with exact results after the switch.
        std::vector<float> v(300000);
        for (size_t i = 0; i < v.size(); ++i) {
          v[i] = static_cast<float>(r * 1000 + static_cast<int>(i % 977));
        }
        auto w = (*pg)->global().allReduce(v.data(), v.data(), v.size(), DataType::kF32,
                                           core::ReduceOp::kSum);
        s = w->wait(20000ms);
        if (!s.isOk()) {
          return s.toString();
        }
        for (size_t i = 0; i < v.size(); ++i) {
          const float want = static_cast<float>(3000 + 3 * static_cast<int>(i % 977));
          if (v[i] != want) {
            return strPrintf("element %zu is %g, want %g", i, v[i], want);
          }
        }
        return "";
      },
      60s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// Over the socket / shared-memory transport only the segment knob is offered (the engine knobs
// are skipped with an INFO line), and a group of one rank gets none.
TEST(TransportKnobs, EngineKnobsSkippedWithoutTheEngine) {
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::vector<std::string>> names(2);
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        core::ProcessGroupOptions po = groupOptions(r, 2);
        po.hostTransport = core::HostTransport::kSocket;
        auto pg = core::ProcessGroup::create(store, po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        for (const Knob& k : transportKnobs(**pg)) {
          names[r].push_back(k.dimension.name);
        }
        core::HostTuning t;
        t.engineStreams = 1;
        if (core::setHostTuning(**pg, t, 20000ms).code() != StatusCode::kFailedPrecondition) {
          return "engine streams accepted on the socket transport";
        }
        return "";
      },
      60s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_EQ(names[0], std::vector<std::string>{"host_segment_bytes"});
  EXPECT_EQ(names[1], names[0]);
  auto solo =
      core::ProcessGroup::create(std::make_shared<core::InMemoryStore>(), groupOptions(0, 1));
  ASSERT_TRUE(solo.isOk());
  EXPECT_TRUE(transportKnobs(**solo).empty());
  EXPECT_FALSE(NetPluginLive::find().isOk()) << "no NCCL net plugin is loaded in this test";
}

// ---- shared knobs: one owner per resource -------------------------------------------------------

TEST(KnobOwners, ClaimConflictReleaseAndPerRankKeys) {
  KnobOwners owners;
  const uint64_t g = KnobOwners::newOwnerId();
  const uint64_t d = KnobOwners::newOwnerId();
  const uint64_t g1 = KnobOwners::newOwnerId();
  EXPECT_NE(g, 0u);
  EXPECT_NE(g, d);
  const std::string r0 = netPluginResource(0, "net_streams");
  const std::string r1 = netPluginResource(1, "net_streams");
  EXPECT_EQ(r0, "bagua-net-plugin/rank0/net_streams");
  EXPECT_NE(r0, r1);
  EXPECT_NE(r0, netPluginResource(0, "net_chunk_bytes"));

  EXPECT_EQ(owners.claim(r0, g, "G"), std::nullopt);
  EXPECT_EQ(owners.claim(r0, g, "G"), std::nullopt) << "claiming again is idempotent";
  EXPECT_EQ(owners.claim(r0, d, "D"), std::optional<std::string>("G")) << "same rank: conflict";
  EXPECT_EQ(owners.claim(r1, g1, "G"), std::nullopt) << "another rank's key: its own owner";
  EXPECT_EQ(owners.claim(r1, d, "D"), std::optional<std::string>("G"));
  EXPECT_EQ(owners.claim("", d, "D"), std::nullopt) << "a private knob is always granted";
  EXPECT_EQ(owners.size(), 2u) << "the private knob is not recorded, the refused claims neither";
  EXPECT_EQ(owners.holder(r0), std::optional<std::string>("G"));

  EXPECT_TRUE(owners.releaseAll(d).empty()) << "D holds nothing";
  EXPECT_EQ(owners.releaseAll(g), std::vector<std::string>{r0});
  EXPECT_EQ(owners.holder(r0), std::nullopt);
  EXPECT_EQ(owners.holder(r1), std::optional<std::string>("G")) << "rank 1's owner keeps it";
  EXPECT_EQ(owners.claim(r0, d, "D"), std::nullopt) << "free again after the release";
  EXPECT_EQ(owners.holder(r0), std::optional<std::string>("D"));
  EXPECT_EQ(owners.releaseAll(d), std::vector<std::string>{r0});
  EXPECT_EQ(owners.releaseAll(g1), std::vector<std::string>{r1});
  EXPECT_EQ(owners.size(), 0u);

  // The host route's key is per ProcessGroup object.
  auto a = core::ProcessGroup::create(std::make_shared<core::InMemoryStore>(), groupOptions(0, 1));
  auto b = core::ProcessGroup::create(std::make_shared<core::InMemoryStore>(), groupOptions(0, 1));
  ASSERT_TRUE(a.isOk() && b.isOk());
  EXPECT_NE(hostGroupResource(**a, "net_streams"), hostGroupResource(**b, "net_streams"));
  EXPECT_EQ(hostGroupResource(**a, "net_streams"), hostGroupResource(**a, "net_streams"));
  EXPECT_NE(hostGroupResource(**a, "net_streams"), hostGroupResource(**a, "net_chunk_bytes"));
}

// Two reducers (a GAN's G and D) on one group both ask for the transport knobs: the first tuner
// owns them and the second tunes its buckets only; after every iteration the live transport
// settings on every rank are the first tuner's decision (never overwritten by the second), both
// reach their final decision with exact gradients, and once the first tuner is gone a third one
// on the same group takes the knobs over, starting from what the first left in force.
TEST(TransportKnobs, TwoTunersOnOneGroupShareTheTransportKnobsByOwnership) {
  constexpr int kWorld = 3;
  constexpr int kMaxSteps = 120;
  const std::vector<std::string> kAll = {"host_segment_bytes", "net_streams", "net_chunk_bytes"};
  auto store = std::make_shared<core::InMemoryStore>();
  struct Log {
    std::vector<std::string> namesG, namesD, namesC;
    std::vector<core::HostTuningState> live;  // after each iteration (both tuners called)
    std::vector<std::map<std::string, int64_t>> knobsG;
    std::vector<bool> decidedG;
    std::vector<int64_t> switchesG, switchesD;
    int steps = 0;
    std::map<std::string, int64_t> finalG, startC;
    std::vector<std::map<std::string, int64_t>> knobsC;
    std::vector<core::HostTuningState> liveC;
    int decidedC = 0;
  };
  std::vector<Log> logs(kWorld);
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, engineGroup(r, kWorld));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Log& L = logs[r];
        Model g("g.", 7, 40), d("d.", 9, 30);
        auto algoG = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto algoD = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddpG = core::withBagua(g.params, g.buffers, {}, algoG, **pg);
        auto ddpD = core::withBagua(d.params, d.buffers, {}, algoD, **pg);
        if (!ddpG.isOk() || !ddpD.isOk()) {
          return "reducer creation failed";
        }
        TransportKnobRanges ranges;
        ranges.maxSegmentBytes = 1 << 20;
        ranges.minChunkBytes = 8 << 10;
        ranges.maxChunkBytes = 512 << 10;
        AutotuneOptions og = fastOptions(5), od = fastOptions(4);
        og.model = "G";
        og.minBucketBytes = 64 << 10;
        og.knobs = transportKnobs(**pg, ranges);
        for (const Knob& k : og.knobs) {
          if (k.resource != hostGroupResource(**pg, k.dimension.name)) {
            return "knob " + k.dimension.name + " has resource '" + k.resource + "'";
          }
        }
        od.model = "D";
        od.minBucketBytes = 64 << 10;
        od.checkInterval = 3;
        od.knobs = transportKnobs(**pg, ranges);
        auto tg = Autotuner::create(**ddpG, *algoG, og);
        if (!tg.isOk()) {
          return tg.status().toString();
        }
        auto td = Autotuner::create(**ddpD, *algoD, od);
        if (!td.isOk()) {
          return td.status().toString();
        }
        L.namesG = (*tg)->knobNames();
        L.namesD = (*td)->knobNames();
        if (KnobOwners::process().holder(hostGroupResource(**pg, "net_streams")) != "G") {
          return "G does not own net_streams while tuning";
        }
        int i = 0;
        for (; i < kMaxSteps && ((*tg)->tuning() || (*td)->tuning()); ++i) {
          for (int k = 0; k < 2; ++k) {
            std::string e = trainStep(k == 0 ? **ddpG : **ddpD, k == 0 ? g : d, r, kWorld);
            if (!e.empty()) {
              return strPrintf("iteration %d, model %s: %s", i, k == 0 ? "G" : "D", e.c_str());
            }
            Status s = (k == 0 ? *tg : *td)->onIterationEnd();
            if (!s.isOk()) {
              return s.toString();
            }
          }
          if (!(*td)->current().knobs.empty()) {
            return "D's setting carries transport knobs";
          }
          auto st = core::hostTuning(**pg);
          if (!st.isOk()) {
            return st.status().toString();
          }
          L.live.push_back(*st);
          L.knobsG.push_back((*tg)->current().knobs);
          L.decidedG.push_back(!(*tg)->switchSteps().empty());
        }
        L.steps = i;
        L.switchesG = (*tg)->switchSteps();
        L.switchesD = (*td)->switchSteps();
        L.finalG = (*tg)->current().knobs;
        if (KnobOwners::process().holder(hostGroupResource(**pg, "net_streams")).has_value()) {
          return "G still owns net_streams after its final decision";
        }
        tg->reset();  // G is gone; D keeps running without transport knobs
        AutotuneOptions oc = fastOptions(3);
        oc.model = "C";
        oc.minBucketBytes = 64 << 10;
        oc.knobs = transportKnobs(**pg, ranges);
        Model c("c.", 6, 40);
        auto algoC = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddpC = core::withBagua(c.params, c.buffers, {}, algoC, **pg);
        if (!ddpC.isOk()) {
          return ddpC.status().toString();
        }
        auto tc = Autotuner::create(**ddpC, *algoC, oc);
        if (!tc.isOk()) {
          return tc.status().toString();
        }
        L.namesC = (*tc)->knobNames();
        L.startC = (*tc)->current().knobs;
        for (int j = 0; j < 40 && (*tc)->tuning(); ++j) {
          std::string e = trainStep(**ddpC, c, r, kWorld);
          if (e.empty()) {
            e = trainStep(**ddpD, d, r, kWorld);  // D (done) still trains next to C
          }
          if (!e.empty()) {
            return strPrintf("C's iteration %d: %s", j, e.c_str());
          }
          Status s = (*tc)->onIterationEnd();
          if (s.isOk()) {
            s = (*td)->onIterationEnd();
          }
          if (!s.isOk()) {
            return s.toString();
          }
          if ((*tc)->switchSteps().empty()) {
            continue;
          }
          auto st = core::hostTuning(**pg);
          if (!st.isOk()) {
            return st.status().toString();
          }
          L.liveC.push_back(*st);
          L.knobsC.push_back((*tc)->current().knobs);
        }
        if ((*tc)->tuning()) {
          return "C did not reach its final decision in 40 iterations";
        }
        return "";
      },
      150s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  std::set<size_t> segments;
  for (int r = 0; r < kWorld; ++r) {
    const Log& L = logs[r];
    EXPECT_EQ(L.namesG, kAll) << "rank " << r;
    EXPECT_TRUE(L.namesD.empty()) << "rank " << r << ": D keeps " << L.namesD.size();
    EXPECT_EQ(L.namesC, kAll) << "rank " << r;
    EXPECT_LT(L.steps, kMaxSteps) << "rank " << r << ": both tuners should have finished";
    EXPECT_EQ(L.steps, logs[0].steps);
    EXPECT_EQ(L.switchesG, logs[0].switchesG) << "rank " << r;
    EXPECT_EQ(L.switchesD, logs[0].switchesD) << "rank " << r;
    EXPECT_FALSE(L.switchesD.empty()) << "D tuned its buckets";
    ASSERT_EQ(L.live.size(), static_cast<size_t>(L.steps));
    for (size_t i = 0; i < L.live.size(); ++i) {
      const core::HostTuningState& a = L.live[i];
      ASSERT_EQ(a.segmentBytes, logs[0].live[i].segmentBytes) << "rank " << r << " it " << i;
      ASSERT_EQ(a.activeStreams, logs[0].live[i].activeStreams) << "rank " << r << " it " << i;
      ASSERT_EQ(a.engineChunkBytes, logs[0].live[i].engineChunkBytes) << "rank " << r;
      const auto& k = L.knobsG[i];
      ASSERT_EQ(a.segmentBytes, static_cast<size_t>(k.at("host_segment_bytes"))) << "it " << i;
      ASSERT_EQ(a.activeStreams, k.at("net_streams")) << "it " << i;
      if (L.decidedG[i]) {  // before G's first decision the engine chunk is its default rule
        ASSERT_EQ(a.engineChunkBytes, static_cast<size_t>(k.at("net_chunk_bytes"))) << "it " << i;
      }
      segments.insert(a.segmentBytes);
    }
    // C starts from what G left in force and then owns the knobs.
    EXPECT_EQ(L.startC, L.finalG) << "rank " << r;
    ASSERT_FALSE(L.liveC.empty());
    for (size_t j = 0; j < L.liveC.size(); ++j) {
      const auto& k = L.knobsC[j];
      ASSERT_EQ(L.liveC[j].segmentBytes, static_cast<size_t>(k.at("host_segment_bytes")));
      ASSERT_EQ(L.liveC[j].activeStreams, k.at("net_streams"));
      ASSERT_EQ(L.liveC[j].engineChunkBytes, static_cast<size_t>(k.at("net_chunk_bytes")));
    }
  }
  EXPECT_GE(segments.size(), 2u) << "G should have switched the segment size";
}

// Ranks that keep different knobs (here rank 1 drops host_segment_bytes, held on that rank by
// another owner) would decide divergently: every rank's create() fails with the same
// FailedPrecondition naming the model, the rank and both lists, within the wait time.
TEST(TransportKnobs, RanksKeepingDifferentKnobsAllFailCreate) {
  constexpr int kWorld = 3;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::string> errors(kWorld);
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        core::ProcessGroupOptions po = groupOptions(r, kWorld);
        po.hostTransport = core::HostTransport::kSocket;
        auto pg = core::ProcessGroup::create(store, po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model m("", 5);
        auto algo = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        const std::string res0 = hostGroupResource(**pg, "host_segment_bytes");
        const uint64_t other = KnobOwners::newOwnerId();
        if (r == 1 && KnobOwners::process().claim(res0, other, "other").has_value()) {
          return "could not plant the other owner";
        }
        AutotuneOptions o = fastOptions(3);
        o.model = "gen";
        o.waitTimeout = 5000ms;
        o.knobs = transportKnobs(**pg);
        const auto t0 = std::chrono::steady_clock::now();
        auto tuner = Autotuner::create(**ddp, *algo, o);
        const auto took = std::chrono::steady_clock::now() - t0;
        const auto holder = KnobOwners::process().holder(res0);
        KnobOwners::process().releaseAll(other);
        if (tuner.isOk()) {
          return "create() succeeded although rank 1 keeps other knobs";
        }
        if (took > 10s) {
          return "create() took too long to fail";
        }
        if (r != 1 && holder.has_value()) {
          return "a failed create() left its claim behind";
        }
        errors[r] = tuner.status().toString();
        return tuner.status().code() == StatusCode::kFailedPrecondition
                   ? ""
                   : "expected FailedPrecondition: " + errors[r];
      },
      60s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(errors[r].find("model gen"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 1 tunes knobs []"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 0 tunes [host_segment_bytes]"), std::string::npos) << errors[r];
  }
}

}  // namespace
}  // namespace bagua::autotune
