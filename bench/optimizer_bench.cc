// The fused optimizer on the CPU: one step of Adam (and SGD with momentum) over 1,000 and 10,000
// small tensors, fused (flattened, one kernel call per run) against per-tensor updates (the same
// kernel called once per tensor), and the bandwidth bound: the bytes each update must read and
// write (Adam f32: p, g, m, v read, p, m, v written = 28 B/element) over the memcpy bandwidth
// measured in the same process.
//
// BM_HostCost*: 10,000 one-element tensors, plain SGD (p -= lr * g), one thread: the kernel work
// (10,000 multiply-subtracts) is negligible, so the time per step is the host-side cost of a step
// (plan check, kernel calls): the part that must stay far below the GPU's time for a step so
// back-to-back steps pipeline. Fused with checkFlatten on (every tensor's pointers compared each
// step) and off (a window of 256), against per-tensor (one call per tensor), same run.
//
// Counters: elems (elements per step), GBps (bytes per update / time), bound (GBps / memcpy
// GBps: 1.0 is the copy bandwidth), memcpy_GBps (read + written bytes per second of memcpy on a
// buffer of the same working-set size).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "bagua/optimizer/elementwise.h"

namespace bagua::optim {
namespace {

// Sizes of the small-tensor sets: 64..512 elements (mean 288), deterministic.
size_t smallSize(size_t i) {
  return ((i * 37) % 8 + 1) * 64;
}

struct Params {
  std::vector<std::vector<float>> data, grad;
  std::vector<core::Parameter> list;
  size_t elems = 0;
  Params(size_t tensors, size_t each) {
    data.resize(tensors);
    grad.resize(tensors);
    for (size_t t = 0; t < tensors; ++t) {
      const size_t n = each != 0 ? each : smallSize(t);
      data[t].resize(n);
      grad[t].resize(n);
      for (size_t i = 0; i < n; ++i) {
        data[t][i] = static_cast<float>((t * 7 + i * 13) % 101) / 101.0f - 0.5f;
        grad[t][i] = static_cast<float>((t * 11 + i * 5) % 97) / 970.0f - 0.05f;
      }
      core::Parameter p;
      p.name = "t" + std::to_string(t);
      p.data = data[t].data();
      p.grad = grad[t].data();
      p.numel = n;
      const size_t idx = t;
      p.setGrad = [this, idx](void* g) { list[idx].grad = g; };
      list.push_back(std::move(p));
      elems += n;
    }
  }
};

// memcpy bandwidth (read + written bytes per second) for a working set of `bytes`, measured once
// per size in this process.
double memcpyGBps(size_t bytes) {
  static std::map<size_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) {
    return it->second;
  }
  const size_t half = bytes / 2;
  std::vector<uint8_t> a(half, 1), b(half, 2);
  double best = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), half);
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(b.data());
    const double s = std::chrono::duration<double>(t1 - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(half) / s / 1e9);
    std::swap(a, b);
  }
  cache[bytes] = best;
  return best;
}

template <class Opt>
void runStep(benchmark::State& state, const typename Opt::Hyper& h, double bytesPerElem, bool fused,
             size_t each, int threads = 0, bool checkFlatten = true) {
  Params p(static_cast<size_t>(state.range(0)), each);
  OptimizerOptions o;
  o.threads = threads;  // 0: BAGUA_OPTIM_THREADS (default: hardware concurrency)
  auto opt = Opt::create(p.list, h, o);
  if (!opt.isOk()) {
    state.SkipWithError(opt.status().toString().c_str());
    return;
  }
  FuseOptions fo;
  fo.checkFlatten = checkFlatten;
  if (fused && !(*opt)->fuse(fo).isOk()) {
    state.SkipWithError("fuse failed");
    return;
  }
  for (int w = 0; w < 3; ++w) {
    (void)(fused ? (*opt)->fuseStep() : (*opt)->plainStep());
  }
  for (auto _ : state) {
    Status s = fused ? (*opt)->fuseStep() : (*opt)->plainStep();
    if (!s.isOk()) {
      state.SkipWithError(s.toString().c_str());
      return;
    }
  }
  if (fused && (*opt)->lastFusedTensors() != p.list.size()) {
    state.SkipWithError("not every tensor was fused");
    return;
  }
  const double bytes = bytesPerElem * static_cast<double>(p.elems);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  const double copy = memcpyGBps(static_cast<size_t>(bytes));
  state.counters["elems"] = static_cast<double>(p.elems);
  state.counters["GBps"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_GBps"] = copy;
  state.counters["bound"] =
      benchmark::Counter(bytes / 1e9 / copy, benchmark::Counter::kIsIterationInvariantRate);
}

AdamRule::Hyper adamHyper() {
  AdamRule::Hyper h;
  h.weightDecay = 0.01;
  return h;
}

SgdRule::Hyper sgdHyper() {
  SgdRule::Hyper h;
  h.lr = 0.01;
  h.momentum = 0.9;
  return h;
}

// Adam f32: read p, g, m, v; write p, m, v.
constexpr double kAdamBytes = 28;
// SGD with momentum f32: read p, g, b; write p, b.
constexpr double kSgdBytes = 20;

void BM_AdamFused(benchmark::State& s) {
  runStep<Adam>(s, adamHyper(), kAdamBytes, true, 0);
}
void BM_AdamPerTensor(benchmark::State& s) {
  runStep<Adam>(s, adamHyper(), kAdamBytes, false, 0);
}
void BM_SgdFused(benchmark::State& s) {
  runStep<Sgd>(s, sgdHyper(), kSgdBytes, true, 0);
}
void BM_SgdPerTensor(benchmark::State& s) {
  runStep<Sgd>(s, sgdHyper(), kSgdBytes, false, 0);
}
// Few large tensors (4 x 4M elements): the bandwidth bound without per-tensor overhead.
void BM_AdamFusedLarge(benchmark::State& s) {
  runStep<Adam>(s, adamHyper(), kAdamBytes, true, size_t{1} << 22);
}

// Host cost per step: 10,000 tensors of one element, plain SGD, one thread (ns per step).
constexpr double kPlainSgdBytes = 12;  // read p, g; write p
SgdRule::Hyper plainSgdHyper() {
  SgdRule::Hyper h;
  h.lr = 0.01;
  return h;
}
void BM_HostCostFused(benchmark::State& s) {
  runStep<Sgd>(s, plainSgdHyper(), kPlainSgdBytes, true, 1, 1, true);
}
void BM_HostCostFusedNoCheck(benchmark::State& s) {
  runStep<Sgd>(s, plainSgdHyper(), kPlainSgdBytes, true, 1, 1, false);
}
void BM_HostCostPerTensor(benchmark::State& s) {
  runStep<Sgd>(s, plainSgdHyper(), kPlainSgdBytes, false, 1, 1);
}

BENCHMARK(BM_HostCostFused)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_HostCostFusedNoCheck)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_HostCostPerTensor)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_AdamFused)->Arg(1000)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_AdamPerTensor)->Arg(1000)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_SgdFused)->Arg(1000)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_SgdPerTensor)->Arg(1000)->Arg(10000)->ArgName("tensors")->UseRealTime();
BENCHMARK(BM_AdamFusedLarge)->Arg(4)->ArgName("tensors")->UseRealTime();

}  // namespace
}  // namespace bagua::optim

BENCHMARK_MAIN();
