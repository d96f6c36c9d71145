// The core checkpoint (bagua/core/checkpoint.h): sections round-trip, commits are atomic, damage
// and mismatches are errors that name what is wrong and leave the model untouched, and a 2-rank
// data-parallel run killed mid-run and resumed from its checkpoints (a new group, a model
// initialised differently) ends bit for bit where the uninterrupted run ends, with gradient
// all-reduce and with low-precision decentralized exchanging every 3rd step (the reducer's
// schedule in the checkpoint: its step counter and the replicas); the prefetching
// loader (loader/) resumes at the position saved in a checkpoint, reading each remaining batch
// of the epoch once.
#include "bagua/core/checkpoint.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "bagua/algorithms/algorithms.h"
#include "bagua/core/ddp.h"
#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/data_loader.h"
#include "bagua/loader/sampler.h"
#include "example_mlp.h"
#include "multi_rank.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using example::Mlp;
using example::MlpConfig;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("bagua_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

Parameter tensor(const std::string& name, std::vector<float>& v) {
  Parameter p;
  p.name = name;
  p.data = v.data();
  p.numel = v.size();
  return p;
}

TEST_F(CheckpointTest, SectionsRoundTrip) {
  std::vector<float> a{1.5f, -2.25f, 3.0f};
  std::vector<float> b(1000);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<float>(i) * 0.37f - 11.0f;
  }
  std::vector<int64_t> c{-7, 1LL << 40};
  Parameter pc;
  pc.name = "c";
  pc.data = c.data();
  pc.numel = c.size();
  pc.dtype = DataType::kI64;
  std::mt19937_64 rng(42);
  rng.discard(1234);
  CheckpointWriter w;
  ASSERT_TRUE(w.addTensors("model", {tensor("a", a), tensor("b", b), pc}).isOk());
  w.addBytes("blob", toBytes("hello"));
  w.addRng("rng", rng);
  w.addInt("step", 77);
  ASSERT_TRUE(w.commit(path("x.bgck")).isOk());

  std::vector<float> a2(3), b2(1000);
  std::vector<int64_t> c2(2);
  Parameter pc2 = pc;
  pc2.data = c2.data();
  auto r = CheckpointReader::open(path("x.bgck"));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_TRUE(r->restoreTensors("model", {tensor("b", b2), pc2, tensor("a", a2)}).isOk());
  EXPECT_EQ(a, a2);
  EXPECT_EQ(b, b2);
  EXPECT_EQ(c, c2);
  EXPECT_EQ(toString(*r->bytes("blob")), "hello");
  EXPECT_EQ(*r->integer("step"), 77);
  std::mt19937_64 rng2;
  ASSERT_TRUE(r->restoreRng("rng", &rng2).isOk());
  EXPECT_EQ(rng2(), rng());  // the stream continues where it was saved
  EXPECT_EQ((std::vector<std::string>{"blob", "model", "rng", "step"}), r->sections());
}

TEST_F(CheckpointTest, CommitReplacesAtomicallyAndLeavesNoTemporaries) {
  CheckpointWriter w;
  w.addInt("step", 1);
  ASSERT_TRUE(w.commit(path("c.bgck")).isOk());
  w.addInt("step", 2);
  ASSERT_TRUE(w.commit(path("c.bgck")).isOk());
  EXPECT_EQ(*CheckpointReader::open(path("c.bgck"))->integer("step"), 2);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  // A directory that does not exist: an error naming the file, nothing written.
  Status s = w.commit(path("missing/c.bgck"));
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("missing/c.bgck"), std::string::npos) << s.toString();
}

TEST_F(CheckpointTest, DamageIsAnErrorNamingTheSection) {
  std::vector<float> a(64, 1.0f);
  CheckpointWriter w;
  ASSERT_TRUE(w.addTensors("model", {tensor("a", a)}).isOk());
  w.addInt("step", 3);
  ASSERT_TRUE(w.commit(path("d.bgck")).isOk());
  std::string bytes;
  {
    std::ifstream f(path("d.bgck"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  // One flipped bit in the middle of the tensor data.
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  std::ofstream(path("flip.bgck"), std::ios::binary) << flipped;
  auto r = CheckpointReader::open(path("flip.bgck"));
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("section 'model' fails its CRC"), std::string::npos)
      << r.status().toString();
  // Cut short.
  std::ofstream(path("cut.bgck"), std::ios::binary) << bytes.substr(0, bytes.size() - 5);
  r = CheckpointReader::open(path("cut.bgck"));
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().toString();
  // Not a checkpoint; and no file at all.
  std::ofstream(path("junk.bgck")) << "not a checkpoint at all";
  EXPECT_NE(CheckpointReader::open(path("junk.bgck")).status().message().find("bad magic"),
            std::string::npos);
  EXPECT_EQ(CheckpointReader::open(path("none.bgck")).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, MismatchesAreRefusedAndTheModelIsUntouched) {
  std::vector<float> a(8, 2.0f), b(4, 3.0f);
  CheckpointWriter w;
  ASSERT_TRUE(w.addTensors("model", {tensor("a", a), tensor("b", b)}).isOk());
  ASSERT_TRUE(w.commit(path("m.bgck")).isOk());
  auto r = CheckpointReader::open(path("m.bgck"));
  ASSERT_TRUE(r.isOk());
  std::vector<float> a2(8, 0.0f), b2(5, 0.0f);
  Status s = r->restoreTensors("model", {tensor("a", a2), tensor("b", b2)});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("tensor 'b'"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("4 x f32"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("5 x f32"), std::string::npos) << s.toString();
  EXPECT_EQ(a2, std::vector<float>(8, 0.0f)) << "a failed restore wrote into the model";
  // A tensor the file lacks, a tensor the list lacks, a section the file lacks.
  std::vector<float> c(8);
  EXPECT_NE(r->restoreTensors("model", {tensor("a", a2), tensor("b", b), tensor("c", c)})
                .message()
                .find("no tensor 'c'"),
            std::string::npos);
  EXPECT_NE(r->restoreTensors("model", {tensor("a", a2)}).message().find("tensor 'b'"),
            std::string::npos);
  Status missing = r->restoreTensors("optimizer", {});
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("it has: model"), std::string::npos) << missing.toString();
  // Device memory is refused with the tensor's name.
  Parameter dev = tensor("gpu", a);
  dev.device = {DeviceType::kCuda, 1};
  EXPECT_NE(w.addTensors("model", {dev}).message().find("'gpu' is on cuda:1"), std::string::npos);
}

// ---- Exact resume ------------------------------------------------------------------------------

constexpr int kWorld = 2;
constexpr int kSteps = 12;
constexpr int kKillAfter = 5;
constexpr int kBatch = 8;

struct Trainer {
  Mlp model;
  Sgd opt;
  std::mt19937_64 rng;  // draws this rank's batches: its state is part of the checkpoint
  int step = 0;
  std::string resumeFrom;  // a checkpoint to restore after the wrap (a resumed trainer)
  Trainer(uint64_t initSeed, uint64_t dataSeed)
      : model(MlpConfig{{16, 32, 32, 4}, false, initSeed}),
        opt(model.parameters(), 0.05f, 0.9f),
        rng(dataSeed) {}
};

void drawBatch(std::mt19937_64& rng, std::vector<float>* x, std::vector<int32_t>* y) {
  x->resize(kBatch * 16);
  y->resize(kBatch);
  for (auto& v : *x) {
    v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
  }
  for (auto& v : *y) {
    v = static_cast<int32_t>(rng() % 4);
  }
}

// Runs steps [t.step, until) on a fresh group of kWorld ranks; returns per-rank errors.
// `save` writes rank r's checkpoint after the step `saveAt` (if >= 0).
using AlgorithmFactory = std::function<std::shared_ptr<Algorithm>()>;

std::string train(std::vector<std::unique_ptr<Trainer>>& ts, int until, int saveAt,
                  const std::function<std::string(int)>& ckptPath,
                  const AlgorithmFactory& algorithm) {
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      kWorld,
      [&](int r) -> std::string {
        ProcessGroupOptions po;
        po.rank = r;
        po.worldSize = kWorld;
        po.rendezvousTimeout = 20000ms;
        po.collectiveTimeout = 30000ms;
        auto pg = ProcessGroup::create(store, po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Trainer& t = *ts[r];
        auto ddp =
            withBagua(t.model.parameters(), t.model.buffers(), {&t.opt}, algorithm(), **pg, {});
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        if (!t.resumeFrom.empty()) {
          // After the wrap, which broadcasts rank 0's state: each rank's own model, optimizer,
          // RNG and the reducer's schedule (per-rank with a decentralized algorithm).
          auto reader = CheckpointReader::open(t.resumeFrom);
          if (!reader.isOk()) {
            return reader.status().toString();
          }
          Status s = reader->restoreTensors("model", t.model.parameters());
          s = s.isOk() ? reader->restoreTensors("buffers", t.model.buffers()) : s;
          s = s.isOk() ? reader->restoreTensors("optimizer", t.opt.stateTensors()) : s;
          s = s.isOk() ? reader->restoreRng("rng", &t.rng) : s;
          auto step = reader->integer("step");
          auto schedule = reader->bytes("schedule");
          if (!s.isOk() || !step.isOk() || !schedule.isOk()) {
            return s.isOk() ? "step or schedule section missing" : s.toString();
          }
          t.step = static_cast<int>(*step);
          s = (*ddp)->restoreSchedule(*schedule);
          if (!s.isOk()) {
            return s.toString();
          }
          t.resumeFrom.clear();
        }
        std::vector<float> x;
        std::vector<int32_t> y;
        for (; t.step < until; ++t.step) {
          t.opt.zeroGrad();
          Status s = (*ddp)->prepareForward();
          if (!s.isOk()) {
            return s.toString();
          }
          drawBatch(t.rng, &x, &y);
          t.model.forward(x.data(), y.data(), kBatch);
          Status ready;
          t.model.backward([&](int p) {
            if (ready.isOk()) {
              ready = (*ddp)->markGradReady(p);
            }
          });
          s = ready.isOk() ? (*ddp)->finishBackward() : ready;
          s = s.isOk() ? (*ddp)->step() : s;
          if (!s.isOk()) {
            return s.toString();
          }
          if (t.step + 1 == saveAt) {
            CheckpointWriter w;
            s = w.addTensors("model", t.model.parameters());
            s = s.isOk() ? w.addTensors("buffers", t.model.buffers()) : s;
            s = s.isOk() ? w.addTensors("optimizer", t.opt.stateTensors()) : s;
            w.addRng("rng", t.rng);
            w.addInt("step", t.step + 1);
            auto schedule = (*ddp)->saveSchedule();
            if (!schedule.isOk()) {
              return schedule.status().toString();
            }
            w.addBytes("schedule", *schedule);
            s = s.isOk() ? w.commit(ckptPath(r)) : s;
            if (!s.isOk()) {
              return s.toString();
            }
          }
        }
        return "";
      },
      120s);
  return bagua::testing::joinFailures(res);
}

std::vector<float> weights(Mlp& m) {
  std::vector<float> out;
  for (const Parameter& p : m.parameters()) {
    const auto* d = static_cast<const float*>(p.data);
    out.insert(out.end(), d, d + p.numel);
  }
  return out;
}

class ResumeTest : public CheckpointTest, public ::testing::WithParamInterface<std::string> {};

AlgorithmFactory factoryFor(const std::string& name) {
  if (name == "low_precision_decentralized") {
    return [] { return std::make_shared<algo::LowPrecisionDecentralized>(false, 3); };
  }
  return [] { return std::make_shared<GradientAllReduce>(false); };
}

TEST_P(ResumeTest, KilledAndResumedRunEndsBitForBitWhereTheUninterruptedOneEnds) {
  const AlgorithmFactory algorithm = factoryFor(GetParam());
  auto ckpt = [&](int r) { return path("rank" + std::to_string(r) + ".bgck"); };
  std::vector<std::unique_ptr<Trainer>> straight;
  for (int r = 0; r < kWorld; ++r) {
    straight.push_back(std::make_unique<Trainer>(7, 100 + r));
  }
  ASSERT_EQ(train(straight, kSteps, -1, ckpt, algorithm), "");

  // Run 2: dies after step kKillAfter + 2 (the checkpoint is from kKillAfter: two steps lost).
  std::vector<std::unique_ptr<Trainer>> first;
  for (int r = 0; r < kWorld; ++r) {
    first.push_back(std::make_unique<Trainer>(7, 100 + r));
  }
  ASSERT_EQ(train(first, kKillAfter + 2, kKillAfter, ckpt, algorithm), "");
  first.clear();

  // Restart: new trainers (other initial weights, other data seed), restored from the files
  // after the wrap.
  std::vector<std::unique_ptr<Trainer>> resumed;
  for (int r = 0; r < kWorld; ++r) {
    resumed.push_back(std::make_unique<Trainer>(99, 5));
    resumed.back()->resumeFrom = ckpt(r);
  }
  ASSERT_EQ(train(resumed, kSteps, -1, ckpt, algorithm), "");
  EXPECT_EQ(resumed[0]->step, kSteps);
  for (int r = 0; r < kWorld; ++r) {
    std::vector<float> want = weights(straight[r]->model);
    std::vector<float> got = weights(resumed[r]->model);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "rank " << r << ": resumed weights differ from the uninterrupted run";
  }
  // And the run did train: the weights moved from their initial values.
  Trainer fresh(7, 100);
  EXPECT_NE(weights(fresh.model), weights(straight[0]->model));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ResumeTest,
                         ::testing::Values("gradient_allreduce", "low_precision_decentralized"));

// restoreSchedule refuses what it cannot honour: damaged bytes, another algorithm's state, a
// reducer that has already run; counterOnly takes the step counter alone.
TEST_F(CheckpointTest, ARestoredScheduleIsCheckedAndOnlyBeforeTheFirstForward) {
  auto store = std::make_shared<InMemoryStore>();
  ProcessGroupOptions po;
  po.rendezvousTimeout = 20000ms;
  auto pg = ProcessGroup::create(store, po);
  ASSERT_TRUE(pg.isOk()) << pg.status().toString();
  Trainer t(7, 1);
  auto lpd = withBagua(t.model.parameters(), t.model.buffers(), {&t.opt},
                       std::make_shared<algo::LowPrecisionDecentralized>(false, 3), **pg, {});
  ASSERT_TRUE(lpd.isOk()) << lpd.status().toString();
  std::vector<float> x;
  std::vector<int32_t> y;
  ASSERT_TRUE((*lpd)->prepareForward().isOk());
  drawBatch(t.rng, &x, &y);
  t.model.forward(x.data(), y.data(), kBatch);
  t.model.backward([&](int p) { ASSERT_TRUE((*lpd)->markGradReady(p).isOk()); });
  ASSERT_TRUE((*lpd)->finishBackward().isOk());
  ASSERT_TRUE((*lpd)->step().isOk());
  auto saved = (*lpd)->saveSchedule();
  ASSERT_TRUE(saved.isOk()) << saved.status().toString();
  EXPECT_GT(saved->size(), 24u) << "the replicas are part of the schedule";
  EXPECT_EQ((*lpd)->restoreSchedule(*saved).code(), StatusCode::kFailedPrecondition);
  lpd->reset();

  auto gar = withBagua(t.model.parameters(), t.model.buffers(), {&t.opt},
                       std::make_shared<GradientAllReduce>(false), **pg, {});
  ASSERT_TRUE(gar.isOk()) << gar.status().toString();
  Status other = (*gar)->restoreSchedule(*saved);
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.toString().find("another algorithm"), std::string::npos) << other.toString();
  std::vector<uint8_t> cut(saved->begin(), saved->end() - 1);
  EXPECT_NE((*gar)->restoreSchedule(cut).toString().find("damaged"), std::string::npos);
  std::vector<uint8_t> junk(30, 7);
  EXPECT_NE((*gar)->restoreSchedule(junk).toString().find("not a reducer schedule"),
            std::string::npos);
  ASSERT_TRUE((*gar)->restoreSchedule(*saved, /*counterOnly=*/true).isOk());
  EXPECT_EQ((*gar)->trainStep(), 1);
}

// ---- The prefetching loader's data position ---------------------------------------------------

TEST_F(CheckpointTest, LoaderResumesAtItsSavedPositionReadingEachRemainingBatchOnce) {
  using namespace bagua::loader;
  std::vector<Sample> samples;
  for (int i = 0; i < 103; ++i) {
    samples.push_back(Sample(4, static_cast<uint8_t>(i)));
  }
  VectorDataset ds(samples);
  SamplerOptions so;
  so.numReplicas = 2;
  so.rank = 1;
  so.seed = 5;
  auto sampler = DistributedSampler::create(ds.size(), so);
  ASSERT_TRUE(sampler.isOk());
  auto plan = FixedSizeBatchPlan::create(**sampler, 4, false);
  ASSERT_TRUE(plan.isOk());
  LoaderOptions lo;
  lo.numWorkers = 2;
  lo.prefetchBatches = 4;  // several batches read ahead of the consumer when it checkpoints
  lo.progress = false;
  auto read = [&](DataLoader& l, size_t n) {
    std::vector<std::vector<size_t>> out;
    for (size_t k = 0; k < n; ++k) {
      auto b = l.next();
      EXPECT_TRUE(b.isOk());
      if (!b.isOk() || !b->has_value()) {
        break;
      }
      out.push_back((*b)->indices);
    }
    return out;
  };
  std::vector<std::vector<size_t>> whole;
  {
    auto l = DataLoader::create(ds, **plan, concatCollate(), lo);
    ASSERT_TRUE(l.isOk());
    ASSERT_TRUE((*l)->startEpoch(3).isOk());
    whole = read(**l, 1000);
  }
  ASSERT_EQ(whole.size(), 13u);  // ceil(103 / 2) = 52 samples, batches of 4
  {
    auto l = DataLoader::create(ds, **plan, concatCollate(), lo);
    ASSERT_TRUE(l.isOk());
    ASSERT_TRUE((*l)->startEpoch(3).isOk());
    auto first = read(**l, 5);
    std::this_thread::sleep_for(50ms);  // let the workers prefetch past the consumer
    LoaderPosition pos = (*l)->position();
    EXPECT_EQ(pos.epoch, 3u);
    EXPECT_EQ(pos.batchesConsumed, 5u);
    CheckpointWriter w;
    w.addInt("data.epoch", static_cast<int64_t>(pos.epoch));
    w.addInt("data.batches", static_cast<int64_t>(pos.batchesConsumed));
    ASSERT_TRUE(w.commit(path("data.bgck")).isOk());
    EXPECT_EQ(first, std::vector<std::vector<size_t>>(whole.begin(), whole.begin() + 5));
  }
  auto r = CheckpointReader::open(path("data.bgck"));
  ASSERT_TRUE(r.isOk());
  auto l = DataLoader::create(ds, **plan, concatCollate(), lo);
  ASSERT_TRUE(l.isOk());
  ASSERT_TRUE((*l)->startEpoch(static_cast<uint64_t>(*r->integer("data.epoch")),
                               static_cast<size_t>(*r->integer("data.batches")))
                  .isOk());
  EXPECT_EQ(read(**l, 1000), std::vector<std::vector<size_t>>(whole.begin() + 5, whole.end()));
  Status past = (*l)->startEpoch(3, 14);
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("has 13 batches"), std::string::npos) << past.toString();
}

}  // namespace
}  // namespace bagua::core
