// bagua-autotune-bench: a data-parallel training run where the default bucket size is poor,
// with autotuning against the default and against the best fixed bucket size of a grid sweep,
// all in the same run (same process, same process group).
//
//   bagua-autotune-bench [--world=4] [--layers=64] [--tensors=8] [--numel=1024]
//                        [--fwd_us=3000] [--bwd_us=150] [--default_kib=10240]
//                        [--iters=60] [--rounds=3] [--samples=14] [--window_s=0.8]
//                        [--warmup_s=1] [--seed=0]
//                        [--transport=auto|engine] [--net_streams=4] [--segment_kib=8]
//                        [--grid_segments_kib=8,32,128,512]
//
// The model: `layers` layers of `tensors` f32 gradients of `numel` elements each (many small
// tensors). Each iteration sleeps `fwd_us` for the forward pass, then per layer (last first)
// sleeps `bwd_us` (the layer's backward compute, as on an accelerator: the CPU stays free) and
// marks its gradients ready, so communication can overlap the rest of the backward pass.
// Ranks are threads of this process over the host backend on loopback.
//
// The default is Bagua's 10 MiB bucket (BAGUA_DEFAULT_BUCKET_SIZE), used for every bucket: the
// 2 MiB model is then one bucket, reduced only after the whole backward pass (no overlap).
//
// Phases:
//   1. grid: every power-of-two bucket size from 4 KiB to the model size, in the order learned
//      from gradient-ready times (the tuner's own partition), `iters` iterations each, `rounds`
//      passes over all sizes, median per size;
//   2. autotune: a fresh reducer tuned by the Autotuner (warm-up `warmup_s`, windows of
//      `window_s`, `samples` trials); we report the wall time, iterations and throughput of the
//      tuning phase (its cost) and the setting it chose;
//   3. final: `rounds` alternating rounds of the default, the grid's best and the tuned setting,
//      `iters` iterations each; medians reported (so background load hits all three alike).
// Every reducer's first iteration is checked: each gradient must be the mean over ranks.
//
// --transport=engine: the host backend over the Bagua-Net engine (TCP, `net_streams` data
// streams per connection, BAGUA_HOST_NET_STREAMS) starting from a poor segment size
// (`segment_kib`, BAGUA_HOST_SEGMENT_BYTES: the pieces messages are cut into; pieces up to 64 KiB
// go inline on the control stream). The tuner also tunes the live transport knobs
// (host_segment_bytes, net_streams, net_chunk_bytes, autotune/transport_knobs.h), the grid sweeps
// bucket size x segment size (`grid_segments_kib`) at the default stream count, and the default
// is the 10 MiB bucket with the starting transport setting. Every contestant's transport setting
// is applied live (core::setHostTuning) before it is measured.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bagua/autotune/autotuner.h"
#include "bagua/autotune/transport_knobs.h"
#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/cli_support/cli.h"
#include "bagua/core/ddp.h"
#include "bagua/core/host_tuning.h"
#include "bagua/core/params.h"
#include "bagua/core/process_group.h"

namespace {

using namespace bagua;
using namespace bagua::core;
using namespace bagua::autotune;
using Clock = std::chrono::steady_clock;

struct Args {
  int world = 4;
  int layers = 64;
  int tensors = 8;
  int numel = 1024;
  int fwdUs = 3000;
  int bwdUs = 150;
  double defaultKib = 10240;  // Bagua's BAGUA_DEFAULT_BUCKET_SIZE (10 MiB)
  int iters = 60;
  int rounds = 3;
  int samples = 14;
  double windowS = 0.8;
  double warmupS = 1.0;
  uint64_t seed = 0;
  bool engine = false;
  int netStreams = 4;
  double segmentKib = 8;
  std::vector<uint64_t> gridSegmentsKib = {8, 32, 128, 512};
};

// Returns nullopt to run, else main's exit status (0 after --help or --version, 2 after a usage
// error).
std::optional<int> parseArgs(int argc, char** argv, Args* a) {
  using bagua::cli::flagNames;
  CLI::App app{
      "Autotuned bucket layout against Bagua's default and a grid sweep's best, same "
      "run (ranks are threads over loopback).",
      "bagua-autotune-bench"};
  bagua::cli::configure(app);
  const auto atLeast = [](double lo) { return CLI::Range(lo, 1e15); };
  app.add_option("--world", a->world, "ranks")->check(atLeast(1))->capture_default_str();
  app.add_option("--layers", a->layers, "layers of the model")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option("--tensors", a->tensors, "tensors per layer")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option("--numel", a->numel, "elements per tensor")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option(flagNames("fwd_us"), a->fwdUs, "forward time per iteration, microseconds")
      ->check(atLeast(0))
      ->capture_default_str();
  app.add_option(flagNames("bwd_us"), a->bwdUs, "backward time per layer, microseconds")
      ->check(atLeast(0))
      ->capture_default_str();
  app.add_option(flagNames("default_kib"), a->defaultKib, "the default layout's bucket, KiB")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option("--iters", a->iters, "iterations per measurement")
      ->check(atLeast(2))
      ->capture_default_str();
  app.add_option("--rounds", a->rounds, "rounds of each contestant")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option("--samples", a->samples, "the autotuner's trials")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option(flagNames("window_s"), a->windowS, "seconds each trial is measured")
      ->check(atLeast(0))
      ->capture_default_str();
  app.add_option(flagNames("warmup_s"), a->warmupS, "seconds of warm-up before the trials")
      ->check(atLeast(0))
      ->capture_default_str();
  app.add_option("--seed", a->seed, "the autotuner's random seed")->capture_default_str();
  app.add_option_function<std::string>(
         "--transport", [a](const std::string& v) { a->engine = v == "engine"; },
         "the host transport: auto (what the environment picks) or engine (Bagua-Net's TCP "
         "engine, tuned live)")
      ->check(CLI::IsMember({"auto", "engine"}))
      ->default_str("auto");
  app.add_option(flagNames("net_streams"), a->netStreams, "the engine's starting stream count")
      ->check(atLeast(1))
      ->capture_default_str();
  app.add_option(flagNames("segment_kib"), a->segmentKib, "the engine's starting segment, KiB")
      ->check(atLeast(4))
      ->capture_default_str();
  app.add_option(flagNames("grid_segments_kib"), a->gridSegmentsKib,
                 "the grid's segment sizes, KiB, comma-separated")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(atLeast(1))
      ->capture_default_str();
  return bagua::cli::parse(app, argc, argv);
}

// A transport setting of the engine (what core::setHostTuning applies).
struct Tx {
  uint64_t segment = 0;
  int streams = 0;
  uint64_t chunk = 0;
};

struct Model {
  std::vector<std::vector<float>> data, grad;
  std::vector<Parameter> params, buffers;
  Model(const Args& a) {
    const int n = a.layers * a.tensors;
    data.resize(n);
    grad.resize(n);
    for (int i = 0; i < n; ++i) {
      data[i].assign(a.numel, 0.0f);
      grad[i].assign(a.numel, 0.0f);
      Parameter p;
      p.name = "l" + std::to_string(i / a.tensors) + ".t" + std::to_string(i % a.tensors);
      p.data = data[i].data();
      p.grad = grad[i].data();
      p.numel = a.numel;
      params.push_back(p);
    }
  }
};

// One iteration: forward, backward layer by layer (last first), finish, step.
Status iteration(DistributedDataParallel& d, const Args& a) {
  BAGUA_RETURN_IF_ERROR(d.prepareForward());
  std::this_thread::sleep_for(std::chrono::microseconds(a.fwdUs));
  for (int l = a.layers - 1; l >= 0; --l) {
    std::this_thread::sleep_for(std::chrono::microseconds(a.bwdUs));
    for (int t = a.tensors - 1; t >= 0; --t) {
      BAGUA_RETURN_IF_ERROR(d.markGradReady(l * a.tensors + t));
    }
  }
  BAGUA_RETURN_IF_ERROR(d.finishBackward());
  return d.step();
}

// First iteration of a reducer: gradients rank + 1 everywhere must come back as their mean.
Status checkedIteration(DistributedDataParallel& d, Model& m, const Args& a, int rank) {
  for (auto& g : m.grad) {
    std::fill(g.begin(), g.end(), static_cast<float>(rank + 1));
  }
  BAGUA_RETURN_IF_ERROR(iteration(d, a));
  const float want = static_cast<float>(a.world + 1) / 2.0f;
  for (size_t t = 0; t < m.grad.size(); ++t) {
    for (float v : m.grad[t]) {
      if (v != want) {
        return BAGUA_ERROR(kInternal, "tensor %zu reduced to %g, want %g", t, v, want);
      }
    }
  }
  return Status::ok();
}

// The tuner's partition in the observed ready order (last layer first), as names.
std::vector<std::vector<std::string>> layoutFor(const DistributedDataParallel& d,
                                                uint64_t bucketBytes) {
  const auto& tensors = d.tensors();
  std::vector<int> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = static_cast<int>(i);  // tensors() is reverse registration = ready order here
  }
  std::vector<std::vector<std::string>> out;
  for (const auto& b : partitionBySize(tensors, order, bucketBytes)) {
    out.emplace_back();
    for (int t : b) {
      out.back().push_back(tensors[t].name);
    }
  }
  return out;
}

// Runs `iters` timed iterations (after one untimed, checked one); returns iterations/s (rank
// 0's wall time; ranks are in lockstep).
Result<double> measure(DistributedDataParallel& d, Model& m, const Args& a, int rank) {
  BAGUA_RETURN_IF_ERROR(checkedIteration(d, m, a, rank));
  BAGUA_RETURN_IF_ERROR(iteration(d, a));  // settle (layout switch, rebuild)
  BAGUA_RETURN_IF_ERROR(iteration(d, a));
  const auto t0 = Clock::now();
  for (int i = 0; i < a.iters; ++i) {
    BAGUA_RETURN_IF_ERROR(iteration(d, a));
  }
  return a.iters / std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Report {
  std::map<std::pair<uint64_t, uint64_t>, double> grid;  // (bucket, segment) bytes -> it/s
  double tuneWallS = 0;
  int64_t tuneIters = 0;
  double tuneOverheadS = 0;
  int trials = 0;
  Setting tuned;
  std::vector<double> finalDefault, finalGrid, finalTuned;
  std::pair<uint64_t, uint64_t> gridBest{0, 0};
  std::vector<std::string> knobs;
};

Status rankMain(int rank, const Args& a, std::shared_ptr<Store> store, Report* rep) {
  ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = a.world;
  po.hierarchical = false;
  if (a.engine) {
    po.hostTransport = HostTransport::kEngine;
    po.hostSharedMemory = false;
  }
  BAGUA_ASSIGN_OR_RETURN(auto pg, ProcessGroup::create(store, po));
  // Collective: every rank applies the same setting before the same measurement.
  auto setTx = [&](const Tx& t) -> Status {
    if (!a.engine) {
      return Status::ok();
    }
    HostTuning h;
    h.segmentBytes = t.segment;
    h.engineStreams = t.streams;
    h.engineChunkBytes = t.chunk;
    return setHostTuning(*pg, h, std::chrono::minutes(2));
  };
  // The chunk the default setting stands for: the engine's own rule, from its starting state.
  HostTuningState start;
  if (a.engine) {
    BAGUA_ASSIGN_OR_RETURN(start, hostTuning(*pg));
  }
  auto defaultChunk = [&](uint64_t segment) {
    return engineDefaultChunkBytes(start, segment, a.netStreams);
  };
  const uint64_t seg0 = static_cast<uint64_t>(a.segmentKib * 1024);
  const Tx defaultTx{seg0, a.netStreams, defaultChunk(seg0)};
  const std::vector<uint64_t> gridSegments =
      a.engine ? [&] {
        std::vector<uint64_t> v;
        for (uint64_t k : a.gridSegmentsKib) {
          v.push_back(k << 10);
        }
        return v;
      }()
               : std::vector<uint64_t>{0};
  Model m(a);
  uint64_t total = 0;
  for (const auto& p : m.params) {
    total += p.bytes();
  }
  auto makeReducer =
      [&](double capKib,
          std::shared_ptr<Tunable> algo) -> Result<std::unique_ptr<DistributedDataParallel>> {
    DdpOptions o;
    o.bucketCapMb = capKib / 1024.0;
    o.firstBucketBytes = static_cast<size_t>(capKib * 1024.0);  // one size for every bucket
    return withBagua(m.params, m.buffers, {}, algo, *pg, o);
  };
  auto fixed = [&](uint64_t bytes, uint64_t segment) -> Result<double> {
    BAGUA_RETURN_IF_ERROR(
        setTx(segment == 0 ? defaultTx : Tx{segment, a.netStreams, defaultChunk(segment)}));
    auto algo = std::make_shared<Tunable>(std::make_shared<GradientAllReduce>());
    BAGUA_ASSIGN_OR_RETURN(auto d, makeReducer(a.defaultKib, algo));
    BAGUA_RETURN_IF_ERROR(algo->schedule(1, layoutFor(*d, bytes)));
    return measure(*d, m, a, rank);
  };
  auto deflt = [&]() -> Result<double> {
    BAGUA_RETURN_IF_ERROR(setTx(defaultTx));
    auto algo = std::make_shared<Tunable>(std::make_shared<GradientAllReduce>());
    BAGUA_ASSIGN_OR_RETURN(auto d, makeReducer(a.defaultKib, algo));
    return measure(*d, m, a, rank);
  };

  // 1. Grid: `rounds` passes over every size (x segment size on the engine), median per point.
  // The engine grid steps the bucket size by 4x to keep the sweep short.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<double>> gridRuns;
  for (int r = 0; r < a.rounds; ++r) {
    for (uint64_t b = a.engine ? 16384 : 4096; b < 2 * total; b *= a.engine ? 4 : 2) {
      for (uint64_t seg : gridSegments) {
        BAGUA_ASSIGN_OR_RETURN(double ips, fixed(b, seg));
        gridRuns[{b, seg}].push_back(ips);
      }
    }
  }
  if (rank == 0) {
    for (const auto& [key, runs] : gridRuns) {
      rep->grid[key] = median(runs);
      std::fprintf(stderr, "grid bucket %8llu KiB segment %5llu KiB: median %.2f it/s\n",
                   static_cast<unsigned long long>(key.first >> 10),
                   static_cast<unsigned long long>(key.second >> 10), rep->grid[key]);
    }
  }
  std::pair<uint64_t, uint64_t> best{0, 0};
  if (rank == 0) {
    for (const auto& [key, ips] : rep->grid) {
      if (best.first == 0 || ips > rep->grid[best]) {
        best = key;
      }
    }
    BAGUA_RETURN_IF_ERROR(store->set(
        "bench/gridbest", toBytes(std::to_string(best.first) + " " + std::to_string(best.second))));
    rep->gridBest = best;
  } else {
    BAGUA_ASSIGN_OR_RETURN(Bytes v, store->get("bench/gridbest", std::chrono::minutes(10)));
    const std::string text = toString(v);
    best.first = std::stoull(text);
    best.second = std::stoull(text.substr(text.find(' ') + 1));
  }

  // 2. Autotune from the default.
  Setting tuned;
  {
    BAGUA_RETURN_IF_ERROR(setTx(defaultTx));
    auto algo = std::make_shared<Tunable>(std::make_shared<GradientAllReduce>());
    BAGUA_ASSIGN_OR_RETURN(auto d, makeReducer(a.defaultKib, algo));
    BAGUA_RETURN_IF_ERROR(checkedIteration(*d, m, a, rank));
    AutotuneOptions o;
    o.model = "bench";
    o.enabled = true;
    o.maxSamples = a.samples;
    o.warmupTimeS = a.warmupS;
    o.samplingConfidenceTimeS = a.windowS;
    o.checkInterval = 5;
    o.seed = a.seed;
    o.logFile = "";
    o.saveFile = "";
    o.loadFile = "";
    o.minBucketBytes = 4096;
    if (a.engine) {
      TransportKnobRanges ranges;
      ranges.minSegmentBytes = 4 << 10;
      ranges.maxSegmentBytes = 1 << 20;
      ranges.minChunkBytes = 16 << 10;
      ranges.maxChunkBytes = 1 << 20;
      o.knobs = transportKnobs(*pg, ranges);
      if (rank == 0) {
        for (const Knob& k : o.knobs) {
          rep->knobs.push_back(k.dimension.name);
        }
      }
    }
    BAGUA_ASSIGN_OR_RETURN(auto tuner, Autotuner::create(*d, *algo, o));
    const auto t0 = Clock::now();
    int64_t n = 0;
    while (tuner->tuning()) {
      BAGUA_RETURN_IF_ERROR(iteration(*d, a));
      BAGUA_RETURN_IF_ERROR(tuner->onIterationEnd());
      ++n;
    }
    tuned = tuner->current();
    if (rank == 0) {
      rep->tuneWallS = std::chrono::duration<double>(Clock::now() - t0).count();
      rep->tuneIters = n;
      rep->tuneOverheadS = tuner->overheadSeconds();
      rep->trials = static_cast<int>(tuner->trials().size());
      rep->tuned = tuned;
      for (const Trial& t : tuner->trials()) {
        std::string knobs;
        for (const auto& [name, value] : t.setting.knobs) {
          knobs += strPrintf(" %s=%lld", name.c_str(), static_cast<long long>(value));
        }
        std::fprintf(stderr, "trial %2d: bucket %8llu B, %3d buckets%s: %.2f it/s\n", t.index,
                     static_cast<unsigned long long>(t.setting.bucketBytes), t.bucketCount,
                     knobs.c_str(), t.score);
      }
    }
  }

  // 3. Final: alternate default, grid best and tuned.
  for (int r = 0; r < a.rounds; ++r) {
    BAGUA_ASSIGN_OR_RETURN(double d0, deflt());
    BAGUA_ASSIGN_OR_RETURN(double g0, fixed(best.first, best.second));
    double t0 = 0;
    {
      if (a.engine) {
        for (const char* k : {"host_segment_bytes", "net_streams", "net_chunk_bytes"}) {
          if (tuned.knobs.count(k) == 0) {
            return BAGUA_ERROR(kInternal, "the tuned setting has no '%s' knob", k);
          }
        }
        BAGUA_RETURN_IF_ERROR(setTx(Tx{static_cast<uint64_t>(tuned.knobs["host_segment_bytes"]),
                                       static_cast<int>(tuned.knobs["net_streams"]),
                                       static_cast<uint64_t>(tuned.knobs["net_chunk_bytes"])}));
      }
      auto algo = std::make_shared<Tunable>(std::make_shared<GradientAllReduce>());
      BAGUA_ASSIGN_OR_RETURN(auto d, makeReducer(a.defaultKib, algo));
      BAGUA_RETURN_IF_ERROR(algo->schedule(1, tuned.buckets));
      BAGUA_ASSIGN_OR_RETURN(t0, measure(*d, m, a, rank));
    }
    if (rank == 0) {
      rep->finalDefault.push_back(d0);
      rep->finalGrid.push_back(g0);
      rep->finalTuned.push_back(t0);
    }
  }
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (std::optional<int> rc = parseArgs(argc, argv, &a)) {
    return *rc;
  }
  if (a.engine) {
    // The starting transport setting comes from core's parameters, as in a training job.
    Status s = coreParams().hostNetStreams.setOverride(a.netStreams);
    if (s.isOk()) {
      s = coreParams().hostSegmentBytes.setOverride(static_cast<uint64_t>(a.segmentKib * 1024));
    }
    if (!s.isOk()) {
      std::fprintf(stderr, "%s\n", s.toString().c_str());
      return 2;
    }
  }
  auto store = std::make_shared<InMemoryStore>();
  Report rep;
  std::vector<std::string> errors(a.world);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < a.world; ++r) {
      ranks.emplace_back([&, r] {
        setThreadName("bagua-bench-r" + std::to_string(r));
        Status s = rankMain(r, a, store, &rep);
        if (!s.isOk()) {
          errors[r] = s.toString();
        }
      });
    }
  }
  for (int r = 0; r < a.world; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
      return 1;
    }
  }
  const size_t tensors = static_cast<size_t>(a.layers) * a.tensors;
  const double modelKib = static_cast<double>(tensors * a.numel * 4) / 1024.0;
  const double dm = median(rep.finalDefault), gm = median(rep.finalGrid),
               tm = median(rep.finalTuned);
  std::printf("model: %zu f32 tensors of %d elements (%.0f KiB), %d ranks, host backend%s\n",
              tensors, a.numel, modelKib, a.world,
              a.engine ? strPrintf(" over the engine (%d streams, start segment %.0f KiB)",
                                   a.netStreams, a.segmentKib)
                             .c_str()
                       : "");
  std::printf("grid (%zu points): best bucket %llu KiB segment %llu KiB at %.2f it/s\n",
              rep.grid.size(), static_cast<unsigned long long>(rep.gridBest.first >> 10),
              static_cast<unsigned long long>(rep.gridBest.second >> 10), rep.grid[rep.gridBest]);
  std::string knobs;
  for (const auto& [name, value] : rep.tuned.knobs) {
    knobs += strPrintf(", %s %lld", name.c_str(), static_cast<long long>(value));
  }
  std::printf(
      "autotune: %d trials in %.1f s (%lld iterations, %.2f it/s while tuning, %.3f s in "
      "the tuner on rank 0); chose %llu KiB (%zu buckets)%s\n",
      rep.trials, rep.tuneWallS, static_cast<long long>(rep.tuneIters),
      rep.tuneIters / rep.tuneWallS, rep.tuneOverheadS,
      static_cast<unsigned long long>(rep.tuned.bucketBytes >> 10), rep.tuned.buckets.size(),
      knobs.c_str());
  std::printf("final (median of %d alternating rounds of %d iterations):\n", a.rounds, a.iters);
  for (int r = 0; r < a.rounds; ++r) {
    std::printf("  round %d: default %.2f, grid best %.2f, autotuned %.2f it/s\n", r,
                rep.finalDefault[r], rep.finalGrid[r], rep.finalTuned[r]);
  }
  std::printf("  default %.0f KiB : %.2f it/s\n", a.defaultKib, dm);
  std::printf("  grid best        : %.2f it/s\n", gm);
  std::printf("  autotuned        : %.2f it/s\n", tm);
  std::printf(
      "ratios: autotuned/default %.3f, autotuned/grid-best %.3f, tuning-phase/grid-best "
      "%.3f\n",
      tm / dm, tm / gm, (rep.tuneIters / rep.tuneWallS) / gm);
  return 0;
}
