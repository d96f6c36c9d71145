// The NCCL backend's collectives on real GPUs: ranks as threads, one device each, every result
// against its closed form; a peer that never issues its part; the errors of a group that cannot be
// made. Skipped (with the reason) where no GPU is visible; the lead runs it on the GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "bagua/core/process_group.h"
#include "multi_rank.h"
#include "nccl_ranks.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using bagua::testing::DeviceFloats;
using bagua::testing::gpuCount;
using bagua::testing::withNcclGroup;

TEST(Nccl, AllReduceAllGatherBroadcastMatchClosedForm) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend runs on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  const size_t n = (1 << 20) + 7;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withNcclGroup(store, r, world, [&](Communicator& c) -> std::string {
          std::vector<float> h(n);
          for (size_t i = 0; i < n; ++i) {
            h[i] = static_cast<float>((i * 7 + r * 13) % 17);
          }
          float* d = nullptr;
          float* g = nullptr;
          if (cudaMalloc(&d, n * 4) != cudaSuccess ||
              cudaMalloc(&g, n * 4 * world) != cudaSuccess) {
            return std::string("cudaMalloc failed");
          }
          cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice);
          Status s = c.allGather(d, g, n, DataType::kF32)->wait(60000ms);
          if (s.isOk()) {
            s = c.allReduce(d, d, n, DataType::kF32, ReduceOp::kSum)->wait(60000ms);
          }
          if (!s.isOk()) {
            return s.toString();
          }
          std::vector<float> out(n), gathered(n * world);
          cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost);
          cudaMemcpy(gathered.data(), g, n * 4 * world, cudaMemcpyDeviceToHost);
          cudaFree(d);
          cudaFree(g);
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int k = 0; k < world; ++k) {
              want += static_cast<float>((i * 7 + k * 13) % 17);
            }
            if (out[i] != want) {
              return strPrintf("allReduce element %zu: %g != %g", i, out[i], want);
            }
          }
          for (size_t i = 0; i < n * world; ++i) {
            float want = static_cast<float>(((i % n) * 7 + (i / n) * 13) % 17);
            if (gathered[i] != want) {
              return strPrintf("allGather element %zu: %g != %g", i, gathered[i], want);
            }
          }
          return std::string();
        });
      },
      180s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// The pooled completion events are reused every 1024 operations: more small calls than that in
// a row, issued without waiting (then the last waited) and one by one, must all be correct, and
// every Work of the batch must report done once the last one is.
TEST(Nccl, ManySmallCallsInARowAreAllCorrect) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend runs on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withNcclGroup(store, r, world, [&](Communicator& c) -> std::string {
          constexpr size_t kOps = 2500;  // > 2 rings of events
          constexpr size_t kLen = 67;    // odd: segments do not line up with anything
          const float ranks = static_cast<float>(world * (world + 1) / 2);
          auto value = [](int rank, size_t k, size_t i) {
            return static_cast<float>((rank + 1) * static_cast<int>(k % 5 + 1)) +
                   static_cast<float>(i % 13);
          };
          std::vector<float> h(kOps * kLen);
          for (size_t k = 0; k < kOps; ++k) {
            for (size_t i = 0; i < kLen; ++i) {
              h[k * kLen + i] = value(r, k, i);
            }
          }
          DeviceFloats batch(kOps * kLen), single(kOps * kLen);
          if (batch.p == nullptr || single.p == nullptr) {
            return std::string("cudaMalloc failed");
          }
          cudaMemcpy(batch.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(single.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
          cudaDeviceSynchronize();  // pageable copies may return before the data lands
          // Batch: every call issued before any is waited; the last one waited.
          std::vector<WorkPtr> works;
          works.reserve(kOps);
          for (size_t k = 0; k < kOps; ++k) {
            works.push_back(c.allReduce(batch.p + k * kLen, batch.p + k * kLen, kLen,
                                        DataType::kF32, ReduceOp::kSum));
          }
          Status s = works.back()->wait(60000ms);
          if (!s.isOk()) {
            return "batch: " + s.toString();
          }
          for (size_t k = 0; k < kOps; ++k) {
            if (!works[k]->test() || !works[k]->status().isOk()) {
              return strPrintf("batch: work %zu not done/ok after the last one: %s", k,
                               works[k]->status().toString().c_str());
            }
          }
          // One by one, each waited; every 100th also through a barrier, and one waited from
          // another thread while this one polls test().
          for (size_t k = 0; k < kOps; ++k) {
            WorkPtr w = c.allReduce(single.p + k * kLen, single.p + k * kLen, kLen, DataType::kF32,
                                    ReduceOp::kSum);
            if (k == kOps / 2) {
              Status other;
              std::thread t([&] { other = w->wait(60000ms); });
              while (!w->test()) {
              }
              t.join();
              s = other.isOk() ? w->status() : other;
            } else {
              s = w->wait(60000ms);
            }
            if (s.isOk() && k % 100 == 0) {
              s = c.barrier()->wait(60000ms);
            }
            if (!s.isOk()) {
              return strPrintf("single %zu: %s", k, s.toString().c_str());
            }
          }
          std::vector<float> outBatch(h.size()), outSingle(h.size());
          cudaMemcpy(outBatch.data(), batch.p, h.size() * 4, cudaMemcpyDeviceToHost);
          cudaMemcpy(outSingle.data(), single.p, h.size() * 4, cudaMemcpyDeviceToHost);
          for (size_t k = 0; k < kOps; ++k) {
            for (size_t i = 0; i < kLen; ++i) {
              const float want = ranks * static_cast<float>(k % 5 + 1) +
                                 static_cast<float>(world) * static_cast<float>(i % 13);
              if (outBatch[k * kLen + i] != want || outSingle[k * kLen + i] != want) {
                return strPrintf("op %zu element %zu: batch %g, single %g, expected %g", k, i,
                                 outBatch[k * kLen + i], outSingle[k * kLen + i], want);
              }
            }
          }
          return std::string();
        });
      },
      240s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// Broadcast, reduce-scatter, send/recv around the ring and all-to-all (NCCL groups) against
// closed forms with rank- and index-dependent values.
TEST(Nccl, BroadcastReduceScatterSendRecvAllToAllMatchClosedForm) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend runs on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withNcclGroup(store, r, world, [&](Communicator& c) -> std::string {
          const size_t n = 1000 + 3;
          const size_t all = n * static_cast<size_t>(world);
          auto v = [](int rank, size_t i) { return static_cast<float>((i * 5 + rank * 11) % 23); };
          std::vector<float> h(all);
          for (size_t i = 0; i < all; ++i) {
            h[i] = v(r, i);
          }
          DeviceFloats bc(n), rsIn(all), rsOut(n), sr(n), srOut(n), a2aIn(all), a2aOut(all);
          for (float* p : {bc.p, rsIn.p, rsOut.p, sr.p, srOut.p, a2aIn.p, a2aOut.p}) {
            if (p == nullptr) {
              return std::string("cudaMalloc failed");
            }
          }
          cudaMemcpy(bc.p, h.data(), n * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(rsIn.p, h.data(), all * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(sr.p, h.data(), n * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(a2aIn.p, h.data(), all * 4, cudaMemcpyHostToDevice);
          cudaDeviceSynchronize();
          const int root = world - 1;
          const int next = (r + 1) % world;
          const int prev = (r + world - 1) % world;
          std::vector<WorkPtr> ws = {
              c.broadcast(bc.p, n, DataType::kF32, root),
              c.reduceScatter(rsIn.p, rsOut.p, n, DataType::kF32, ReduceOp::kSum),
              c.sendRecv(sr.p, n, next, srOut.p, n, prev, DataType::kF32),
              c.allToAll(a2aIn.p, a2aOut.p, n, DataType::kF32),
          };
          for (WorkPtr& w : ws) {
            Status s = w->wait(60000ms);
            if (!s.isOk()) {
              return s.toString();
            }
          }
          std::vector<float> o(all);
          cudaMemcpy(o.data(), bc.p, n * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n; ++i) {
            if (o[i] != v(root, i)) {
              return strPrintf("broadcast element %zu: %g != %g", i, o[i], v(root, i));
            }
          }
          cudaMemcpy(o.data(), rsOut.p, n * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int k = 0; k < world; ++k) {
              want += v(k, static_cast<size_t>(r) * n + i);
            }
            if (o[i] != want) {
              return strPrintf("reduceScatter element %zu: %g != %g", i, o[i], want);
            }
          }
          cudaMemcpy(o.data(), srOut.p, n * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n; ++i) {
            if (o[i] != v(prev, i)) {
              return strPrintf("sendRecv element %zu: %g != %g", i, o[i], v(prev, i));
            }
          }
          cudaMemcpy(o.data(), a2aOut.p, all * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < all; ++i) {
            // Block j of my output is block r of rank j's input.
            const int from = static_cast<int>(i / n);
            const float want = v(from, static_cast<size_t>(r) * n + i % n);
            if (o[i] != want) {
              return strPrintf("allToAll element %zu: %g != %g", i, o[i], want);
            }
          }
          return std::string();
        });
      },
      180s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// A peer that never issues its part: the waiter gets an error in bounded time (the watchdog
// aborts after the collective timeout even though the wait allows much longer), a short wait
// before that is DeadlineExceeded without breaking anything, and later calls fail at once.
TEST(Nccl, PeerThatNeverIssuesFailsWithinTheCollectiveTimeout) {
  const int world = std::min(gpuCount(), 8);
  if (world < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (" << world << " visible)";
  }
  auto store = std::make_shared<InMemoryStore>();
  std::atomic<bool> rank0Done{false};
  const auto timeout = 2000ms;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withNcclGroup(
            store, r, world,
            [&](Communicator& c) -> std::string {
              const size_t n = 4096;
              DeviceFloats d(n);
              if (d.p == nullptr) {
                return std::string("cudaMalloc failed");
              }
              cudaMemset(d.p, 0, n * 4);
              cudaDeviceSynchronize();
              // Both ranks: one all-reduce, so connections exist before the hang.
              Status s = c.allReduce(d.p, d.p, n, DataType::kF32, ReduceOp::kSum)->wait(60000ms);
              if (!s.isOk()) {
                return "warm-up: " + s.toString();
              }
              if (r != 0) {
                // Never issues the second all-reduce; waits (bounded) for rank 0's verdict.
                const auto until = std::chrono::steady_clock::now() + 60s;
                while (!rank0Done.load(std::memory_order_acquire) &&
                       std::chrono::steady_clock::now() < until) {
                  std::this_thread::sleep_for(10ms);
                }
                c.abort("test: the peer has given up");
                // Aborted here, or already by this rank's watchdog on NCCL's error report.
                Status after = c.barrier()->wait(1000ms);
                if (after.isOk()) {
                  return std::string("a barrier after abort succeeded");
                }
                return std::string();
              }
              const auto t0 = std::chrono::steady_clock::now();
              WorkPtr w = c.allReduce(d.p, d.p, n, DataType::kF32, ReduceOp::kSum);
              Status early = w->wait(100ms);
              std::string out;
              if (early.code() != StatusCode::kDeadlineExceeded || w->test()) {
                out = "short wait: " + early.toString();
              }
              s = w->wait(60000ms);
              const double secs =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              if (out.empty() && s.code() != StatusCode::kDeadlineExceeded) {
                out = "expected DeadlineExceeded from the watchdog, got " + s.toString();
              }
              if (out.empty() && (secs < 1.5 || secs > 20)) {
                out = strPrintf("failed after %.2f s; the collective timeout is 2 s", secs);
              }
              const auto t1 = std::chrono::steady_clock::now();
              Status next = c.allReduce(d.p, d.p, n, DataType::kF32, ReduceOp::kSum)->wait(1000ms);
              if (out.empty() && (next.isOk() || std::chrono::steady_clock::now() - t1 > 500ms)) {
                out = "a call after the abort should fail at once: " + next.toString();
              }
              rank0Done.store(true, std::memory_order_release);
              return out;
            },
            timeout);
      },
      120s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// GradientAllReduce's average, then +1 on every element (through the host, on the bucket
// thread): the trainer must read average + 1, so gradients that were not copied in before the
// bucket ran, or whose result did not come back, fail even on one GPU (where the average of one
// Two ranks of one host on one GPU (a wrong LOCAL_RANK, or simulated nodes without an
// NCCL_HOSTID each): NCCL refuses with "invalid usage", and only NCCL_DEBUG=WARN used to say
// why. The error carries NCCL's own reason and what to change.
TEST(Nccl, TwoRanksOnOneGpuOfOneHostFailSayingWhy) {
  if (gpuCount() < 1) {
    GTEST_SKIP() << "needs a CUDA device (0 visible)";
  }
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = 2;
        o.backend = Backend::kNccl;
        o.hierarchical = false;
        o.cudaDevice = 0;  // both
        o.rendezvousTimeout = 60000ms;
        auto pg = ProcessGroup::create(store, o);
        return pg.isOk() ? std::string("created") : pg.status().toString();
      },
      120s);
  for (const std::string& e : res) {
    EXPECT_NE(e.find("invalid usage"), std::string::npos) << e;
    EXPECT_NE(e.find("Duplicate GPU"), std::string::npos) << e;  // NCCL's last WARN
    EXPECT_NE(e.find("NCCL_HOSTID"), std::string::npos) << e;
  }
}

TEST(Nccl, ReportsMissingDeviceClearly) {
  if (gpuCount() > 0) {
    GTEST_SKIP() << "a GPU is visible: this test checks the error without one";
  }
  auto store = std::make_shared<InMemoryStore>();
  ProcessGroupOptions o;
  o.backend = Backend::kNccl;
  o.hierarchical = false;
  auto pg = ProcessGroup::create(store, o);
  ASSERT_FALSE(pg.isOk());
  EXPECT_NE(pg.status().message().find("device"), std::string::npos) << pg.status().toString();
}

}  // namespace
}  // namespace bagua::core
