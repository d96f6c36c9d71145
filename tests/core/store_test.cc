// Stores and rendezvous: in-memory and TCP stores behave the same; timeouts are bounded;
// rendezvous catches duplicate ranks, wrong world sizes and missing ranks.
#include <gtest/gtest.h>

#include <thread>

#include "bagua/core/params.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "multi_rank.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

enum class Kind { kMemory, kTcp };

class StoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kMemory) {
      store_ = std::make_shared<InMemoryStore>();
      return;
    }
    auto server = TcpStoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(server.isOk()) << server.status().toString();
    server_ = std::move(*server);
    store_ = connectClient();
    ASSERT_NE(store_, nullptr);
  }
  std::shared_ptr<Store> connectClient() {
    if (GetParam() == Kind::kMemory) {
      return store_;
    }
    TcpStoreOptions o;
    o.port = server_->port();
    o.connectTimeout = 5000ms;
    auto c = TcpStore::connect(o);
    EXPECT_TRUE(c.isOk()) << c.status().toString();
    return c.isOk() ? std::shared_ptr<Store>(std::move(*c)) : nullptr;
  }

  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreTest, SetGetAddCompareSet) {
  ASSERT_TRUE(store_->set("a", toBytes("hello")).isOk());
  auto v = store_->get("a", 1000ms);
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(toString(*v), "hello");
  Bytes empty;
  ASSERT_TRUE(store_->set("e", empty).isOk());
  EXPECT_TRUE(store_->get("e", 100ms)->empty());

  EXPECT_EQ(*store_->add("n", 5), 5);
  EXPECT_EQ(*store_->add("n", -2), 3);
  EXPECT_FALSE(store_->add("a", 1).isOk()) << "a holds text, not a counter";

  EXPECT_EQ(toString(*store_->compareSet("c", {}, toBytes("x"))), "x");  // absent == empty
  EXPECT_EQ(toString(*store_->compareSet("c", toBytes("y"), toBytes("z"))), "x");
  EXPECT_EQ(toString(*store_->compareSet("c", toBytes("x"), toBytes("z"))), "z");
  EXPECT_TRUE(*store_->check("c"));
  EXPECT_FALSE(*store_->check("nope"));
}

TEST_P(StoreTest, GetTimesOutWithinBoundNamingTheKey) {
  auto t0 = Clock::now();
  auto v = store_->get("missing-key", 200ms);
  auto dt = Clock::now() - t0;
  ASSERT_FALSE(v.isOk());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("missing-key"), std::string::npos) << v.status().message();
  EXPECT_GE(dt, 190ms);
  EXPECT_LT(dt, 3s);
}

TEST_P(StoreTest, WaitWakesWhenAnotherClientSets) {
  auto other = connectClient();
  ASSERT_NE(other, nullptr);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(other->set("k1", toBytes("1")).isOk());
    EXPECT_TRUE(other->add("k2", 7).isOk());
  });
  auto t0 = Clock::now();
  Status s = store_->wait({"k1", "k2"}, 5000ms);
  EXPECT_TRUE(s.isOk()) << s.toString();
  EXPECT_LT(Clock::now() - t0, 4s);
  setter.join();
  EXPECT_EQ(toString(*store_->get("k2", 10ms)), "7");
}

TEST_P(StoreTest, PrefixStoreIsolatesKeys) {
  PrefixStore a("a", store_);
  PrefixStore b("b", store_);
  ASSERT_TRUE(a.set("k", toBytes("from a")).isOk());
  EXPECT_FALSE(*b.check("k"));
  EXPECT_EQ(toString(*store_->get("a/k", 10ms)), "from a");
}

TEST_P(StoreTest, RendezvousDetectsDuplicateRank) {
  ASSERT_TRUE(store_->compareSet("rdzv/world_size", {}, toBytes("2")).isOk());
  ASSERT_TRUE(store_->set("rdzv/rank/1", toBytes("someone-else")).isOk());
  Status s = rendezvous(*store_, 1, 2, 500ms);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.toString();
  EXPECT_NE(s.message().find("rank 1 is already taken"), std::string::npos) << s.message();
}

TEST_P(StoreTest, RendezvousDetectsWrongWorldSize) {
  ASSERT_TRUE(store_->compareSet("rdzv/world_size", {}, toBytes("4")).isOk());
  Status s = rendezvous(*store_, 1, 3, 500ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_NE(s.message().find("WORLD_SIZE=3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("WORLD_SIZE=4"), std::string::npos) << s.message();
}

TEST_P(StoreTest, RendezvousNamesMissingRanksWithinTimeout) {
  auto t0 = Clock::now();
  Status s = rendezvous(*store_, 0, 3, 300ms);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.toString();
  EXPECT_NE(s.message().find("ranks [1,2]"), std::string::npos) << s.message();
}

TEST_P(StoreTest, RendezvousSucceedsWithAllRanks) {
  auto res = bagua::testing::runRanks(
      4,
      [&](int r) -> std::string {
        auto client = connectClient();
        Status s = rendezvous(*client, r, 4, 5000ms);
        return s.isOk() ? "" : s.toString();
      },
      20s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Kinds, StoreTest, ::testing::Values(Kind::kMemory, Kind::kTcp),
                         [](const auto& p) { return p.param == Kind::kMemory ? "Memory" : "Tcp"; });

TEST(TcpStore, UnreachableMasterFailsWithinConnectTimeout) {
  TcpStoreOptions o;
  o.port = bagua::testing::freeLoopbackPort();
  o.connectTimeout = 400ms;
  auto t0 = Clock::now();
  auto c = TcpStore::connect(o);
  auto dt = Clock::now() - t0;
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find(std::to_string(o.port)), std::string::npos)
      << c.status().message();
  EXPECT_LT(dt, 3s);
}

TEST(TcpStore, ServerStopTurnsIntoAnErrorNotAHang) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.isOk());
  TcpStoreOptions o;
  o.port = (*server)->port();
  auto c = TcpStore::connect(o);
  ASSERT_TRUE(c.isOk());
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    (*server)->stop();
  });
  auto t0 = Clock::now();
  auto v = (*c)->get("never", 30000ms);
  EXPECT_FALSE(v.isOk());
  EXPECT_LT(Clock::now() - t0, 5s);
  stopper.join();
}

TEST(EnvInit, ReadsTorchrunVariablesThroughTheCatalogue) {
  ScopedEnvForTesting env(coreParams(), {{"MASTER_ADDR", "10.1.2.3"},
                                         {"MASTER_PORT", "1234"},
                                         {"RANK", "5"},
                                         {"WORLD_SIZE", "8"},
                                         {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "4"}});
  auto e = readEnvInit();
  ASSERT_TRUE(e.isOk()) << e.status().toString();
  EXPECT_EQ(e->masterAddr, "10.1.2.3");
  EXPECT_EQ(e->masterPort, 1234);
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->worldSize, 8);
  EXPECT_EQ(e->localRank, 1);
  EXPECT_EQ(e->localWorldSize, 4);
}

TEST(EnvInit, RejectsBadValues) {
  {
    ScopedEnvForTesting env(coreParams(), {{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    auto e = readEnvInit();
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("RANK=4"), std::string::npos) << e.status().message();
  }
  {
    ScopedEnvForTesting env(coreParams(), {{"WORLD_SIZE", "four"}});
    auto e = readEnvInit();
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("WORLD_SIZE"), std::string::npos) << e.status().message();
  }
}

TEST(EnvInit, FourRanksOverTcpStoreHostedByRankZero) {
  // Ranks are threads here, so env:// is exercised through its parts: a server on a free port,
  // TCP clients, and ProcessGroup::create with hierarchical sub-groups (2 nodes x 2).
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.isOk());
  int port = (*server)->port();
  auto res = bagua::testing::runRanks(
      4,
      [&](int r) -> std::string {
        TcpStoreOptions o;
        o.port = port;
        auto c = TcpStore::connect(o);
        if (!c.isOk()) {
          return c.status().toString();
        }
        ProcessGroupOptions po;
        po.rank = r;
        po.worldSize = 4;
        po.localWorldSize = 2;
        po.rendezvousTimeout = 10000ms;
        po.collectiveTimeout = 10000ms;
        auto pg = ProcessGroup::create(std::shared_ptr<Store>(std::move(*c)), po);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        ProcessGroup& g = **pg;
        if (g.localRank() != r % 2 || g.nodeRank() != r / 2) {
          return "bad local/node rank";
        }
        if (g.intraNode()->size() != 2 || g.interNode()->size() != 2 ||
            g.intraNode()->rank() != r % 2 || g.interNode()->rank() != r / 2) {
          return "bad sub-group layout";
        }
        // Global sum, intra-node sum, inter-node sum of the rank number.
        int32_t v[3] = {r, r, r};
        Status s =
            g.global().allReduce(&v[0], &v[0], 1, DataType::kI32, ReduceOp::kSum)->wait(10000ms);
        if (s.isOk()) {
          s = g.intraNode()
                  ->allReduce(&v[1], &v[1], 1, DataType::kI32, ReduceOp::kSum)
                  ->wait(10000ms);
        }
        if (s.isOk()) {
          s = g.interNode()
                  ->allReduce(&v[2], &v[2], 1, DataType::kI32, ReduceOp::kSum)
                  ->wait(10000ms);
        }
        if (!s.isOk()) {
          return s.toString();
        }
        const int node = r / 2;
        const int local = r % 2;
        if (v[0] != 6 || v[1] != 4 * node + 1 || v[2] != 2 + 2 * local) {
          return strPrintf("sums %d %d %d", v[0], v[1], v[2]);
        }
        return "";
      },
      60s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

}  // namespace
}  // namespace bagua::core
