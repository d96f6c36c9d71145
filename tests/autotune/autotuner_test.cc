// The in-training tuner over the host backend, ranks as threads over loopback: ranks always
// agree on the switch iterations and on every layout (compared iteration by iteration), the
// reduced gradients stay exact under every layout (a rank-, step- and index-dependent pattern),
// the tuned layouts follow the observed gradient-ready order, the hierarchical knob switches on
// every rank together; the saved setting round-trips through the file and a later run starts
// from it; two reducers in one process tune independently; algorithms without buckets are
// skipped; a bad saved file is an error.
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

TEST(Autotuner, RanksAgreeOnEverySwitchAndGradientsStayExact) {
  constexpr int kWorld = 4;
  constexpr int kSteps = 80;
  constexpr int kSamples = 8;
  const std::string logPath = tempPath("bagua_autotune_log");
  std::remove(logPath.c_str());
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<RankLog> logs(kWorld);
  std::vector<std::string> learned(kWorld);
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        // Two "nodes" of two ranks, so the hierarchical knob really changes the path.
        auto pg = core::ProcessGroup::create(store, groupOptions(r, kWorld, 2));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model m("", 13);
        auto inner = std::make_shared<TunableAllReduce>(false);
        auto algo = std::make_shared<Tunable>(inner);
        core::DdpOptions dopt;
        dopt.bucketCapMb = 0.5;
        auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg, dopt);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        AutotuneOptions o = fastOptions(kSamples);
        o.knobs.push_back(inner->knob());
        if (r == 0) {
          o.logFile = logPath;
        }
        auto tuner = Autotuner::create(**ddp, *algo, o);
        if (!tuner.isOk()) {
          return tuner.status().toString();
        }
        for (int i = 0; i < kSteps; ++i) {
          std::string e = trainStep(**ddp, m, r, kWorld);
          if (!e.empty()) {
            return e;
          }
          logs[r].layouts.push_back((*ddp)->bucketLayout());
          logs[r].hierarchical.push_back(inner->hierarchical());
          Status s = (*tuner)->onIterationEnd();
          if (!s.isOk()) {
            return s.toString();
          }
        }
        logs[r].switches = (*tuner)->switchSteps();
        logs[r].trials = (*tuner)->trials();
        logs[r].tuning = (*tuner)->tuning();
        for (int t : m.readyOrder) {
          learned[r] += m.params[t].name + " ";
        }
        return "";
      },
      120s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  const RankLog& r0 = logs[0];
  EXPECT_FALSE(r0.tuning) << "tuning should have finished within " << kSteps << " iterations";
  EXPECT_EQ(static_cast<int>(r0.trials.size()), kSamples);
  // Paired measurement: every candidate after the first trial is followed by the reference,
  // then the final switch.
  EXPECT_EQ(static_cast<int>(r0.switches.size()), 2 * (kSamples - 1) + 1);
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(logs[r].switches, r0.switches) << "rank " << r << " switched at other iterations";
    EXPECT_EQ(logs[r].layouts, r0.layouts) << "rank " << r << " used another layout";
    EXPECT_EQ(logs[r].hierarchical, r0.hierarchical) << "rank " << r << " hierarchical differs";
    EXPECT_TRUE(logs[r].trials.empty()) << "only rank 0 records trials";
  }
  // A layout changes only at a switch iteration (iteration i is trainStep i + 1).
  for (size_t i = 1; i < r0.layouts.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    const bool isSwitch =
        std::find(r0.switches.begin(), r0.switches.end(), step) != r0.switches.end();
    // (Iteration 2 is the reducer's own one-time rebuild from the ready order.)
    if (r0.layouts[i] != r0.layouts[i - 1] && step != 2) {
      EXPECT_TRUE(isSwitch) << "layout changed at iteration " << step << " without a switch";
    }
  }
  // Tuned layouts follow the observed gradient-ready order (rank 0's, sent to everyone).
  const auto& last = r0.layouts.back();
  std::string order;
  for (const auto& b : last) {
    for (const auto& n : b) {
      order += n + " ";
    }
  }
  EXPECT_EQ(order, learned[0]);
  // Every trial was logged as one CSV line after the header.
  std::ifstream in(logPath);
  std::string line;
  int lines = 0;
  std::getline(in, line);
  EXPECT_EQ(line,
            "model,trial,train_iter,bucket_bytes,buckets,hierarchical,score_iters_per_s,"
            "window_s");
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_EQ(line.rfind("model,", 0), 0u) << line;
  }
  EXPECT_EQ(lines, kSamples);
  std::remove(logPath.c_str());
}

TEST(Autotuner, SettingFileRoundTrips) {
  Setting s;
  s.bucketBytes = 123456;
  s.buckets = {{"fc2.bias", "fc2.weight"}, {"fc1.weight"}, {"fc0.bias", "fc0.weight", "x"}};
  s.knobs = {{"hierarchical", 1}, {"streams", 6}};
  s.score = 98.765;
  const std::string path = tempPath("bagua_autotune_setting");
  ASSERT_TRUE(saveSetting(path, "m", s).isOk());
  auto back = loadSetting(path);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back->bucketBytes, s.bucketBytes);
  EXPECT_EQ(back->buckets, s.buckets);
  EXPECT_EQ(back->knobs, s.knobs);
  EXPECT_DOUBLE_EQ(back->score, s.score);
  {
    std::ofstream bad(path);
    bad << "bucket_bytes=12\nwhat=1\nbucket=a\n";
  }
  EXPECT_FALSE(loadSetting(path).isOk());
  std::remove(path.c_str());
  EXPECT_FALSE(loadSetting(path).isOk()) << "a missing file is an error";
}

TEST(Autotuner, PartitionClosesAtSizeAndAtDtypeChange) {
  std::vector<core::TensorRef> t;
  for (int i = 0; i < 6; ++i) {
    t.push_back({"t" + std::to_string(i), i, 100, i == 3 ? DataType::kF64 : DataType::kF32, {}});
  }
  // 400-byte f32 tensors, one 800-byte f64 tensor; order reversed; 800-byte buckets.
  std::vector<int> order = {5, 4, 3, 2, 1, 0};
  auto parts = partitionBySize(t, order, 800);
  std::vector<std::vector<int>> want = {{5, 4}, {3}, {2, 1}, {0}};
  EXPECT_EQ(parts, want);
  EXPECT_EQ(partitionBySize(t, {0, 1, 2}, 1), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
}

// Runs `steps` iterations of a 2-rank job; returns the per-rank logs.
std::string twoRankRun(int steps, const std::function<AutotuneOptions(int)>& options,
                       std::vector<RankLog>* logs) {
  auto store = std::make_shared<core::InMemoryStore>();
  logs->assign(2, {});
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, groupOptions(r, 2));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model m("", 9);
        auto algo = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        auto tuner = Autotuner::create(**ddp, *algo, options(r));
        if (!tuner.isOk()) {
          return tuner.status().toString();
        }
        for (int i = 0; i < steps; ++i) {
          std::string e = trainStep(**ddp, m, r, 2);
          if (!e.empty()) {
            return e;
          }
          (*logs)[r].layouts.push_back((*ddp)->bucketLayout());
          Status s = (*tuner)->onIterationEnd();
          if (!s.isOk()) {
            return s.toString();
          }
        }
        (*logs)[r].switches = (*tuner)->switchSteps();
        (*logs)[r].tuning = (*tuner)->tuning();
        return "";
      },
      60s);
  return bagua::testing::joinFailures(res);
}

TEST(Autotuner, ALaterRunStartsFromTheSavedSetting) {
  const std::string path = tempPath("bagua_autotune_best");
  std::remove(path.c_str());
  std::vector<RankLog> first;
  ASSERT_EQ(twoRankRun(
                40,
                [&](int r) {
                  AutotuneOptions o = fastOptions(5);
                  o.saveFile = r == 0 ? path : "";
                  return o;
                },
                &first),
            "");
  EXPECT_FALSE(first[0].tuning);
  auto saved = loadSetting(path);
  ASSERT_TRUE(saved.isOk()) << saved.status().toString();
  // The run ended on the saved layout.
  EXPECT_EQ(first[0].layouts.back(), saved->buckets);

  // Second run: tuning off, start from the file. Every rank uses the saved layout from the
  // first iteration on (rank 1 never reads the file: rank 0 sends it).
  std::vector<RankLog> second;
  ASSERT_EQ(twoRankRun(
                3,
                [&](int r) {
                  AutotuneOptions o = fastOptions(5);
                  o.enabled = false;
                  o.loadFile = r == 0 ? path : "/nonexistent/only/rank0/reads/it";
                  return o;
                },
                &second),
            "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(second[r].switches, (std::vector<int64_t>{1}));
    for (const auto& layout : second[r].layouts) {
      EXPECT_EQ(layout, saved->buckets) << "rank " << r;
    }
  }
  // A file for another model is refused with a clear error.
  Setting other = *saved;
  other.buckets.back().push_back("not_a_tensor");
  ASSERT_TRUE(saveSetting(path, "other", other).isOk());
  std::vector<RankLog> third;
  const std::string err = twoRankRun(
      1,
      [&](int r) {
        AutotuneOptions o = fastOptions(5);
        o.loadFile = r == 0 ? path : "";
        o.waitTimeout = 2000ms;
        return o;
      },
      &third);
  EXPECT_NE(err.find("does not match"), std::string::npos) << err;
  std::remove(path.c_str());
}

TEST(Autotuner, TwoReducersInOneProcessTuneIndependently) {
  constexpr int kSteps = 60;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<std::array<RankLog, 2>> logs(2);
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, groupOptions(r, 2));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model a("a.", 7), b("b.", 11);
        auto algoA = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto algoB = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddpA = core::withBagua(a.params, a.buffers, {}, algoA, **pg);
        auto ddpB = core::withBagua(b.params, b.buffers, {}, algoB, **pg);
        if (!ddpA.isOk() || !ddpB.isOk()) {
          return "reducer creation failed";
        }
        AutotuneOptions oa = fastOptions(4), ob = fastOptions(6);
        oa.model = "encoder";
        oa.pairedReference = false;  // one trial per window: the unpaired mode is covered too
        ob.model = "decoder";
        ob.checkInterval = 3;
        auto ta = Autotuner::create(**ddpA, *algoA, oa);
        auto tb = Autotuner::create(**ddpB, *algoB, ob);
        if (!ta.isOk() || !tb.isOk()) {
          return "tuner creation failed";
        }
        for (int i = 0; i < kSteps; ++i) {
          for (int k = 0; k < 2; ++k) {
            DistributedDataParallel& d = k == 0 ? **ddpA : **ddpB;
            Autotuner& t = k == 0 ? **ta : **tb;
            std::string e = trainStep(d, k == 0 ? a : b, r, 2);
            if (!e.empty()) {
              return e;
            }
            logs[r][k].layouts.push_back(d.bucketLayout());
            Status s = t.onIterationEnd();
            if (!s.isOk()) {
              return s.toString();
            }
          }
        }
        for (int k = 0; k < 2; ++k) {
          Autotuner& t = k == 0 ? **ta : **tb;
          logs[r][k].switches = t.switchSteps();
          logs[r][k].trials = t.trials();
          logs[r][k].tuning = t.tuning();
        }
        return "";
      },
      60s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_EQ(logs[0][0].trials.size(), 4u);
  EXPECT_EQ(logs[0][0].switches.size(), 4u) << "unpaired: one switch per trial after the first, "
                                               "plus the final one";
  EXPECT_EQ(logs[0][1].trials.size(), 6u);
  EXPECT_EQ(logs[0][1].switches.size(), 11u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_FALSE(logs[0][k].tuning);
    EXPECT_EQ(logs[1][k].switches, logs[0][k].switches);
    EXPECT_EQ(logs[1][k].layouts, logs[0][k].layouts);
  }
  EXPECT_NE(logs[0][0].switches, logs[0][1].switches) << "different cadences, different switches";
  EXPECT_EQ(logs[0][0].layouts.back()[0][0].rfind("a.", 0), 0u);
  EXPECT_EQ(logs[0][1].layouts.back()[0][0].rfind("b.", 0), 0u);
}

// Like decentralized and low-precision decentralized (algorithms/): the weights are exchanged in
// hooks and no gradient is communicated, so the reducer has no tensors and no buckets. (The test
// does not link algorithms/ itself, to keep the autotune suite independent of it.)
class NoBuckets final : public core::Algorithm {
 public:
  std::string name() const override { return "decentralized_like"; }
  Result<std::unique_ptr<core::AlgorithmImpl>> reify(core::ProcessGroup&) override {
    struct Impl final : core::AlgorithmImpl {
      std::vector<core::TensorRef> initTensors(DistributedDataParallel&) override { return {}; }
      Status runBucket(core::Bucket&, core::ProcessGroup&) override { return Status::ok(); }
    };
    return std::unique_ptr<core::AlgorithmImpl>(new Impl);
  }
};

TEST(Autotuner, AlgorithmsWithoutBucketsAreSkipped) {
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<int> skipped(2, 0);
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, groupOptions(r, 2));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model m("", 5);
        auto algo = std::make_shared<Tunable>(std::make_shared<NoBuckets>());
        auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        auto tuner = Autotuner::create(**ddp, *algo, fastOptions(4));
        if (!tuner.isOk()) {
          return tuner.status().toString();
        }
        skipped[r] = (*tuner)->skipped() ? 1 : 0;
        for (int i = 0; i < 4; ++i) {
          Status s = (*ddp)->prepareForward();
          for (int t = 0; t < 5 && s.isOk(); ++t) {
            s = (*ddp)->markGradReady(t);
          }
          if (s.isOk()) {
            s = (*ddp)->finishBackward();
          }
          if (s.isOk()) {
            s = (*ddp)->step();
          }
          if (s.isOk()) {
            s = (*tuner)->onIterationEnd();
          }
          if (!s.isOk()) {
            return s.toString();
          }
        }
        if ((*tuner)->tuning() || !(*tuner)->switchSteps().empty()) {
          return "a skipped tuner switched layouts";
        }
        return "";
      },
      60s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_EQ(skipped, (std::vector<int>{1, 1}));
}

TEST(Autotuner, ARankThatNeverReportsIsADeadlineNotAHang) {
  auto store = std::make_shared<core::InMemoryStore>();
  std::string rank0Error;
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        auto pg = core::ProcessGroup::create(store, groupOptions(r, 2));
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Model m("", 4);
        auto algo = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
        auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        AutotuneOptions o = fastOptions(3);
        o.checkInterval = 1;
        o.waitTimeout = 500ms;
        auto tuner = Autotuner::create(**ddp, *algo, o);
        if (!tuner.isOk()) {
          return tuner.status().toString();
        }
        std::string e = trainStep(**ddp, m, r, 2);
        if (!e.empty()) {
          return e;
        }
        if (r == 1) {
          return "";  // never reports
        }
        const auto t0 = std::chrono::steady_clock::now();
        Status s = (*tuner)->onIterationEnd();
        if (std::chrono::steady_clock::now() - t0 > 10s) {
          return "the wait was not bounded";
        }
        rank0Error = s.toString();
        return s.code() == StatusCode::kDeadlineExceeded ? ""
                                                         : "expected a deadline: " + rank0Error;
      },
      60s);
  ASSERT_EQ(bagua::testing::joinFailures(res), "");
  EXPECT_NE(rank0Error.find("throughput reports"), std::string::npos) << rank0Error;
}

TEST(Autotuner, DisabledTunerDoesNothing) {
  std::vector<RankLog> logs;
  ASSERT_EQ(twoRankRun(
                6,
                [](int) {
                  AutotuneOptions o = fastOptions(3);
                  o.enabled = false;
                  return o;
                },
                &logs),
            "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(logs[r].switches.empty());
    EXPECT_FALSE(logs[r].tuning);
  }
}

TEST(Autotuner, RejectsBadOptions) {
  auto store = std::make_shared<core::InMemoryStore>();
  auto pg = core::ProcessGroup::create(store, groupOptions(0, 1));
  ASSERT_TRUE(pg.isOk());
  Model m("", 3);
  auto algo = std::make_shared<Tunable>(std::make_shared<core::GradientAllReduce>());
  auto ddp = core::withBagua(m.params, m.buffers, {}, algo, **pg);
  ASSERT_TRUE(ddp.isOk());
  AutotuneOptions o = fastOptions(3);
  o.model = "a/b";
  EXPECT_FALSE(Autotuner::create(**ddp, *algo, o).isOk());
  o = fastOptions(0);
  EXPECT_FALSE(Autotuner::create(**ddp, *algo, o).isOk());
  o = fastOptions(3);
  Knob k;
  k.dimension = Dimension::integer("streams", 1, 8);
  k.initial = 9;
  k.apply = [](int64_t) { return Status::ok(); };
  o.knobs.push_back(k);
  EXPECT_FALSE(Autotuner::create(**ddp, *algo, o).isOk());
}

}  // namespace
}  // namespace bagua::autotune
