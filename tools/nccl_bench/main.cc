// bagua-nccl-bench: a real NCCL all-reduce across the GPUs of one host, one process per GPU,
// timed as nccl-tests times it (algbw = bytes / time, busbw = algbw * 2(n-1)/n) and checked for
// correctness. Which network NCCL uses is decided by the environment the caller sets
// (NCCL_NET_PLUGIN, NCCL_NET, NCCL_P2P_DISABLE, ...), so one binary measures NCCL's Socket
// transport and Bagua-Net alike; bench/gpu/run.sh runs it once per transport in one go.
//
// usage: bagua-nccl-bench [--ranks N] [--min BYTES] [--max BYTES] [--iters N] [--warmup N]
//                         [--label NAME] [--json FILE]
//
// Ranks are forked before CUDA is touched; rank 0 makes the NCCL unique id and hands it to the
// others through pipes; each rank reports its times to rank 0 through another pipe, and the
// figure printed is the mean over ranks (nccl-tests' default, -a 1).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/base/status.h"
#include "bagua/gpu_tool_support/gpu_tool.h"

namespace {

struct Options {
  int ranks = 2;
  uint64_t minBytes = 1 << 20;
  uint64_t maxBytes = uint64_t{1} << 30;
  int iters = 20;
  int warmup = 5;
  std::string label = "nccl";
  std::string json;
  // Every rank on GPU 0 (MPS shares it), each with its own NCCL_HOSTID, so that NCCL takes the
  // network path between ranks of one GPU (issue 21's method for 4 ranks on one GPU).
  bool shareGpu = false;
};

struct Row {
  uint64_t bytes;
  double usec;  // mean over ranks of the per-iteration time
  bool correct;
};

// Values small enough that sums over a few ranks are exact in fp32.
float pattern(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 3 + static_cast<int>((i * 7) % 29));
}

std::vector<double> runRank(const Options& o, int rank, const ncclUniqueId& id,
                            std::vector<char>* correct) {
  bagua::tools::toolRank() = rank;
  if (o.shareGpu && !bagua::processEnv("NCCL_HOSTID").has_value()) {
    // Read by NCCL at its first init in this (forked, not yet NCCL-initialised) process.
    setenv("NCCL_HOSTID", ("bagua-nccl-bench-rank" + std::to_string(rank)).c_str(), 1);
  }
  BAGUA_TOOL_CHECK_CUDA(cudaSetDevice(o.shareGpu ? 0 : rank));
  ncclComm_t comm;
  BAGUA_TOOL_CHECK_NCCL(ncclCommInitRank(&comm, o.ranks, id, rank));
  cudaStream_t stream;
  BAGUA_TOOL_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t maxCount = o.maxBytes / sizeof(float);
  float* send = nullptr;
  float* recv = nullptr;
  BAGUA_TOOL_CHECK_CUDA(cudaMalloc(&send, maxCount * sizeof(float)));
  BAGUA_TOOL_CHECK_CUDA(cudaMalloc(&recv, maxCount * sizeof(float)));
  std::vector<float> host(maxCount);
  for (size_t i = 0; i < maxCount; ++i) {
    host[i] = pattern(rank, i);
  }
  BAGUA_TOOL_CHECK_CUDA(
      cudaMemcpy(send, host.data(), maxCount * sizeof(float), cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  BAGUA_TOOL_CHECK_CUDA(cudaEventCreate(&start));
  BAGUA_TOOL_CHECK_CUDA(cudaEventCreate(&stop));

  std::vector<double> times;
  for (uint64_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 2) {
    size_t count = bytes / sizeof(float);
    for (int i = 0; i < o.warmup; ++i) {
      BAGUA_TOOL_CHECK_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    }
    BAGUA_TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
    BAGUA_TOOL_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < o.iters; ++i) {
      BAGUA_TOOL_CHECK_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    }
    BAGUA_TOOL_CHECK_CUDA(cudaEventRecord(stop, stream));
    BAGUA_TOOL_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BAGUA_TOOL_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1000.0 * ms / o.iters);

    // Check every element of the last result against the closed form.
    BAGUA_TOOL_CHECK_CUDA(
        cudaMemcpy(host.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (size_t i = 0; i < count && ok; ++i) {
      float want = 0;
      for (int r = 0; r < o.ranks; ++r) {
        want += pattern(r, i);
      }
      if (host[i] != want) {
        std::fprintf(stderr, "rank %d: %" PRIu64 " bytes: element %zu is %g, expected %g\n", rank,
                     bytes, i, host[i], want);
        ok = false;
      }
    }
    correct->push_back(ok ? 1 : 0);
  }
  BAGUA_TOOL_CHECK_CUDA(cudaFree(send));
  BAGUA_TOOL_CHECK_CUDA(cudaFree(recv));
  BAGUA_TOOL_CHECK_NCCL(ncclCommDestroy(comm));
  return times;
}

bagua::Result<uint64_t> bytesArg(const char* key, const char* v) {
  bagua::Result<uint64_t> r = bagua::parseBytes(v);
  if (!r.isOk()) {
    return BAGUA_ERROR(kInvalidArgument, "%s %s: %s", key, v, r.status().message().c_str());
  }
  return r;
}

void usage() {
  std::printf(
      "usage: bagua-nccl-bench [--ranks N] [--min BYTES] [--max BYTES] [--iters N]\n"
      "                        [--warmup N] [--label NAME] [--json FILE] [--share-gpu]\n"
      "Float sum all-reduce over N GPUs (one process each), sizes doubling from --min to\n"
      "--max (K/M/G suffixes), every result checked. The transport is whatever the NCCL\n"
      "environment selects. --share-gpu puts every rank on GPU 0 (run under MPS), each\n"
      "with its own NCCL_HOSTID, so NCCL takes the network path between them.\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bagua-nccl-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto intArg = [&](const char* v) {
      bagua::Result<int64_t> r = bagua::parseInt(v);
      if (!r.isOk() || *r <= 0 || *r > 1000000) {
        std::fprintf(stderr, "bagua-nccl-bench: %s wants a positive integer, got '%s'\n", a.c_str(),
                     v);
        std::exit(2);
      }
      return static_cast<int>(*r);
    };
    if (a == "--ranks") {
      o.ranks = intArg(next());
    } else if (a == "--iters") {
      o.iters = intArg(next());
    } else if (a == "--warmup") {
      o.warmup = intArg(next());
    } else if (a == "--min" || a == "--max") {
      bagua::Result<uint64_t> b = bytesArg(a.c_str(), next());
      if (!b.isOk()) {
        std::fprintf(stderr, "bagua-nccl-bench: %s\n", b.status().message().c_str());
        return 2;
      }
      (a == "--min" ? o.minBytes : o.maxBytes) = *b;
    } else if (a == "--label") {
      o.label = next();
    } else if (a == "--json") {
      o.json = next();
    } else if (a == "--share-gpu") {
      o.shareGpu = true;
    } else if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "bagua-nccl-bench: unknown argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (o.minBytes < 4 || o.minBytes > o.maxBytes) {
    std::fprintf(stderr, "bagua-nccl-bench: need 4 <= --min <= --max\n");
    return 2;
  }

  // Rank 0 (this process) makes the id after forking the others, so no CUDA state is forked.
  // Each rank reports its times and checks to rank 0 through its result pipe.
  bagua::tools::ForkedRanks ranks;
  const bool forked = bagua::tools::forkRanks(
      o.ranks,
      [&](int r, const ncclUniqueId& id, int resultFd) {
        std::vector<char> correct;
        std::vector<double> t = runRank(o, r, id, &correct);
        uint32_t n = static_cast<uint32_t>(t.size());
        bool ok = bagua::tools::writeAll(resultFd, &n, sizeof(n)) &&
                  bagua::tools::writeAll(resultFd, t.data(), n * sizeof(double)) &&
                  bagua::tools::writeAll(resultFd, correct.data(), n);
        return ok ? 0 : 6;
      },
      &ranks);
  if (!forked) {
    return 1;
  }
  const ncclUniqueId& id = ranks.id;
  int version = 0;
  BAGUA_TOOL_CHECK_NCCL(ncclGetVersion(&version));
  std::vector<char> correct;
  std::vector<double> mine = runRank(o, 0, id, &correct);
  std::vector<double> sum = mine;
  bool allOk = true;
  for (int r = 1; r < o.ranks; ++r) {
    uint32_t n = 0;
    std::vector<double> t;
    std::vector<char> c;
    bool ok = bagua::tools::readAll(ranks.results[r - 1], &n, sizeof(n)) && n == mine.size();
    if (ok) {
      t.resize(n);
      c.resize(n);
      ok = bagua::tools::readAll(ranks.results[r - 1], t.data(), n * sizeof(double)) &&
           bagua::tools::readAll(ranks.results[r - 1], c.data(), n);
    }
    if (!ok) {
      std::fprintf(stderr, "rank 0: no results from rank %d\n", r);
      allOk = false;
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      sum[i] += t[i];
      correct[i] = static_cast<char>(correct[i] && c[i]);
    }
  }
  if (!bagua::tools::waitRanks(ranks)) {
    allOk = false;
  }

  std::vector<Row> rows;
  size_t i = 0;
  for (uint64_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 2, ++i) {
    rows.push_back({bytes, sum[i] / o.ranks, correct[i] != 0});
  }
  double factor = 2.0 * (o.ranks - 1) / o.ranks;
  std::printf("# %s: NCCL %d, %d ranks, float sum, %d iters after %d warm-up, mean over ranks\n",
              o.label.c_str(), version, o.ranks, o.iters, o.warmup);
  std::printf("%12s %12s %10s %10s %8s\n", "bytes", "time(us)", "algbw", "busbw", "check");
  FILE* js = o.json.empty() ? nullptr : std::fopen(o.json.c_str(), "w");
  if (js != nullptr) {
    std::fprintf(js, "{\"label\": \"%s\", \"nccl_version\": %d, \"ranks\": %d, \"rows\": [",
                 o.label.c_str(), version, o.ranks);
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    const Row& r = rows[k];
    double algbw = static_cast<double>(r.bytes) / 1e3 / r.usec;  // GB/s
    double busbw = algbw * factor;
    std::printf("%12" PRIu64 " %12.1f %10.2f %10.2f %8s\n", r.bytes, r.usec, algbw, busbw,
                r.correct ? "ok" : "WRONG");
    if (js != nullptr) {
      std::fprintf(js,
                   "%s{\"bytes\": %" PRIu64
                   ", \"usec\": %.2f, \"algbw\": %.3f, \"busbw\": %.3f, \"correct\": %s}",
                   k == 0 ? "" : ", ", r.bytes, r.usec, algbw, busbw, r.correct ? "true" : "false");
    }
    allOk = allOk && r.correct;
  }
  if (js != nullptr) {
    std::fprintf(js, "]}\n");
    std::fclose(js);
  }
  return allOk ? 0 : 1;
}
