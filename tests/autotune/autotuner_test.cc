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

#include "bagua/autotune/autotuner.h"
#include "bagua/autotune/transport_knobs.h"
#include "bagua/core/host_tuning.h"
#include "multi_rank.h"

namespace bagua::autotune {
namespace {

using namespace std::chrono_literals;
using core::DataType;
using core::DistributedDataParallel;
using core::Parameter;

// A synthetic model: tensors of assorted sizes whose gradients become ready in a fixed order
// that differs from registration order (so a learned order is visible in the layouts).
struct Model {
  std::vector<std::vector<float>> data, grad;
  std::vector<Parameter> params, buffers;
  std::vector<int> readyOrder;

  // `scale` multiplies every tensor's size (large enough and the engine transport chunks).
  Model(const std::string& prefix, int n, size_t scale = 1) {
    data.resize(n);
    grad.resize(n);
    for (int i = 0; i < n; ++i) {
      const size_t numel = (64 + static_cast<size_t>((i * 37) % 11) * 96) * scale;
      data[i].assign(numel, 0.0f);
      grad[i].assign(numel, 0.0f);
    }
    for (int i = 0; i < n; ++i) {
      Parameter p;
      p.name = prefix + "p" + std::to_string(i);
      p.data = data[i].data();
      p.grad = grad[i].data();
      p.numel = data[i].size();
      params.push_back(p);
      readyOrder.push_back((i * 5 + 3) % n);  // a permutation when gcd(5, n) == 1
    }
  }
  size_t bytes() const {
    size_t b = 0;
    for (const auto& g : grad) {
      b += g.size() * 4;
    }
    return b;
  }
};

// Gradient value that averages exactly: mean over 4 ranks of (rank + c) is 1.5 + c.
float gradValue(int rank, int64_t step, int tensor, size_t k) {
  return static_cast<float>(rank + 4 * static_cast<int>(k % 7) + tensor + static_cast<int>(step));
}

// One training iteration; checks the reduced gradients against the closed form.
std::string trainStep(DistributedDataParallel& d, Model& m, int rank, int world) {
  Status s = d.prepareForward();
  if (!s.isOk()) {
    return s.toString();
  }
  const int64_t step = d.trainStep();
  for (int t : m.readyOrder) {
    for (size_t k = 0; k < m.grad[t].size(); ++k) {
      m.grad[t][k] = gradValue(rank, step, t, k);
    }
    s = d.markGradReady(t);
    if (!s.isOk()) {
      return s.toString();
    }
  }
  s = d.finishBackward();
  if (!s.isOk()) {
    return s.toString();
  }
  const float rankMean = static_cast<float>(world - 1) / 2.0f;
  for (size_t t = 0; t < m.grad.size(); ++t) {
    for (size_t k = 0; k < m.grad[t].size(); ++k) {
      const float want = gradValue(0, step, static_cast<int>(t), k) + rankMean;
      if (m.grad[t][k] != want) {
        return strPrintf("step %lld: tensor %zu element %zu is %g, want %g",
                         static_cast<long long>(step), t, k, m.grad[t][k], want);
      }
    }
  }
  return "";
}

core::ProcessGroupOptions groupOptions(int rank, int world, int localWorld = -1) {
  core::ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = world;
  po.localWorldSize = localWorld;
  po.hierarchical = localWorld > 0;
  po.rendezvousTimeout = 20000ms;
  po.collectiveTimeout = 30000ms;
  return po;
}

AutotuneOptions fastOptions(int samples) {
  AutotuneOptions o;
  o.enabled = true;
  o.maxSamples = samples;
  o.warmupTimeS = 0.0;
  o.samplingConfidenceTimeS = 0.0;
  o.checkInterval = 2;
  o.seed = 5;
  o.logFile = "";
  o.saveFile = "";
  o.loadFile = "";
  o.waitTimeout = 20000ms;
  o.minBucketBytes = 256;
  return o;
}

struct RankLog {
  std::vector<std::vector<std::vector<std::string>>> layouts;  // per iteration
  std::vector<bool> hierarchical;                              // per iteration
  std::vector<int64_t> switches;
  std::vector<Trial> trials;
  bool tuning = true;
  bool skipped = false;
};

std::string tempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "_" + std::to_string(::getpid()) + ".txt"))
      .string();
}

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

}  // namespace
}  // namespace bagua::autotune
