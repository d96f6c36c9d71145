// The NCCL backend on real GPUs: ranks as threads, one device each. Skipped (with the reason)
// where no GPU is visible; the lead runs it on the GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "bagua/core/process_group.h"
#include "multi_rank.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

template <typename F>
std::string withGroup(std::shared_ptr<Store> store, int r, int world, F&& body) {
  ProcessGroupOptions o;
  o.rank = r;
  o.worldSize = world;
  o.backend = Backend::kNccl;
  o.hierarchical = false;
  o.rendezvousTimeout = 60000ms;
  o.collectiveTimeout = 60000ms;
  auto pg = ProcessGroup::create(store, o);
  if (!pg.isOk()) {
    return pg.status().toString();
  }
  cudaSetDevice(r);
  return body((*pg)->global());
}

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
        return withGroup(store, r, world, [&](Communicator& c) -> std::string {
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
