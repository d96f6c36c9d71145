// bagua-nccl-comm-bench: our NCCL communicator (bagua::core, Backend::kNccl) against NCCL called
// directly, same processes, same GPUs, same sizes, alternating, every result checked. Launch with
// baguarun, one process per GPU:
//
//   baguarun --nproc_per_node 2 --master_port 0 bagua-nccl-comm-bench [--sizes 1M,64M,256M]
//            [--iters N] [--reps R]
//
// Both sides run in-place f32 sum all-reduces, each on its own device buffer. Two patterns:
// "sync" waits for each call before the next (ours: Work::wait; raw: cudaStreamSynchronize),
// "batch" issues all calls and waits for the last (nothing else inside the timing). time = the
// slowest rank's mean per call (nccl-tests' -a 2 would average; we report the max);
// algbw = bytes / time; busbw = algbw * 2(n-1)/n. Every element is checked after the warm-up
// call and again after the timed calls. The last line sums up the ratios (bagua/nccl busbw).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "bagua/core/process_group.h"
#include "bagua/demo_support/bench_args.h"

namespace {

using namespace bagua;
using namespace bagua::core;
using Clock = std::chrono::steady_clock;

#define BENCH_CHECK(cond, ...)                                     \
  do {                                                             \
    if (!(cond)) {                                                 \
      std::fprintf(stderr, "bagua-nccl-comm-bench: " __VA_ARGS__); \
      std::fprintf(stderr, "\n");                                  \
      return 1;                                                    \
    }                                                              \
  } while (0)

struct Args : demo::BenchArgs {
  Args() {
    sizes = {1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
    iters = 20;
  }
};

std::string sizeText(size_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) {
    return strPrintf("%zuM", b >> 20);
  }
  return strPrintf("%zuK", b >> 10);
}

int run(const Args& a) {
  ProcessGroupOptions po;
  po.hierarchical = false;
  po.backend = Backend::kNccl;
  po.name = "nccl_comm_bench";
  auto pgr = ProcessGroup::initFromEnv(po);
  BENCH_CHECK(pgr.isOk(), "%s", pgr.status().toString().c_str());
  ProcessGroup& pg = **pgr;
  const int rank = pg.rank();
  const int world = pg.size();
  Communicator& ours = pg.global();
  BENCH_CHECK(cudaSetDevice(pg.localRank()) == cudaSuccess, "cudaSetDevice(%d)", pg.localRank());

  // NCCL called directly: its own communicator, unique id through the same store.
  ncclUniqueId id;
  std::shared_ptr<Store> store = pg.store();
  if (rank == 0) {
    BENCH_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    Bytes b(sizeof(id));
    std::memcpy(b.data(), &id, sizeof(id));
    BENCH_CHECK(store->set("raw_nccl_id", b).isOk(), "store set");
  }
  {
    Result<Bytes> b = store->get("raw_nccl_id", std::chrono::seconds(60));
    BENCH_CHECK(b.isOk() && b->size() == sizeof(id), "store get");
    std::memcpy(&id, b->data(), sizeof(id));
  }
  ncclComm_t raw;
  BENCH_CHECK(ncclCommInitRank(&raw, world, id, rank) == ncclSuccess, "ncclCommInitRank");
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess,
              "cudaStreamCreate");

  const size_t maxBytes = *std::max_element(a.sizes.begin(), a.sizes.end());
  // One buffer per side: ours runs on our communicator's stream, NCCL on the bench's own, and
  // neither stream is ordered with the other.
  float* devs[2] = {nullptr, nullptr};
  for (float*& p : devs) {
    BENCH_CHECK(cudaMalloc(&p, maxBytes) == cudaSuccess, "cudaMalloc(%zu)", maxBytes);
  }
  double* maxDev = nullptr;
  BENCH_CHECK(cudaMalloc(&maxDev, sizeof(double)) == cudaSuccess, "cudaMalloc");
  std::vector<float> host(maxBytes / 4);
  const double busFactor = world > 1 ? 2.0 * (world - 1) / world : 1.0;
  const bool powerOfTwo = (world & (world - 1)) == 0;
  if (rank == 0) {
    std::printf("bagua-nccl-comm-bench: %d ranks (GPUs), f32 sum in place; NCCL %d.%d.%d\n", world,
                NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    std::printf("%8s %7s | %10s %10s | %10s %10s | %7s\n", "size", "pattern", "bagua us",
                "busbw GB/s", "nccl us", "busbw GB/s", "ratio");
  }
  std::string summary;
  for (size_t bytes : a.sizes) {
    const size_t count = bytes / 4;
    for (int batch = 0; batch < 2; ++batch) {
      double best[2] = {1e30, 1e30};
      for (int rep = 0; rep < a.reps; ++rep) {
        for (int who = 0; who < 2; ++who) {
          const char* side = who == 0 ? "bagua" : "nccl";
          float* dev = devs[who];
          // Rank- and index-dependent values; after one all-reduce element i must be
          // n(n+1)/2 + n * (i % 251), so a stale or misplaced element shows.
          for (size_t i = 0; i < count; ++i) {
            host[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 251));
          }
          BENCH_CHECK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess,
                      "cudaMemcpy");
          // A pageable host-to-device cudaMemcpy may return before the data has landed, and the
          // all-reduce streams do not wait for the legacy stream: wait for the device (the stale
          // value seen in 1 of 2 runs on the H200 host).
          BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
          auto once = [&](bool wait) -> bool {
            if (who == 0) {
              WorkPtr w = ours.allReduce(dev, dev, count, DataType::kF32, ReduceOp::kSum);
              return !wait || w->wait(std::chrono::seconds(120)).isOk();
            }
            if (ncclAllReduce(dev, dev, count, ncclFloat, ncclSum, raw, stream) != ncclSuccess) {
              return false;
            }
            return !wait || cudaStreamSynchronize(stream) == cudaSuccess;
          };
          BENCH_CHECK(once(true), "%s: warm-up all-reduce failed", side);
          BENCH_CHECK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess,
                      "cudaMemcpy");
          const float ranks = static_cast<float>(world * (world + 1) / 2);
          for (size_t i = 0; i < count; ++i) {
            const float want = ranks + static_cast<float>(world) * static_cast<float>(i % 251);
            BENCH_CHECK(host[i] == want, "%s %s %s: element %zu is %g, expected %g",
                        sizeText(bytes).c_str(), batch == 0 ? "sync" : "batch", side, i, host[i],
                        want);
          }
          BENCH_CHECK(ours.barrier()->wait(std::chrono::seconds(60)).isOk(), "barrier");
          auto t0 = Clock::now();
          for (int i = 0; i < a.iters; ++i) {
            BENCH_CHECK(once(batch == 0 || i + 1 == a.iters), "%s: all-reduce failed", side);
          }
          double us =
              std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / a.iters;
          // The timed calls were checked too: each multiplies every element by n (exact in f32
          // when n is a power of two; otherwise within rounding). A Work reported done before
          // its kernel finished, or calls run out of order, would show here.
          const double growth = std::pow(static_cast<double>(world), a.iters);
          if (growth * (ranks + world * 250.0) < 1e30) {
            BENCH_CHECK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess,
                        "cp");
            for (size_t i = 0; i < count; ++i) {
              const double want = (ranks + static_cast<double>(world) * (i % 251)) * growth;
              const double err = std::fabs(host[i] - want);
              BENCH_CHECK(powerOfTwo ? err == 0 : err <= want * 1e-5,
                          "%s %s %s: after the timed calls element %zu is %g, expected %g",
                          sizeText(bytes).c_str(), batch == 0 ? "sync" : "batch", side, i, host[i],
                          want);
            }
          }
          // Slowest rank: a max all-reduce of the time through our communicator (outside the
          // timing).
          BENCH_CHECK(cudaMemcpy(maxDev, &us, sizeof(us), cudaMemcpyHostToDevice) == cudaSuccess,
                      "cp");
          BENCH_CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
          BENCH_CHECK(ours.allReduce(maxDev, maxDev, 1, DataType::kF64, ReduceOp::kMax)
                          ->wait(std::chrono::seconds(60))
                          .isOk(),
                      "max");
          BENCH_CHECK(cudaMemcpy(&us, maxDev, sizeof(us), cudaMemcpyDeviceToHost) == cudaSuccess,
                      "cp");
          best[who] = std::min(best[who], us);
        }
      }
      if (rank == 0) {
        const double b0 = static_cast<double>(bytes) / (best[0] * 1e-6) / 1e9 * busFactor;
        const double b1 = static_cast<double>(bytes) / (best[1] * 1e-6) / 1e9 * busFactor;
        std::printf("%8s %7s | %10.1f %10.2f | %10.1f %10.2f | %6.3fx\n", sizeText(bytes).c_str(),
                    batch == 0 ? "sync" : "batch", best[0], b0, best[1], b1, b0 / b1);
        std::fflush(stdout);
        summary += strPrintf("%s%s %s %.2fx", summary.empty() ? "" : ", ", sizeText(bytes).c_str(),
                             batch == 0 ? "sync" : "batch", b0 / b1);
      }
    }
  }
  if (rank == 0) {
    std::printf("bagua/nccl busbw: %s\n", summary.c_str());
  }
  for (float* p : devs) {
    cudaFree(p);
  }
  cudaFree(maxDev);
  ncclCommDestroy(raw);
  cudaStreamDestroy(stream);
  return ours.barrier()->wait(std::chrono::seconds(60)).isOk() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Our NCCL communicator against NCCL called directly, same processes, GPUs and "
      "sizes, every result checked; one process per GPU, under baguarun: baguarun "
      "--nproc_per_node 2 bagua-nccl-comm-bench [options]",
      "bagua-nccl-comm-bench"};
  bagua::cli::configure(app);
  demo::addBenchOptions(app, &a);
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  return run(a);
}
