// The reducer overlapping communication with the backward pass: buckets started without waiting
// for earlier ones (AlgorithmImpl::launchBucket) and their failure in time, and stepping inside
// the backward pass (BucketStepper): each bucket stepped once, as it is reduced, on the reduced
// gradients, to the same bits as stepping after backward, in copy mode, at gradient homes, with
// bucket views and with unused parameters; a stepper that declines is left to step().
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "bagua/core/bucket_assignment.h"
#include "bagua/core/ddp.h"
#include "example_mlp.h"
#include "multi_rank.h"
#include "reducer_runs.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using namespace reducertest;

// ---- Buckets started without waiting (AlgorithmImpl::launchBucket) --------------------------

// A Work the test finishes by hand.
class HeldWork final : public Work {
 public:
  bool test() override { return done_.load(); }
  Status wait(std::chrono::milliseconds timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done_.load()) {
      if (std::chrono::steady_clock::now() >= until) {
        return BAGUA_ERROR(kDeadlineExceeded, "held");
      }
      std::this_thread::sleep_for(1ms);
    }
    return Status::ok();
  }
  Status status() override { return done_.load() ? Status::ok() : BAGUA_ERROR(kInternal, "held"); }
  void finish() { done_.store(true); }

 private:
  std::atomic<bool> done_{false};
};

// Every bucket's "collective" is a HeldWork; the test sees which were started.
class HeldAlgorithm final : public Algorithm {
 public:
  std::string name() const override { return "held"; }
  Result<std::unique_ptr<AlgorithmImpl>> reify(ProcessGroup& /*group*/) override {
    return std::unique_ptr<AlgorithmImpl>(new Impl(this));
  }
  std::vector<std::shared_ptr<HeldWork>> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return works_;
  }

 private:
  class Impl final : public AlgorithmImpl {
   public:
    explicit Impl(HeldAlgorithm* owner) : owner_(owner) {}
    Status runBucket(Bucket& /*b*/, ProcessGroup& /*g*/) override {
      return BAGUA_ERROR(kInternal, "runBucket called for a launchable bucket");
    }
    Result<WorkPtr> launchBucket(Bucket& /*b*/, ProcessGroup& /*g*/) override {
      auto w = std::make_shared<HeldWork>();
      std::lock_guard<std::mutex> lock(owner_->mu_);
      owner_->works_.push_back(w);
      return WorkPtr(w);
    }

   private:
    HeldAlgorithm* owner_;
  };
  std::mutex mu_;
  std::vector<std::shared_ptr<HeldWork>> works_;
};

struct HeldModel {
  std::vector<std::vector<float>> mem;
  std::vector<Parameter> params;
  std::vector<Parameter> buffers;
  explicit HeldModel(int n) : mem(static_cast<size_t>(n), std::vector<float>(2048, 1.0f)) {
    for (int i = 0; i < n; ++i) {
      Parameter p;
      p.name = "p" + std::to_string(i);
      p.numel = 1024;
      p.data = mem[static_cast<size_t>(i)].data();
      p.grad = mem[static_cast<size_t>(i)].data() + 1024;
      params.push_back(p);
    }
  }
};

TEST(Ddp, LaunchableBucketsStartWithoutWaitingForEarlierOnes) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  HeldModel m(4);
  auto algo = std::make_shared<HeldAlgorithm>();
  DdpOptions o;
  o.firstBucketBytes = 4096;  // one 4 KiB parameter per bucket
  o.bucketCapMb = 4096.0 / (1 << 20);
  o.rebuildBuckets = false;
  auto ddp = withBagua(m.params, m.buffers, {}, algo, *pg, o);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  ASSERT_EQ((*ddp)->buckets().size(), 4u);
  ASSERT_TRUE((*ddp)->prepareForward().isOk());
  for (int i = 3; i >= 0; --i) {
    ASSERT_TRUE((*ddp)->markGradReady(i).isOk());
  }
  // All four are started although none has finished.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (algo->started().size() < 4 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  auto works = algo->started();
  ASSERT_EQ(works.size(), 4u) << "a bucket waited for an earlier bucket's collective";
  std::thread finisher([&] {
    std::this_thread::sleep_for(20ms);
    for (auto& w : works) {
      w->finish();
    }
  });
  EXPECT_TRUE((*ddp)->finishBackward().isOk());
  finisher.join();
  const DdpStats st = (*ddp)->stats();
  EXPECT_EQ(st.buckets, 4);
  EXPECT_EQ(st.iterations, 1);
}

TEST(Ddp, ALaunchedBucketThatNeverFinishesFailsFinishBackwardInTime) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  HeldModel m(2);
  auto algo = std::make_shared<HeldAlgorithm>();
  DdpOptions o;
  o.rebuildBuckets = false;
  o.timeout = 300ms;
  auto ddp = withBagua(m.params, m.buffers, {}, algo, *pg, o);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  ASSERT_TRUE((*ddp)->prepareForward().isOk());
  ASSERT_TRUE((*ddp)->markGradReady(1).isOk());
  ASSERT_TRUE((*ddp)->markGradReady(0).isOk());
  const auto t0 = std::chrono::steady_clock::now();
  Status s = (*ddp)->finishBackward();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.toString();
  EXPECT_LT(waited, 10s);
  for (auto& w : algo->started()) {
    w->finish();  // let the reducer's destructor find nothing in flight
  }
}

// ---- Stepping inside the backward pass -----------------------------------------------------

struct InBackwardCase {
  const char* name;
  bool bucketView;
  Homes homes;
  bool unused;  // an aux head some ranks skip, with findUnusedParameters
};

void PrintTo(const InBackwardCase& c, std::ostream* os) {
  *os << c.name;
}

class DdpStepInBackward : public ::testing::TestWithParam<InBackwardCase> {};

TEST_P(DdpStepInBackward, EachBucketIsSteppedOnceAsItIsReducedToTheSameBits) {
  const InBackwardCase& c = GetParam();
  RunSpec spec;
  spec.world = 3;
  spec.steps = 6;
  spec.optimizer = Stepper::kBucketSgd;
  spec.homes = c.homes;
  spec.ddp.gradientAsBucketView = c.bucketView;
  spec.ddp.firstBucketBytes = 256;  // several buckets
  spec.ddp.bucketCapMb = 1024.0 / (1 << 20);
  if (c.unused) {
    spec.aux = true;
    spec.ddp.findUnusedParameters = true;
    spec.useAux = [](int rank, int step) { return (rank + step) % 2 == 0; };
  }
  RunSpec after = spec;
  after.ddp.stepInBackward = false;
  std::vector<RankResult> in, ref;
  ASSERT_EQ(ddpRun(spec, &in), "");
  ASSERT_EQ(ddpRun(after, &ref), "");
  for (size_t r = 0; r < in.size(); ++r) {
    ASSERT_EQ(in[r].weights.size(), ref[0].weights.size());
    EXPECT_EQ(std::memcmp(in[r].weights.data(), ref[0].weights.data(), ref[0].weights.size() * 4),
              0)
        << "rank " << r << ": stepping inside backward differs from stepping after it";
    ASSERT_GT(in[r].buckets, 2u);
    // Every backward stepped every bucket of its layout once, in bucket order (host buckets
    // complete in order; the layout changes once, at the rebuild in ready order), and the
    // reducer counted them.
    ASSERT_EQ(in[r].stepped.size(), static_cast<size_t>(spec.steps));
    int64_t total = 0;
    for (const std::vector<int>& one : in[r].stepped) {
      ASSERT_GT(one.size(), 2u);
      for (size_t b = 0; b < one.size(); ++b) {
        EXPECT_EQ(one[b], static_cast<int>(b)) << "rank " << r;
      }
      total += static_cast<int64_t>(one.size());
    }
    EXPECT_EQ(in[r].stepped.back().size(), in[r].buckets) << "rank " << r;
    EXPECT_EQ(in[r].stats.bucketsStepped, total) << "rank " << r;
    EXPECT_TRUE(ref[r].stepped.empty());
    EXPECT_EQ(ref[r].stats.bucketsStepped, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DdpStepInBackward,
    ::testing::Values(InBackwardCase{"copy", false, Homes::kNone, false},
                      InBackwardCase{"bucket_view", true, Homes::kNone, false},
                      InBackwardCase{"at_homes", false, Homes::kGradsAtHomes, false},
                      InBackwardCase{"homes_elsewhere", false, Homes::kGradsElsewhere, false},
                      InBackwardCase{"unused_copy", false, Homes::kNone, true}),
    [](const ::testing::TestParamInfo<InBackwardCase>& p) { return p.param.name; });

TEST(Ddp, AStepperThatDeclinesStepsAfterBackward) {
  RunSpec spec;
  spec.world = 2;
  spec.steps = 3;
  spec.optimizer = Stepper::kDeclining;
  RunSpec plain = spec;
  plain.optimizer = Stepper::kBucketSgd;
  plain.ddp.stepInBackward = false;
  std::vector<RankResult> got, ref;
  ASSERT_EQ(ddpRun(spec, &got), "");
  ASSERT_EQ(ddpRun(plain, &ref), "");
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_TRUE(got[r].stepped.empty());
    EXPECT_EQ(got[r].stats.bucketsStepped, 0);
    ASSERT_EQ(got[r].weights.size(), ref[0].weights.size());
    EXPECT_EQ(std::memcmp(got[r].weights.data(), ref[0].weights.data(), ref[0].weights.size() * 4),
              0);
  }
}

TEST(Ddp, ReducedBucketCallsOutsideABackwardOrOutOfRangeAreRefused) {
  auto pg = oneRankGroup();
  ASSERT_NE(pg, nullptr);
  Mlp m(modelConfig(3));
  Sgd opt(m.parameters(), 0.05f);
  auto ddp =
      withBagua(m.parameters(), m.buffers(), {&opt}, std::make_shared<GradientAllReduce>(), *pg);
  ASSERT_TRUE(ddp.isOk()) << ddp.status().toString();
  EXPECT_EQ((*ddp)->bucketsReduced(), 0);
  Status s = (*ddp)->waitBucketReduced(0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.toString();
  ASSERT_TRUE((*ddp)->prepareForward().isOk());
  std::vector<float> x;
  std::vector<int32_t> y;
  makeBatch(0, 0, kPerRank, &x, &y);
  m.forward(x.data(), y.data(), kPerRank);
  Status ready;
  m.backward([&](int p) {
    if (ready.isOk()) {
      ready = (*ddp)->markGradReady(p);
    }
  });
  ASSERT_TRUE(ready.isOk()) << ready.toString();
  s = (*ddp)->waitBucketReduced(99);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_TRUE((*ddp)->waitBucketReduced(0).isOk());
  s = (*ddp)->copyBucketOutOn(0, nullptr);  // a host bucket: waitBucketReduced copied it back
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_GE((*ddp)->bucketsReduced(), 1);
  EXPECT_TRUE((*ddp)->finishBackward().isOk());
}

}  // namespace
}  // namespace bagua::core
