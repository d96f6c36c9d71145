// The in-training tuner over the host backend, ranks as threads over loopback: ranks always
// agree on the switch iterations and on every layout (compared iteration by iteration), the
// reduced gradients stay exact under every layout (a rank-, step- and index-dependent pattern),
// the tuned layouts follow the observed gradient-ready order, the hierarchical knob switches on
// every rank together; the saved setting round-trips through the file and a later run starts
// from it; two reducers in one process tune independently; algorithms without buckets are
// skipped; a bad saved file is an error. Shared transport knobs: one owner per resource
// (KnobOwners), a second tuner on the same group drops them, the owner's decisions are what is
// in force, a later tuner takes them over; ranks that keep different knobs all fail create().
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
#include "bagua/autotune/knob_owners.h"
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
