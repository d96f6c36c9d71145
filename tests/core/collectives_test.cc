// Every host collective x dtype x world size (1, 2, 3, 4, 8) x element count (0, 1, odd,
// multi-MiB), ranks as threads over loopback TCP. Inputs depend on rank and index so any
// misplaced element shows; every output element is checked against its closed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/core/process_group.h"
#include "multi_rank.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;

enum class Coll {
  kAllReduceSum,
  kAllReduceAvg,
  kAllReduceMin,
  kAllReduceMax,
  kAllReduceProduct,
  kReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kSendRecv,
  kBarrier,
};

const char* collName(Coll c) {
  switch (c) {
  case Coll::kAllReduceSum:
    return "AllReduceSum";
  case Coll::kAllReduceAvg:
    return "AllReduceAvg";
  case Coll::kAllReduceMin:
    return "AllReduceMin";
  case Coll::kAllReduceMax:
    return "AllReduceMax";
  case Coll::kAllReduceProduct:
    return "AllReduceProduct";
  case Coll::kReduce:
    return "Reduce";
  case Coll::kReduceScatter:
    return "ReduceScatter";
  case Coll::kAllGather:
    return "AllGather";
  case Coll::kBroadcast:
    return "Broadcast";
  case Coll::kAllToAll:
    return "AllToAll";
  case Coll::kSendRecv:
    return "SendRecv";
  case Coll::kBarrier:
    return "Barrier";
  }
  return "?";
}

bool isSigned(DataType t) {
  return t != DataType::kU8;
}
bool isFloat(DataType t) {
  return t == DataType::kF32 || t == DataType::kF64 || t == DataType::kF16 || t == DataType::kBF16;
}

// Integer-valued inputs, exact in every dtype and in every sum of up to 8 ranks. value() repeats
// every 17 elements and productValue() every 4, so inputs and reductions repeat every kPeriod.
constexpr size_t kPeriod = 68;
double value(int rank, size_t i, DataType t) {
  double v = static_cast<double>((i * 7 + static_cast<size_t>(rank) * 13) % 17);
  return isSigned(t) ? v - 8 : v;
}
// Products stay exact: factors are 1 or 2 (and -1 for signed types).
double productValue(int rank, size_t i, DataType t) {
  size_t k = (i + static_cast<size_t>(rank) * 5) % 4;
  if (k == 3 && isSigned(t)) {
    return -1;
  }
  return k == 0 ? 2 : 1;
}

void put(uint8_t* p, DataType t, size_t i, double v) {
  switch (t) {
  case DataType::kF32:
    reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
    break;
  case DataType::kF64:
    reinterpret_cast<double*>(p)[i] = v;
    break;
  case DataType::kF16:
    reinterpret_cast<uint16_t*>(p)[i] = floatToHalf(static_cast<float>(v));
    break;
  case DataType::kBF16:
    reinterpret_cast<uint16_t*>(p)[i] = floatToBf16(static_cast<float>(v));
    break;
  case DataType::kI32:
    reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
    break;
  case DataType::kI64:
    reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
    break;
  case DataType::kU8:
    reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
    break;
  }
}

double get(const uint8_t* p, DataType t, size_t i) {
  switch (t) {
  case DataType::kF32:
    return reinterpret_cast<const float*>(p)[i];
  case DataType::kF64:
    return reinterpret_cast<const double*>(p)[i];
  case DataType::kF16:
    return halfToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
  case DataType::kBF16:
    return bf16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
  case DataType::kI32:
    return reinterpret_cast<const int32_t*>(p)[i];
  case DataType::kI64:
    return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  case DataType::kU8:
    return p[i];
  }
  return 0;
}

bool close(double got, double want, DataType t) {
  if (!isFloat(t)) {
    return got == want;
  }
  double tol = (t == DataType::kF16 || t == DataType::kBF16) ? 1e-2
               : t == DataType::kF32                         ? 1e-6
                                                             : 1e-12;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// Closed-form expectation of reducing element i over ranks.
double reduced(Coll c, int n, size_t i, DataType t) {
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    double v = c == Coll::kAllReduceProduct ? productValue(r, i, t) : value(r, i, t);
    if (r == 0) {
      acc = v;
      continue;
    }
    switch (c) {
    case Coll::kAllReduceMin:
      acc = std::min(acc, v);
      break;
    case Coll::kAllReduceMax:
      acc = std::max(acc, v);
      break;
    case Coll::kAllReduceProduct:
      acc *= v;
      break;
    default:
      acc += v;
    }
  }
  if (c == Coll::kAllReduceProduct && t == DataType::kU8) {
    acc = static_cast<double>(static_cast<uint64_t>(acc) & 0xff);
  }
  if (c == Coll::kAllReduceAvg) {
    acc = isFloat(t) ? acc / n : std::trunc(acc / n);
  }
  return acc;
}

ReduceOp opOf(Coll c) {
  switch (c) {
  case Coll::kAllReduceAvg:
    return ReduceOp::kAvg;
  case Coll::kAllReduceMin:
    return ReduceOp::kMin;
  case Coll::kAllReduceMax:
    return ReduceOp::kMax;
  case Coll::kAllReduceProduct:
    return ReduceOp::kProduct;
  default:
    return ReduceOp::kSum;
  }
}

// Runs one collective on one rank and checks its output. Returns "" or the first mismatch.
std::string runOne(Communicator& comm, Coll c, DataType t, size_t count) {
  const int n = comm.size();
  const int r = comm.rank();
  const size_t es = dataTypeSize(t);
  const bool blocky = c == Coll::kReduceScatter || c == Coll::kAllToAll;
  const size_t inCount = blocky ? count * n : count;
  const size_t outCount = (c == Coll::kAllGather || c == Coll::kAllToAll) ? count * n : count;
  std::vector<uint8_t> in(inCount * es + 1), out(outCount * es + 1, 0xEE);
  // One period of this rank's input, then copies of it (doubling: the copied length stays a
  // multiple of the period).
  const size_t first = std::min(inCount, kPeriod);
  for (size_t i = 0; i < first; ++i) {
    put(in.data(), t, i, c == Coll::kAllReduceProduct ? productValue(r, i, t) : value(r, i, t));
  }
  for (size_t have = first; have < inCount;) {
    const size_t more = std::min(have, inCount - have);
    std::memcpy(in.data() + have * es, in.data(), more * es);
    have += more;
  }
  WorkPtr w;
  const int root = (n - 1) / 2;
  switch (c) {
  case Coll::kAllReduceSum:  // in place
    out = in;
    w = comm.allReduce(out.data(), out.data(), count, t, ReduceOp::kSum);
    break;
  case Coll::kAllReduceAvg:
  case Coll::kAllReduceMin:
  case Coll::kAllReduceMax:
  case Coll::kAllReduceProduct:
    w = comm.allReduce(in.data(), out.data(), count, t, opOf(c));
    break;
  case Coll::kReduce:
    w = comm.reduce(in.data(), out.data(), count, t, ReduceOp::kSum, root);
    break;
  case Coll::kReduceScatter:
    w = comm.reduceScatter(in.data(), out.data(), count, t, ReduceOp::kSum);
    break;
  case Coll::kAllGather:
    w = comm.allGather(in.data(), out.data(), count, t);
    break;
  case Coll::kBroadcast:
    out = in;
    w = comm.broadcast(out.data(), count, t, root);
    break;
  case Coll::kAllToAll:
    w = comm.allToAll(in.data(), out.data(), count, t);
    break;
  case Coll::kSendRecv:
    w = comm.sendRecv(in.data(), count, (r + 1) % n, out.data(), count, (r - 1 + n) % n, t);
    break;
  case Coll::kBarrier:
    w = comm.barrier();
    break;
  }
  Status s = w->wait(60000ms);
  if (!s.isOk()) {
    return s.toString();
  }
  if (!w->test() || !w->status().isOk()) {
    return "work not complete after a successful wait";
  }
  // The reductions' closed forms over one period (they repeat as the inputs do).
  std::array<double, kPeriod> reducedOf{};
  for (size_t j = 0; j < kPeriod; ++j) {
    reducedOf[j] = reduced(c == Coll::kReduceScatter ? Coll::kAllReduceSum : c, n, j, t);
  }
  auto expect = [&](size_t i) -> double {
    switch (c) {
    case Coll::kReduce:
    case Coll::kAllReduceSum:
    case Coll::kAllReduceAvg:
    case Coll::kAllReduceMin:
    case Coll::kAllReduceMax:
    case Coll::kAllReduceProduct:
      return reducedOf[i % kPeriod];
    case Coll::kReduceScatter:
      return reducedOf[(static_cast<size_t>(r) * count + i) % kPeriod];
    case Coll::kAllGather:
      return value(static_cast<int>(i / count), i % count, t);
    case Coll::kBroadcast:
      return value(root, i, t);
    case Coll::kAllToAll:
      return value(static_cast<int>(i / count), static_cast<size_t>(r) * count + i % count, t);
    case Coll::kSendRecv:
      return value((r - 1 + n) % n, i, t);
    case Coll::kBarrier:
      return 0;
    }
    return 0;
  };
  if (c == Coll::kBarrier || (c == Coll::kReduce && r != root)) {
    return "";
  }
  for (size_t i = 0; i < outCount; ++i) {
    double got = get(out.data(), t, i);
    double want = expect(i);
    if (!close(got, want, t)) {
      return strPrintf("%s %s count %zu: element %zu is %g, expected %g", collName(c),
                       dataTypeName(t), count, i, got, want);
    }
  }
  if (out[outCount * es] != 0xEE && c != Coll::kAllReduceSum && c != Coll::kBroadcast) {
    return strPrintf("%s %s count %zu: wrote past the end of the output", collName(c),
                     dataTypeName(t), count);
  }
  return "";
}

// What the host backend runs over: shared-memory rings (ranks of one process are on one host),
// the Bagua-Net engine (what ranks on different hosts use), our own TCP mesh.
enum class Via { kShm, kEngine, kSocketTcp };

void setTransport(ProcessGroupOptions& o, Via via) {
  o.hostSharedMemory = via == Via::kShm;
  o.hostTransport = via == Via::kEngine ? HostTransport::kEngine : HostTransport::kSocket;
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, Coll, Via>> {};

TEST_P(Collectives, EveryDtypeAndSizeMatchesClosedForm) {
  const int world = std::get<0>(GetParam());
  const Coll coll = std::get<1>(GetParam());
  const Via via = std::get<2>(GetParam());
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = world;
        o.hierarchical = false;
        o.rendezvousTimeout = 20000ms;
        o.collectiveTimeout = 60000ms;
        setTransport(o, via);
        auto pg = ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        Communicator& comm = (*pg)->global();
        for (int ti = 0; ti < kNumDataTypes; ++ti) {
          const auto t = static_cast<DataType>(ti);
          const size_t es = dataTypeSize(t);
          const bool blocky =
              coll == Coll::kReduceScatter || coll == Coll::kAllToAll || coll == Coll::kAllGather;
          // Multi-MiB in total (per rank buffer), odd element count.
          size_t big = (size_t{3} << 20) / es / (blocky ? world : 1) + 3;
          for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, big}) {
            std::string err = runOne(comm, coll, t, count);
            if (!err.empty()) {
              return err;
            }
          }
        }
        return "";
      },
      120s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

const auto kAllCollectives = ::testing::Values(
    Coll::kAllReduceSum, Coll::kAllReduceAvg, Coll::kAllReduceMin, Coll::kAllReduceMax,
    Coll::kAllReduceProduct, Coll::kReduce, Coll::kReduceScatter, Coll::kAllGather,
    Coll::kBroadcast, Coll::kAllToAll, Coll::kSendRecv, Coll::kBarrier);

std::string caseName(const ::testing::TestParamInfo<std::tuple<int, Coll, Via>>& p) {
  return std::string(collName(std::get<1>(p.param))) + "_World" +
         std::to_string(std::get<0>(p.param));
}

// Ranks of one process are on one host: the shared-memory path, every world size.
INSTANTIATE_TEST_SUITE_P(HostBackendShm, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8), kAllCollectives,
                                            ::testing::Values(Via::kShm)),
                         caseName);
// The Bagua-Net engine (what ranks on different hosts use), every world size above 1.
INSTANTIATE_TEST_SUITE_P(HostBackendEngine, Collectives,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8), kAllCollectives,
                                            ::testing::Values(Via::kEngine)),
                         caseName);
// Our own TCP mesh (HostTransport::kSocket; it also carries the shm path's wake-ups).
INSTANTIATE_TEST_SUITE_P(HostBackendSocketTcp, Collectives,
                         ::testing::Combine(::testing::Values(3), kAllCollectives,
                                            ::testing::Values(Via::kSocketTcp)),
                         caseName);

}  // namespace
}  // namespace bagua::core

namespace bagua::core {
namespace {

class HostFailures : public ::testing::TestWithParam<Via> {};

TEST_P(HostFailures, RankThatDiesYieldsErrorsOnOthersNotAHang) {
  auto store = std::make_shared<InMemoryStore>();
  const int world = 3;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = world;
        o.hierarchical = false;
        o.rendezvousTimeout = 10000ms;
        o.collectiveTimeout = 20000ms;
        setTransport(o, GetParam());
        auto pg = ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        std::vector<float> v(1 << 20, 1.0f);
        Status s = (*pg)
                       ->global()
                       .allReduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum)
                       ->wait(20000ms);
        if (!s.isOk()) {
          return "first allreduce: " + s.toString();
        }
        if (r == 1) {
          pg->reset();  // "dies": closes every connection
          return "";
        }
        auto t0 = std::chrono::steady_clock::now();
        s = (*pg)
                ->global()
                .allReduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum)
                ->wait(30000ms);
        auto dt = std::chrono::steady_clock::now() - t0;
        if (s.isOk()) {
          return "allreduce with a dead peer succeeded";
        }
        if (s.code() == StatusCode::kDeadlineExceeded && dt >= 15s) {
          return "hung until the deadline: " + s.toString();
        }
        // The communicator is now broken: the next operation fails at once, naming the cause.
        Status next = (*pg)->global().barrier()->wait(5000ms);
        if (next.isOk() || next.message().find("failed earlier") == std::string::npos) {
          return "second op after failure: " + next.toString();
        }
        return "";
      },
      60s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

TEST_P(HostFailures, AbortUnblocksAPendingCollective) {
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = 2;
        o.hierarchical = false;
        o.rendezvousTimeout = 10000ms;
        o.collectiveTimeout = 60000ms;
        setTransport(o, GetParam());
        auto pg = ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        if (r == 1) {
          std::this_thread::sleep_for(1500ms);  // never joins the collective before the abort
          return "";
        }
        int32_t x = 1;
        WorkPtr w = (*pg)->global().allReduce(&x, &x, 1, DataType::kI32, ReduceOp::kSum);
        std::this_thread::sleep_for(200ms);
        if (w->test()) {
          return "completed without the peer";
        }
        (*pg)->abort("test abort");
        Status s = w->wait(5000ms);
        if (s.code() != StatusCode::kAborted) {
          return "expected Aborted, got " + s.toString();
        }
        return "";
      },
      30s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Transports, HostFailures,
                         ::testing::Values(Via::kShm, Via::kEngine, Via::kSocketTcp),
                         [](const ::testing::TestParamInfo<Via>& p) {
                           return std::string(p.param == Via::kShm      ? "Shm"
                                              : p.param == Via::kEngine ? "Engine"
                                                                        : "SocketTcp");
                         });

TEST(HostCommunicator, RejectsBadArgumentsWithoutEnqueueing) {
  auto store = std::make_shared<InMemoryStore>();
  ProcessGroupOptions o;
  o.hierarchical = false;
  auto pg = ProcessGroup::create(store, o);
  ASSERT_TRUE(pg.isOk()) << pg.status().toString();
  Communicator& c = (*pg)->global();
  EXPECT_EQ(c.broadcast(nullptr, 0, DataType::kF32, 3)->status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.allReduce(nullptr, nullptr, 5, DataType::kF32, ReduceOp::kSum)->status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.send(nullptr, 0, DataType::kF32, 7)->status().code(), StatusCode::kInvalidArgument);
}

TEST(ProcessGroupInit, FailsOnABadLoggingValueNamingTheKey) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_LEVEL", "loud"}});
  auto store = std::make_shared<InMemoryStore>();
  ProcessGroupOptions o;
  o.hierarchical = false;
  auto pg = ProcessGroup::create(store, o);
  ASSERT_FALSE(pg.isOk());
  const std::string m = pg.status().toString();
  EXPECT_EQ(pg.status().code(), StatusCode::kInvalidArgument) << m;
  EXPECT_NE(m.find("BAGUA_LOG_LEVEL='loud'"), std::string::npos) << m;
  EXPECT_NE(m.find("warn"), std::string::npos) << m;  // the accepted values are listed
}

TEST(HalfConversions, RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1000.0f}) {
    EXPECT_EQ(halfToFloat(floatToHalf(f)), f) << f;
  }
  EXPECT_EQ(floatToHalf(1.0f + 1.0f / 2048), floatToHalf(1.0f));  // tie to even
  EXPECT_TRUE(std::isinf(halfToFloat(floatToHalf(70000.0f))));
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(NAN))));
  for (float f : {0.0f, 1.0f, -3.0f, 256.0f, 1.2676506e30f}) {
    EXPECT_EQ(bf16ToFloat(floatToBf16(f)), f) << f;
  }
  EXPECT_EQ(bf16ToFloat(floatToBf16(1.0f + 1.0f / 256)), 1.0f);  // tie to even
}

}  // namespace
}  // namespace bagua::core
