// Algorithms: MinMaxUInt8 compression throughput on the CPU against memcpy of the same input
// (the peer), and per-algorithm step time and bytes on the wire for a fixed model size on the
// host backend (4 ranks as threads over loopback) against gradient all-reduce.
//
// With NCCL built and two GPUs visible, the same per-algorithm step runs on CUDA tensors over NCCL
// (BM_AlgorithmStepNccl: 2 ranks as threads, one GPU each, a 64 MiB model); the NCCL transport is
// whatever the environment selects (bench/gpu/steps/40-algorithms.sh runs it over Bagua-Net and
// over NCCL's Socket with P2P and SHM off).
//
// Counters: bytes_per_second is input (float) bytes processed; wire_MB is payload bytes sent
// per rank per step (the process group's counters); step_ms is the time per training step. At
// the end a table gives each algorithm's wire and time ratio to gradient_allreduce (same run).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/compression.h"
#include "bagua/algorithms/qadam.h"
#include "bagua/core/ddp.h"
#include "bagua_config.h"

#if BAGUA_HAVE_CUDA
#include <cuda_runtime.h>

#include "bagua/algorithms/cuda_compression.h"
#endif
#define BAGUA_BENCH_NCCL (BAGUA_HAVE_CUDA && BAGUA_HAVE_NCCL)

namespace {

using namespace bagua;
using namespace std::chrono_literals;

std::vector<float> input(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::sin(static_cast<float>(i) * 0.001f) * 3.0f + static_cast<float>(i % 17) * 0.01f;
  }
  return x;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto x = input(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), n * sizeof(float));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

void BM_Compress(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const size_t chunks = static_cast<size_t>(state.range(1));
  auto x = input(n);
  std::vector<uint8_t> buf(algo::minMaxCompressedBytes(n, chunks));
  for (auto _ : state) {
    if (!algo::minMaxCompress(x.data(), n, chunks, buf.data(), buf.size()).isOk()) {
      state.SkipWithError("compress failed");
      break;
    }
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

void BM_Decompress(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const size_t chunks = static_cast<size_t>(state.range(1));
  auto x = input(n);
  std::vector<uint8_t> buf(algo::minMaxCompressedBytes(n, chunks));
  (void)algo::minMaxCompress(x.data(), n, chunks, buf.data(), buf.size());
  for (auto _ : state) {
    if (!algo::minMaxDecompress(buf.data(), buf.size(), n, chunks, x.data()).isOk()) {
      state.SkipWithError("decompress failed");
      break;
    }
    benchmark::DoNotOptimize(x.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

BENCHMARK(BM_Memcpy)->Arg(1 << 22);
BENCHMARK(BM_Compress)->Args({1 << 22, 1})->Args({1 << 22, 4});
BENCHMARK(BM_Decompress)->Args({1 << 22, 1})->Args({1 << 22, 4});

#if BAGUA_HAVE_CUDA
// ---- CUDA kernels against the device's own copy bandwidth (cudaMemcpy device to device of the
// same float input), timed with CUDA events. Skipped without a device or without the kernels.

struct DeviceBuffers {
  float* x = nullptr;
  float* y = nullptr;
  uint8_t* c = nullptr;
  void* ws = nullptr;
  size_t wsBytes = 0;
  size_t bytes = 0;
};

bool deviceReady(benchmark::State& state) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    state.SkipWithError("no CUDA device visible");
    return false;
  }
  if (!algo::cudaCompressionAvailable()) {
    state.SkipWithError("built without the CUDA kernels");
    return false;
  }
  return true;
}

DeviceBuffers allocDevice(size_t n, size_t chunks) {
  DeviceBuffers b;
  b.bytes = algo::minMaxCompressedBytes(n, chunks);
  b.wsBytes = algo::minMaxCudaWorkspaceBytes(n, chunks);
  auto x = input(n);
  (void)cudaMalloc(&b.x, n * sizeof(float));
  (void)cudaMalloc(&b.y, n * sizeof(float));
  (void)cudaMalloc(&b.c, b.bytes);
  (void)cudaMalloc(&b.ws, b.wsBytes);
  (void)cudaMemset(b.ws, 0, b.wsBytes);  // the per-chunk counters start at 0 (then self-reset)
  (void)cudaMemcpy(b.x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  return b;
}

void freeDevice(DeviceBuffers& b) {
  cudaFree(b.x);
  cudaFree(b.y);
  cudaFree(b.c);
  cudaFree(b.ws);
}

// kind 0: device copy (peer), 1: compress, 2: decompress.
void BM_Cuda(benchmark::State& state) {
  if (!deviceReady(state)) {
    return;
  }
  const int kind = static_cast<int>(state.range(0));
  const size_t n = static_cast<size_t>(state.range(1));
  const size_t chunks = static_cast<size_t>(state.range(2));
  const int calls = static_cast<int>(state.range(3));
  DeviceBuffers b = allocDevice(n, chunks);
  if (!algo::minMaxCompressCuda(b.x, n, chunks, b.c, b.bytes, b.ws, b.wsBytes).isOk()) {
    state.SkipWithError("compress failed");
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start);
    Status s;
    for (int call = 0; call < calls && s.isOk(); ++call) {
      if (kind == 0) {
        (void)cudaMemcpyAsync(b.y, b.x, n * sizeof(float), cudaMemcpyDeviceToDevice);
      } else if (kind == 1) {
        s = algo::minMaxCompressCuda(b.x, n, chunks, b.c, b.bytes, b.ws, b.wsBytes);
      } else {
        s = algo::minMaxDecompressCuda(b.c, b.bytes, n, chunks, b.y);
      }
    }
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (!s.isOk()) {
      state.SkipWithError(s.toString().c_str());
      break;
    }
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  freeDevice(b);
  // Bytes of float input processed (the copy moves the same floats).
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * static_cast<size_t>(calls) * n * sizeof(float)));
}

// calls = 1 times one call between two events (the launch latency included, as a lone bucket
// sees it); calls = 10 times ten back-to-back calls (the kernels' bandwidth, as a stream of
// buckets sees it). Both for the copy and for the kernels.
// Per size: the copy (peer) first, then compress and decompress with 1 and 8 chunks; the GPU
// step script divides each rate by the copy of the same n.
void cudaArgs(benchmark::internal::Benchmark* b) {
  for (int64_t calls : {1, 10}) {
    for (int64_t n : {int64_t{1} << 22, int64_t{1} << 26}) {
      b->Args({0, n, 1, calls});
      for (int64_t kind : {1, 2}) {
        for (int64_t chunks : {1, 8}) {
          b->Args({kind, n, chunks, calls});
        }
      }
    }
  }
}

BENCHMARK(BM_Cuda)->ArgNames({"kind", "n", "chunks", "calls"})->Apply(cudaArgs)->UseManualTime();
#endif

// ---- Per-algorithm step -----------------------------------------------------------------------
// Host: 4 ranks as threads over loopback, a 4 Mi-float model in 4 tensors, SGD.
// NCCL: 2 ranks as threads, one GPU each, a 16 Mi-float model in 4 CUDA tensors, no optimizer
// (the step time is the reducer's and the algorithm's; gradients are uploaded once).

constexpr int kHostWorld = 4;
constexpr size_t kHostTensor = 1 << 20;
constexpr int kDeviceWorld = 2;
constexpr size_t kDeviceTensor = 1 << 22;
constexpr int kTensors = 4;
constexpr int kWarm = 3;
constexpr int kSteps = 8;

struct StepResult {
  double seconds = 0;
  double wireBytes = 0;
  std::string error;
};

// The rows of the final ratio table: backend -> label -> result.
std::mutex gRowsMu;
std::map<std::string, std::vector<std::pair<std::string, StepResult>>> gRows;

class NoopOptimizer final : public core::Optimizer {
 public:
  Status step() override { return Status::ok(); }
  void zeroGrad() override {}
};

StepResult runSteps(const std::string& name, const algo::AlgorithmArgs& args, bool device) {
  const int world = device ? kDeviceWorld : kHostWorld;
  const size_t tensor = device ? kDeviceTensor : kHostTensor;
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<StepResult> per(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      StepResult& out = per[r];
      core::ProcessGroupOptions po;
      po.rank = r;
      po.worldSize = world;
      po.hierarchical = false;
      po.rendezvousTimeout = 60000ms;
      po.collectiveTimeout = 60000ms;
      if (device) {
        po.backend = core::Backend::kNccl;
        po.cudaDevice = r;
      }
      auto pg = core::ProcessGroup::create(store, po);
      if (!pg.isOk()) {
        out.error = pg.status().toString();
        return;
      }
      std::vector<std::vector<float>> data(kTensors, std::vector<float>(tensor, 0.5f));
      std::vector<std::vector<float>> grad(kTensors, std::vector<float>(tensor));
      for (int k = 0; k < kTensors; ++k) {
        for (size_t i = 0; i < tensor; ++i) {
          grad[k][i] = static_cast<float>((i + r) % 13) * 0.01f - 0.06f;
        }
      }
      std::vector<core::Parameter> params(kTensors);
      std::vector<void*> deviceMem;
      for (int k = 0; k < kTensors; ++k) {
        params[k].name = "w" + std::to_string(k);
        params[k].data = data[k].data();
        params[k].grad = grad[k].data();
        params[k].numel = tensor;
      }
#if BAGUA_BENCH_NCCL
      if (device) {
        cudaSetDevice(r);
        for (int k = 0; k < kTensors; ++k) {
          void* d = nullptr;
          void* g = nullptr;
          if (cudaMalloc(&d, tensor * 4) != cudaSuccess ||
              cudaMalloc(&g, tensor * 4) != cudaSuccess) {
            out.error = "cudaMalloc failed";
            return;
          }
          cudaMemcpy(d, data[k].data(), tensor * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(g, grad[k].data(), tensor * 4, cudaMemcpyHostToDevice);
          deviceMem.push_back(d);
          deviceMem.push_back(g);
          params[k].data = d;
          params[k].grad = g;
          params[k].device = {core::DeviceType::kCuda, r};
        }
      }
#endif
      std::vector<core::Parameter> buffers;
      std::unique_ptr<core::Optimizer> opt;
      algo::QAdamOptimizer* q = nullptr;
      if (name == "qadam") {
        algo::QAdamOptions o;
        o.warmupSteps = 2;
        auto made = algo::QAdamOptimizer::create(params, o);
        if (!made.isOk()) {
          out.error = made.status().toString();
          return;
        }
        q = made->get();
        opt = std::move(*made);
      } else if (device) {
        opt = std::make_unique<NoopOptimizer>();
      } else {
        opt = std::make_unique<core::Sgd>(params, 0.01f);
      }
      auto a = algo::createAlgorithm(name, args, q);
      if (!a.isOk()) {
        out.error = a.status().toString();
        return;
      }
      {
        auto ddp = core::withBagua(params, buffers, {opt.get()}, *a, **pg);
        if (!ddp.isOk()) {
          out.error = ddp.status().toString();
          return;
        }
        core::CommStats before{};
        auto t0 = std::chrono::steady_clock::now();
        for (int step = 0; step < kWarm + kSteps; ++step) {
          if (step == kWarm) {
            before = (*pg)->stats();
            t0 = std::chrono::steady_clock::now();
          }
          Status s = (*ddp)->prepareForward();
          if (!device) {
            for (int k = 0; k < kTensors; ++k) {
              for (size_t i = 0; i < tensor; i += 97) {
                grad[k][i] = static_cast<float>((i + step + r) % 13) * 0.01f;
              }
            }
          }
          for (int k = kTensors - 1; s.isOk() && k >= 0; --k) {
            s = (*ddp)->markGradReady(k);
          }
          if (s.isOk()) {
            s = (*ddp)->finishBackward();
          }
          if (s.isOk()) {
            s = (*ddp)->step();
          }
#if BAGUA_BENCH_NCCL
          if (device && s.isOk() && cudaDeviceSynchronize() != cudaSuccess) {
            s = BAGUA_ERROR(kCudaError, "cudaDeviceSynchronize after step %d", step);
          }
#endif
          if (!s.isOk()) {
            out.error = s.toString();
            break;
          }
        }
        out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        out.wireBytes = static_cast<double>((*pg)->stats().bytesSent - before.bytesSent);
      }
#if BAGUA_BENCH_NCCL
      for (void* m : deviceMem) {
        cudaFree(m);
      }
#endif
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  StepResult total;
  for (const auto& p : per) {
    if (!p.error.empty()) {
      return p;
    }
    total.seconds = std::max(total.seconds, p.seconds);
    total.wireBytes += p.wireBytes / world;
  }
  total.seconds /= kSteps;
  total.wireBytes /= kSteps;
  return total;
}

void BM_AlgorithmStep(benchmark::State& state, const std::string& label, const std::string& name,
                      const algo::AlgorithmArgs& args, bool device) {
#if BAGUA_BENCH_NCCL
  if (device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < kDeviceWorld) {
      (void)cudaGetLastError();
      state.SkipWithError("needs 2 CUDA devices (the NCCL step runs on the GPU machine)");
      return;
    }
  }
#endif
  for (auto _ : state) {
    StepResult r = runSteps(name, args, device);
    if (!r.error.empty()) {
      state.SkipWithError(r.error.c_str());
      break;
    }
    state.SetIterationTime(r.seconds);
    state.counters["step_ms"] = r.seconds * 1e3;
    state.counters["wire_MB"] = r.wireBytes / 1e6;
    state.counters["model_MB"] =
        static_cast<double>((device ? kDeviceTensor : kHostTensor) * kTensors * 4) / 1e6;
    std::lock_guard<std::mutex> lock(gRowsMu);
    gRows[device ? "nccl" : "host"].emplace_back(label, r);
  }
}

#define ALGO_STEP(bm, label, device, name, ...)                                      \
  BENCHMARK_CAPTURE(BM_AlgorithmStep, label, std::string(#label), std::string(name), \
                    algo::AlgorithmArgs __VA_ARGS__, device)                         \
      ->Name(bm "/" #label)                                                          \
      ->Iterations(1)                                                                \
      ->UseManualTime()                                                              \
      ->Unit(benchmark::kMillisecond)

ALGO_STEP("BM_AlgorithmStep", gradient_allreduce, false, "gradient_allreduce", {});
ALGO_STEP("BM_AlgorithmStep", bytegrad, false, "bytegrad", {{"hierarchical", "false"}});
ALGO_STEP("BM_AlgorithmStep", decentralized_all, false, "decentralized",
          {{"hierarchical", "false"}});
ALGO_STEP("BM_AlgorithmStep", decentralized_shift_one, false, "decentralized",
          {{"hierarchical", "false"}, {"peer_selection_mode", "shift_one"}});
ALGO_STEP("BM_AlgorithmStep", low_precision_decentralized, false, "low_precision_decentralized",
          {{"hierarchical", "false"}});
ALGO_STEP("BM_AlgorithmStep", qadam, false, "qadam", {{"hierarchical", "false"}});

#if BAGUA_BENCH_NCCL
ALGO_STEP("BM_AlgorithmStepNccl", gradient_allreduce, true, "gradient_allreduce", {});
ALGO_STEP("BM_AlgorithmStepNccl", bytegrad, true, "bytegrad", {{"hierarchical", "false"}});
ALGO_STEP("BM_AlgorithmStepNccl", decentralized_all, true, "decentralized",
          {{"hierarchical", "false"}});
ALGO_STEP("BM_AlgorithmStepNccl", decentralized_shift_one, true, "decentralized",
          {{"hierarchical", "false"}, {"peer_selection_mode", "shift_one"}});
ALGO_STEP("BM_AlgorithmStepNccl", low_precision_decentralized, true, "low_precision_decentralized",
          {{"hierarchical", "false"}});
// QAdam on CUDA tensors: warm-up is 2 steps, so the timed steps are the compressed stage
// (momentum kernel, ByteGrad exchange, device Adam step).
ALGO_STEP("BM_AlgorithmStepNccl", qadam, true, "qadam", {{"hierarchical", "false"}});
#endif

// Each algorithm against gradient_allreduce of the same backend, same run.
void printRatios() {
  std::lock_guard<std::mutex> lock(gRowsMu);
  for (const auto& [backend, rows] : gRows) {
    const StepResult* peer = nullptr;
    for (const auto& [label, r] : rows) {
      if (label == "gradient_allreduce") {
        peer = &r;
      }
    }
    if (peer == nullptr || peer->wireBytes <= 0 || peer->seconds <= 0) {
      continue;
    }
    std::printf("\nalgorithm step, %s backend (%d ranks): ratios to gradient_allreduce\n",
                backend.c_str(), backend == "nccl" ? kDeviceWorld : kHostWorld);
    std::printf("  %-28s %10s %10s %8s %10s\n", "algorithm", "wire MB", "wire x", "step ms",
                "speed-up");
    for (const auto& [label, r] : rows) {
      std::printf("  %-28s %10.2f %10.3f %8.2f %9.2fx\n", label.c_str(), r.wireBytes / 1e6,
                  r.wireBytes / peer->wireBytes, r.seconds * 1e3, peer->seconds / r.seconds);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  printRatios();
  return 0;
}
