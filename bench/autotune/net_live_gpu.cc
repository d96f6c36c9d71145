// bagua-autotune-net-live-bench: Bagua-Net's live knobs inside a real NCCL run (GPU variant of
// the autotune benchmark). Two ranks (one process per GPU, NCCL forced onto the net plugin by the
// caller's environment: NCCL_NET_PLUGIN=bagua, NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1, ...) run
// float sum all-reduces of --bytes; between batches each rank switches the plugin that NCCL
// loaded in its own process (autotune::NetPluginLive: baguaNetSetLive_v1 found with
// dl_iterate_phdr + RTLD_NOLOAD) to another (active streams, chunk size) setting:
//   1. grid: streams {1, 2, 4, 8} x chunk {128 KiB, 512 KiB, 2 MiB}, `rounds` passes, median;
//   2. autotune: the GP optimiser (autotune::BayesianOptimizer) over streams 1..8 and chunk
//      64 KiB..4 MiB (log), `samples` trials, every trial applied live;
//   3. final: `rounds` alternating rounds of the plugin's default, the grid's best and the
//      autotuned setting; medians.
// Every batch's result is checked element by element. Scores are the mean over ranks of the
// batch time (a one-element NCCL all-reduce), so both ranks take identical decisions.
//
// usage: bagua-autotune-net-live-bench [--bytes 32M] [--iters 10] [--rounds 3] [--samples 16]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bagua/autotune/optimizer.h"
#include "bagua/autotune/transport_knobs.h"
#include "bagua/base/params.h"
#include "bagua/base/status.h"
#include "bagua/cli_support/cli.h"
#include "bagua/gpu_tool_support/gpu_tool.h"

namespace {

using namespace bagua;
using namespace bagua::autotune;

struct Options {
  uint64_t bytes = 32 << 20;
  int iters = 10;
  int rounds = 3;
  int samples = 16;
};

constexpr int kRanks = 2;

float pattern(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 5 + static_cast<int>((i * 11) % 31));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Setting {
  int streams = 0;     // 0: the plugin's default (BAGUA_NET_NSTREAMS)
  uint64_t chunk = 0;  // 0: the plugin's default chunk bounds
  std::string str() const {
    if (streams == 0 && chunk == 0) {
      return "default";
    }
    return strPrintf("%d streams, chunk %llu KiB", streams,
                     static_cast<unsigned long long>(chunk >> 10));
  }
};

class Rank {
 public:
  Rank(const Options& o, int rank) : o_(o), rank_(rank) {}

  int run(const ncclUniqueId& id) {
    bagua::tools::toolRank() = rank_;
    BAGUA_TOOL_CHECK_CUDA(cudaSetDevice(rank_));
    BAGUA_TOOL_CHECK_NCCL(ncclCommInitRank(&comm_, kRanks, id, rank_));
    BAGUA_TOOL_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    count_ = o_.bytes / sizeof(float);
    BAGUA_TOOL_CHECK_CUDA(cudaMalloc(&send_, count_ * sizeof(float)));
    BAGUA_TOOL_CHECK_CUDA(cudaMalloc(&recv_, count_ * sizeof(float)));
    BAGUA_TOOL_CHECK_CUDA(cudaMalloc(&scalar_, sizeof(float)));
    host_.resize(count_);
    for (size_t i = 0; i < count_; ++i) {
      host_[i] = pattern(rank_, i);
    }
    BAGUA_TOOL_CHECK_CUDA(
        cudaMemcpy(send_, host_.data(), count_ * sizeof(float), cudaMemcpyHostToDevice));
    BAGUA_TOOL_CHECK_CUDA(cudaEventCreate(&start_));
    BAGUA_TOOL_CHECK_CUDA(cudaEventCreate(&stop_));
    batch();  // NCCL connects (and so loads the plugin) on the first collective

    Result<std::unique_ptr<NetPluginLive>> live = NetPluginLive::find();
    if (!live.isOk()) {
      std::fprintf(stderr, "rank %d: %s\n", rank_, live.status().toString().c_str());
      return 7;
    }
    plugin_ = std::move(*live);
    say("plugin: %s\n", plugin_->path().c_str());

    // 1. Grid.
    std::vector<Setting> grid;
    for (int s : {1, 2, 4, 8}) {
      for (uint64_t c : {uint64_t{128} << 10, uint64_t{512} << 10, uint64_t{2} << 20}) {
        grid.push_back({s, c});
      }
    }
    std::vector<std::vector<double>> gridRuns(grid.size());
    for (int r = 0; r < o_.rounds; ++r) {
      for (size_t g = 0; g < grid.size(); ++g) {
        gridRuns[g].push_back(measure(grid[g]));
      }
    }
    size_t best = 0;
    for (size_t g = 0; g < grid.size(); ++g) {
      say("grid %-28s %8.2f GB/s\n", grid[g].str().c_str(), median(gridRuns[g]));
      if (median(gridRuns[g]) > median(gridRuns[best])) {
        best = g;
      }
    }

    // 2. Autotune (identical decisions on both ranks: same seed, same mean scores).
    Result<SearchSpace> space = SearchSpace::create(
        {Dimension::integer("net_streams", 1, 8),
         Dimension::logInteger("net_chunk_bytes", int64_t{64} << 10, int64_t{4} << 20)});
    OptimizerOptions oo;
    oo.seed = 7;
    Result<BayesianOptimizer> bo = BayesianOptimizer::create(*space, oo);
    if (!space.isOk() || !bo.isOk()) {
      std::fprintf(stderr, "rank %d: optimiser set-up failed\n", rank_);
      return 8;
    }
    for (int t = 0; t < o_.samples; ++t) {
      Result<Point> p = bo->ask();
      if (!p.isOk()) {
        std::fprintf(stderr, "rank %d: %s\n", rank_, p.status().toString().c_str());
        return 8;
      }
      const Setting s{static_cast<int>((*p)[0]), static_cast<uint64_t>((*p)[1])};
      const double score = measure(s);
      say("trial %2d %-28s %8.2f GB/s\n", t, s.str().c_str(), score);
      if (!bo->tell(*p, score).isOk()) {
        return 8;
      }
    }
    const Point tp = *bo->best();
    const Setting tuned{static_cast<int>(tp[0]), static_cast<uint64_t>(tp[1])};

    // 3. Final: alternate default, grid best, autotuned.
    std::vector<double> d, g, a;
    for (int r = 0; r < o_.rounds; ++r) {
      d.push_back(measure(Setting{}));
      g.push_back(measure(grid[best]));
      a.push_back(measure(tuned));
    }
    say("bytes %llu, %d ranks, %d all-reduces per batch, every result checked: %s\n",
        static_cast<unsigned long long>(o_.bytes), kRanks, o_.iters, wrong_ == 0 ? "ok" : "WRONG");
    say("default                                   : %8.2f GB/s\n", median(d));
    say("grid best (%-28s)  : %8.2f GB/s\n", grid[best].str().c_str(), median(g));
    say("autotuned (%-28s)  : %8.2f GB/s\n", tuned.str().c_str(), median(a));
    say("ratios: autotuned/default %.3f, autotuned/grid-best %.3f\n", median(a) / median(d),
        median(a) / median(g));
    (void)plugin_->set({});
    BAGUA_TOOL_CHECK_CUDA(cudaFree(send_));
    BAGUA_TOOL_CHECK_CUDA(cudaFree(recv_));
    BAGUA_TOOL_CHECK_CUDA(cudaFree(scalar_));
    BAGUA_TOOL_CHECK_NCCL(ncclCommDestroy(comm_));
    return wrong_ == 0 ? 0 : 9;
  }

 private:
  void say(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (rank_ == 0) {
      va_list ap;
      va_start(ap, fmt);
      std::vprintf(fmt, ap);
      va_end(ap);
      std::fflush(stdout);
    }
  }

  // One batch of `iters` all-reduces; returns this rank's seconds.
  double batch() {
    BAGUA_TOOL_CHECK_CUDA(cudaStreamSynchronize(stream_));
    BAGUA_TOOL_CHECK_CUDA(cudaEventRecord(start_, stream_));
    for (int i = 0; i < o_.iters; ++i) {
      BAGUA_TOOL_CHECK_NCCL(
          ncclAllReduce(send_, recv_, count_, ncclFloat, ncclSum, comm_, stream_));
    }
    BAGUA_TOOL_CHECK_CUDA(cudaEventRecord(stop_, stream_));
    BAGUA_TOOL_CHECK_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    BAGUA_TOOL_CHECK_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    BAGUA_TOOL_CHECK_CUDA(
        cudaMemcpy(host_.data(), recv_, count_ * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count_; ++i) {
      const float want = pattern(0, i) + pattern(1, i);
      if (host_[i] != want) {
        if (wrong_++ == 0) {
          std::fprintf(stderr, "rank %d: element %zu is %g, want %g\n", rank_, i, host_[i], want);
        }
        break;
      }
    }
    return ms / 1000.0;
  }

  // Applies `s` live, runs a warm-up batch and a timed one; returns algbw in GB/s from the mean
  // time over ranks.
  double measure(const Setting& s) {
    Status st = plugin_->set({s.streams, s.chunk, s.chunk});
    if (!st.isOk()) {
      std::fprintf(stderr, "rank %d: %s\n", rank_, st.toString().c_str());
      std::exit(10);
    }
    batch();
    auto secs = static_cast<float>(batch());
    BAGUA_TOOL_CHECK_CUDA(cudaMemcpy(scalar_, &secs, sizeof(float), cudaMemcpyHostToDevice));
    BAGUA_TOOL_CHECK_NCCL(ncclAllReduce(scalar_, scalar_, 1, ncclFloat, ncclSum, comm_, stream_));
    BAGUA_TOOL_CHECK_CUDA(cudaStreamSynchronize(stream_));
    BAGUA_TOOL_CHECK_CUDA(cudaMemcpy(&secs, scalar_, sizeof(float), cudaMemcpyDeviceToHost));
    const double mean = static_cast<double>(secs) / kRanks;
    return static_cast<double>(o_.bytes) * o_.iters / mean / 1e9;
  }

  Options o_;
  int rank_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  float* send_ = nullptr;
  float* recv_ = nullptr;
  float* scalar_ = nullptr;
  size_t count_ = 0;
  std::vector<float> host_;
  std::unique_ptr<NetPluginLive> plugin_;
  int wrong_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Bagua-Net's live knobs inside a real NCCL run on two GPUs: the plugin's default, "
      "a grid's best and the optimiser's choice, every result checked.",
      "bagua-autotune-net-live-bench"};
  bagua::cli::configure(app);
  bagua::cli::addBytes(app, "--bytes", &o.bytes, 1024, "bytes of each all-reduce");
  app.add_option("--iters", o.iters, "all-reduces per batch")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--rounds", o.rounds, "grid passes and final rounds")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--samples", o.samples, "the optimiser's trials")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  // Rank 1 is forked before CUDA is touched; rank 0 makes the NCCL id and pipes it over.
  bagua::tools::ForkedRanks ranks;
  if (!bagua::tools::forkRanks(
          kRanks, [&](int r, const ncclUniqueId& id, int) { return Rank(o, r).run(id); }, &ranks)) {
    return 1;
  }
  const int rc = Rank(o, 0).run(ranks.id);
  if (!bagua::tools::waitRanks(ranks)) {
    return rc != 0 ? rc : 1;
  }
  return rc;
}
