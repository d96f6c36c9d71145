// Algorithms (issue 5): MinMaxUInt8 compression throughput on the CPU against memcpy of the same
// input (the peer), and per-algorithm step time and bytes on the wire for a fixed model size on
// the host backend (4 ranks as threads over loopback) against gradient all-reduce.
//
// Counters: bytes_per_second is input (float) bytes processed; wire_bytes is payload bytes sent
// per rank per step (the process group's counters); step_ms is the time per training step.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstring>
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
    if (kind == 0) {
      (void)cudaMemcpyAsync(b.y, b.x, n * sizeof(float), cudaMemcpyDeviceToDevice);
    } else if (kind == 1) {
      s = algo::minMaxCompressCuda(b.x, n, chunks, b.c, b.bytes, b.ws, b.wsBytes);
    } else {
      s = algo::minMaxDecompressCuda(b.c, b.bytes, n, chunks, b.y);
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
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

BENCHMARK(BM_Cuda)
    ->ArgNames({"kind", "n", "chunks"})
    ->Args({0, 1 << 26, 1})
    ->Args({1, 1 << 26, 1})
    ->Args({1, 1 << 26, 8})
    ->Args({2, 1 << 26, 8})
    ->UseManualTime();
#endif

// ---- Per-algorithm step: 4 ranks, a 4 Mi-float model in 4 tensors, SGD ----------------------

constexpr int kWorld = 4;
constexpr size_t kTensor = 1 << 20;
constexpr int kTensors = 4;
constexpr int kWarm = 3;
constexpr int kSteps = 8;

struct StepResult {
  double seconds = 0;
  double wireBytes = 0;
  std::string error;
};

StepResult runSteps(const std::string& name, const algo::AlgorithmArgs& args) {
  auto store = std::make_shared<core::InMemoryStore>();
  std::vector<StepResult> per(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      StepResult& out = per[r];
      core::ProcessGroupOptions po;
      po.rank = r;
      po.worldSize = kWorld;
      po.hierarchical = false;
      po.rendezvousTimeout = 30000ms;
      po.collectiveTimeout = 60000ms;
      auto pg = core::ProcessGroup::create(store, po);
      if (!pg.isOk()) {
        out.error = pg.status().toString();
        return;
      }
      std::vector<std::vector<float>> data(kTensors, std::vector<float>(kTensor, 0.5f));
      std::vector<std::vector<float>> grad(kTensors, std::vector<float>(kTensor));
      std::vector<core::Parameter> params(kTensors);
      for (int k = 0; k < kTensors; ++k) {
        params[k].name = "w" + std::to_string(k);
        params[k].data = data[k].data();
        params[k].grad = grad[k].data();
        params[k].numel = kTensor;
      }
      std::vector<core::Parameter> buffers;
      std::unique_ptr<core::Optimizer> opt;
      algo::QAdamOptimizer* q = nullptr;
      if (name == "qadam") {
        algo::QAdamOptions o;
        o.warmupSteps = 2;
        auto made = algo::QAdamOptimizer::create(params, o);
        q = made->get();
        opt = std::move(*made);
      } else {
        opt = std::make_unique<core::Sgd>(params, 0.01f);
      }
      auto a = algo::createAlgorithm(name, args, q);
      if (!a.isOk()) {
        out.error = a.status().toString();
        return;
      }
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
        for (int k = 0; k < kTensors; ++k) {
          for (size_t i = 0; i < kTensor; i += 97) {
            grad[k][i] = static_cast<float>((i + step + r) % 13) * 0.01f;
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
        if (!s.isOk()) {
          out.error = s.toString();
          return;
        }
      }
      out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.wireBytes = static_cast<double>((*pg)->stats().bytesSent - before.bytesSent);
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
    total.wireBytes += p.wireBytes / kWorld;
  }
  total.seconds /= kSteps;
  total.wireBytes /= kSteps;
  return total;
}

void BM_AlgorithmStep(benchmark::State& state, const std::string& name,
                      const algo::AlgorithmArgs& args) {
  for (auto _ : state) {
    StepResult r = runSteps(name, args);
    if (!r.error.empty()) {
      state.SkipWithError(r.error.c_str());
      break;
    }
    state.SetIterationTime(r.seconds);
    state.counters["step_ms"] = r.seconds * 1e3;
    state.counters["wire_MB"] = r.wireBytes / 1e6;
    state.counters["model_MB"] = static_cast<double>(kTensor * kTensors * 4) / 1e6;
  }
}

#define ALGO_STEP(label, name, ...)                                                              \
  BENCHMARK_CAPTURE(BM_AlgorithmStep, label, std::string(name), algo::AlgorithmArgs __VA_ARGS__) \
      ->Iterations(1)                                                                            \
      ->UseManualTime()                                                                          \
      ->Unit(benchmark::kMillisecond)

ALGO_STEP(gradient_allreduce, "gradient_allreduce", {});
ALGO_STEP(bytegrad, "bytegrad", {{"hierarchical", "false"}});
ALGO_STEP(decentralized_all, "decentralized", {{"hierarchical", "false"}});
ALGO_STEP(decentralized_shift_one, "decentralized",
          {{"hierarchical", "false"}, {"peer_selection_mode", "shift_one"}});
ALGO_STEP(low_precision_decentralized, "low_precision_decentralized", {{"hierarchical", "false"}});
ALGO_STEP(qadam, "qadam", {{"hierarchical", "false"}});

}  // namespace

BENCHMARK_MAIN();
