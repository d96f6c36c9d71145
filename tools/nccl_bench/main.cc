// bagua-nccl-bench: a real NCCL all-reduce across the GPUs of one host, one process per GPU,
// timed as nccl-tests times it (algbw = bytes / time, busbw = algbw * 2(n-1)/n) and checked for
// correctness. Which network NCCL uses is decided by the environment the caller sets
// (NCCL_NET_PLUGIN, NCCL_NET, NCCL_P2P_DISABLE, ...), so one binary measures NCCL's Socket
// transport and Bagua-Net alike; bench/gpu/run.sh runs it once per transport in one go.
//
// usage: bagua-nccl-bench [--ranks N] [--min BYTES] [--max BYTES] [--iters N] [--warmup N]
//                         [--label NAME] [--json FILE] [--share-gpu | --own-host]
//                         [--iter-bytes BYTES] [--tcp-ceiling S[,S...]] [--tcp-min BYTES]
//
// Ranks are forked before CUDA is touched; rank 0 makes the NCCL unique id and hands it to the
// others through pipes; each rank reports its times to rank 0 through another pipe, and the
// figure printed is the mean over ranks (nccl-tests' default, -a 1). Each rank also measures the
// CPU time (user + system) its process spent in each size's timed loop, all threads but the one
// that launches and waits (so: NCCL's proxy threads and the net plugin's own), reported per GB
// the ranks sent (2(n-1) x size per all-reduce).
//
// --tcp-ceiling S: after the all-reduces, the same rank processes move the same bytes over plain
// TCP with no NCCL: each rank sends what a ring all-reduce sends per rank (2(n-1)/n x size) to the
// next rank over S loopback sockets (one thread each way per socket, pinned host buffers like
// NCCL's staging buffers), receiving as much from the previous one. Its rate is the ceiling a
// TCP transport can reach on this host in this layout (the all-reduce's busbw cannot exceed it),
// with its CPU s/GB.
#include <cuda_runtime.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/base/status.h"
#include "bagua/cli_support/cli.h"
#include "bagua/gpu_tool_support/gpu_tool.h"
#include "bagua/net/socket_io.h"

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
  // network path between ranks of one GPU (how 4 ranks run on one GPU).
  bool shareGpu = false;
  // Every rank on its own GPU and with its own NCCL_HOSTID: NCCL sees one rank per node.
  bool ownHost = false;
  // When set, a size runs max(5, min(iters, ceil(iterBytes / size))) timed iterations (so that a
  // sweep up to 1 GiB fits a short device call), with warm-up runs up to half of those.
  uint64_t iterBytes = 0;
  std::vector<int> tcpStreams;  // --tcp-ceiling
  uint64_t tcpMin = uint64_t{64} << 20;
};

// Timed iterations and warm-up runs for `bytes`.
int itersFor(const Options& o, uint64_t bytes) {
  if (o.iterBytes == 0) {
    return o.iters;
  }
  const uint64_t want = (o.iterBytes + bytes - 1) / bytes;
  return static_cast<int>(std::clamp<uint64_t>(want, std::min(5, o.iters), o.iters));
}
int warmupFor(const Options& o, uint64_t bytes) {
  return o.iterBytes == 0 ? o.warmup : std::max(1, std::min(o.warmup, itersFor(o, bytes) / 2));
}

// What one rank measured for one size: time per all-reduce (us), the CPU seconds of its process
// and of its launching thread over the timed loop, and whether the result was right.
struct Sample {
  double usec = 0;
  double cpu = 0;
  double launchCpu = 0;
  char correct = 0;
};

struct Row {
  uint64_t bytes;
  int iters;
  double usec;  // mean over ranks of the per-iteration time
  double cpu;   // CPU seconds of all ranks in the timed loop, launching threads left out
  bool correct;
};

// One TCP-ceiling measurement: streams, bytes (the all-reduce size it stands for), and per rank
// the seconds and CPU seconds of the timed loop.
struct TcpSample {
  int32_t streams = 0;
  uint64_t bytes = 0;
  int32_t iters = 0;
  double seconds = 0;
  double cpu = 0;
};

double processCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Values small enough that sums over a few ranks are exact in fp32.
float pattern(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 3 + static_cast<int>((i * 7) % 29));
}

[[noreturn]] void tcpDie(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: tcp ceiling: %s: %s\n", rank, what.c_str(), std::strerror(errno));
  std::exit(7);
}

// The TCP ceiling (see the header): S sockets from each rank to the next, ports handed round with
// an all-gather on the communicator that is already up, then the same bytes as the all-reduces
// moved with plain blocking send/recv, no NCCL. Appends one TcpSample per stream count and size.
void tcpCeiling(const Options& o, int rank, ncclComm_t comm, cudaStream_t stream,
                std::vector<TcpSample>* out) {
  const int n = o.ranks;
  uint64_t maxPerRank = o.maxBytes / static_cast<uint64_t>(n) * 2 * static_cast<uint64_t>(n - 1);
  void* sendHost = nullptr;
  void* recvHost = nullptr;
  BAGUA_TOOL_CHECK_CUDA(cudaHostAlloc(&sendHost, maxPerRank, cudaHostAllocDefault));
  BAGUA_TOOL_CHECK_CUDA(cudaHostAlloc(&recvHost, maxPerRank, cudaHostAllocDefault));
  std::memset(sendHost, 0x5a, maxPerRank);
  int* devPorts = nullptr;
  BAGUA_TOOL_CHECK_CUDA(cudaMalloc(&devPorts, sizeof(int) * 64 * static_cast<size_t>(n)));
  for (int streams : o.tcpStreams) {
    std::vector<int> listeners(static_cast<size_t>(streams));
    std::vector<int> ports(64, 0);
    for (int s = 0; s < streams; ++s) {
      int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof(sa);
      if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
          ::listen(l, 64) != 0 || getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
        tcpDie(rank, "listen");
      }
      listeners[static_cast<size_t>(s)] = l;
      ports[static_cast<size_t>(s)] = ntohs(sa.sin_port);
    }
    // Everyone's ports, through the communicator (64 slots per rank).
    BAGUA_TOOL_CHECK_CUDA(
        cudaMemcpy(devPorts + 64 * rank, ports.data(), sizeof(int) * 64, cudaMemcpyHostToDevice));
    BAGUA_TOOL_CHECK_NCCL(
        ncclAllGather(devPorts + 64 * rank, devPorts, 64, ncclInt32, comm, stream));
    BAGUA_TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
    const int next = (rank + 1) % n;
    BAGUA_TOOL_CHECK_CUDA(
        cudaMemcpy(ports.data(), devPorts + 64 * next, sizeof(int) * 64, cudaMemcpyDeviceToHost));
    std::vector<int> sends(static_cast<size_t>(streams));
    std::vector<int> recvs(static_cast<size_t>(streams));
    for (int s = 0; s < streams; ++s) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      sa.sin_port = htons(static_cast<uint16_t>(ports[static_cast<size_t>(s)]));
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        tcpDie(rank, "connect");
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      sends[static_cast<size_t>(s)] = fd;
    }
    for (int s = 0; s < streams; ++s) {
      // One listener per stream: the accepted socket is stream s whatever the arrival order.
      recvs[static_cast<size_t>(s)] =
          ::accept4(listeners[static_cast<size_t>(s)], nullptr, nullptr, SOCK_CLOEXEC);
      if (recvs[static_cast<size_t>(s)] < 0) {
        tcpDie(rank, "accept");
      }
      ::close(listeners[static_cast<size_t>(s)]);
    }
    for (uint64_t bytes = std::max(o.minBytes, o.tcpMin); bytes <= o.maxBytes; bytes *= 2) {
      const uint64_t perRank = bytes / static_cast<uint64_t>(n) * 2 * static_cast<uint64_t>(n - 1);
      const uint64_t part =
          (perRank + static_cast<uint64_t>(streams) - 1) / static_cast<uint64_t>(streams);
      const int iters = itersFor(o, bytes);
      auto pump = [&](int count) {
        std::vector<std::thread> threads;
        for (int s = 0; s < streams; ++s) {
          const uint64_t off = part * static_cast<uint64_t>(s);
          const uint64_t len = off >= perRank ? 0 : std::min(part, perRank - off);
          threads.emplace_back([&, s, off, len] {
            for (int i = 0; i < count; ++i) {
              if (!bagua::net::sendAll(sends[static_cast<size_t>(s)],
                                       static_cast<uint8_t*>(sendHost) + off, len)
                       .isOk()) {
                tcpDie(rank, "send");
              }
            }
          });
          threads.emplace_back([&, s, off, len] {
            for (int i = 0; i < count; ++i) {
              if (!bagua::net::recvAll(recvs[static_cast<size_t>(s)],
                                       static_cast<uint8_t*>(recvHost) + off, len)
                       .isOk()) {
                tcpDie(rank, "recv");
              }
            }
          });
        }
        for (std::thread& t : threads) {
          t.join();
        }
      };
      pump(1);  // warm-up (socket buffers grown, pages touched)
      // Everyone starts together: a tiny all-reduce as the barrier.
      BAGUA_TOOL_CHECK_NCCL(ncclAllReduce(devPorts, devPorts, 1, ncclInt32, ncclMax, comm, stream));
      BAGUA_TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
      const double cpu0 = processCpuSeconds();
      const double self0 = threadCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      pump(iters);
      TcpSample t;
      t.streams = streams;
      t.bytes = bytes;
      t.iters = iters;
      t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t.cpu = processCpuSeconds() - cpu0 - (threadCpuSeconds() - self0);
      out->push_back(t);
    }
    for (int s = 0; s < streams; ++s) {
      ::close(sends[static_cast<size_t>(s)]);
      ::close(recvs[static_cast<size_t>(s)]);
    }
  }
  BAGUA_TOOL_CHECK_CUDA(cudaFree(devPorts));
  BAGUA_TOOL_CHECK_CUDA(cudaFreeHost(sendHost));
  BAGUA_TOOL_CHECK_CUDA(cudaFreeHost(recvHost));
}

std::vector<Sample> runRank(const Options& o, int rank, const ncclUniqueId& id,
                            std::vector<TcpSample>* tcp) {
  bagua::tools::toolRank() = rank;
  if ((o.shareGpu || o.ownHost) && !bagua::processEnv("NCCL_HOSTID").has_value()) {
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

  std::vector<Sample> samples;
  for (uint64_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 2) {
    size_t count = bytes / sizeof(float);
    const int iters = itersFor(o, bytes);
    for (int i = 0; i < warmupFor(o, bytes); ++i) {
      BAGUA_TOOL_CHECK_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    }
    BAGUA_TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
    Sample sample;
    const double cpu0 = processCpuSeconds();
    const double self0 = threadCpuSeconds();
    BAGUA_TOOL_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) {
      BAGUA_TOOL_CHECK_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    }
    BAGUA_TOOL_CHECK_CUDA(cudaEventRecord(stop, stream));
    BAGUA_TOOL_CHECK_CUDA(cudaEventSynchronize(stop));
    sample.launchCpu = threadCpuSeconds() - self0;
    sample.cpu = processCpuSeconds() - cpu0 - sample.launchCpu;
    float ms = 0;
    BAGUA_TOOL_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    sample.usec = 1000.0 * ms / iters;

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
    sample.correct = ok ? 1 : 0;
    samples.push_back(sample);
  }
  BAGUA_TOOL_CHECK_CUDA(cudaFree(send));
  BAGUA_TOOL_CHECK_CUDA(cudaFree(recv));
  if (!o.tcpStreams.empty()) {
    tcpCeiling(o, rank, comm, stream, tcp);
  }
  BAGUA_TOOL_CHECK_NCCL(ncclCommDestroy(comm));
  return samples;
}

// What a rank sends rank 0 through its result pipe: its samples, then its TCP-ceiling samples.
bool writeResults(int fd, const std::vector<Sample>& samples, const std::vector<TcpSample>& tcp) {
  const auto n = static_cast<uint32_t>(samples.size());
  const auto m = static_cast<uint32_t>(tcp.size());
  return bagua::tools::writeAll(fd, &n, sizeof(n)) &&
         bagua::tools::writeAll(fd, samples.data(), n * sizeof(Sample)) &&
         bagua::tools::writeAll(fd, &m, sizeof(m)) &&
         bagua::tools::writeAll(fd, tcp.data(), m * sizeof(TcpSample));
}

bool readResults(int fd, std::vector<Sample>* samples, std::vector<TcpSample>* tcp) {
  uint32_t n = 0;
  uint32_t m = 0;
  if (!bagua::tools::readAll(fd, &n, sizeof(n)) || n > 64) {
    return false;
  }
  samples->resize(n);
  if (!bagua::tools::readAll(fd, samples->data(), n * sizeof(Sample)) ||
      !bagua::tools::readAll(fd, &m, sizeof(m)) || m > 4096) {
    return false;
  }
  tcp->resize(m);
  return bagua::tools::readAll(fd, tcp->data(), m * sizeof(TcpSample));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  using bagua::cli::flagNames;
  CLI::App app{
      "Float sum all-reduce over N GPUs (one process each), sizes doubling from --min to --max, "
      "every result checked, with the CPU seconds of the ranks' other threads (NCCL's proxies, "
      "the net plugin) per GB sent. The transport is whatever the NCCL environment selects.",
      "bagua-nccl-bench"};
  bagua::cli::configure(app);
  const auto count = CLI::Range(1, 1000000);
  app.add_option("--ranks", o.ranks, "ranks, one process and GPU each")
      ->check(count)
      ->capture_default_str();
  bagua::cli::addBytes(app, "--min", &o.minBytes, 4, "the first size");
  bagua::cli::addBytes(app, "--max", &o.maxBytes, 4, "the last size (at least --min)");
  app.add_option("--iters", o.iters, "timed iterations per size")
      ->check(count)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "warm-up iterations per size")
      ->check(count)
      ->capture_default_str();
  app.add_option("--label", o.label, "the run's name in the output")->capture_default_str();
  app.add_option("--json", o.json, "also write the results to FILE as JSON")->type_name("FILE");
  CLI::Option* share = app.add_flag(
      flagNames("share_gpu"), o.shareGpu,
      "every rank on GPU 0 (run under MPS), each with its own NCCL_HOSTID, so NCCL takes the "
      "network path between them");
  app.add_flag(flagNames("own_host"), o.ownHost,
               "one GPU per rank, each with its own NCCL_HOSTID (one rank per node)")
      ->excludes(share);
  bagua::cli::addBytes(app, flagNames("iter_bytes"), &o.iterBytes, 0,
                       "max(5, min(--iters, B / size)) timed iterations per size (0: --iters)");
  app.add_option(flagNames("tcp_ceiling"), o.tcpStreams,
                 "then the same processes move the same bytes over S plain TCP sockets per rank "
                 "pair (a ring, no NCCL): the host's ceiling for a TCP transport")
      ->type_name("S[,S...]")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Range(1, 64));
  bagua::cli::addBytes(app, flagNames("tcp_min"), &o.tcpMin, 4,
                       "the smallest size of the TCP ceiling");
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  if (o.minBytes > o.maxBytes) {
    return bagua::cli::usageError(app, "--min must not exceed --max");
  }
  if (!o.tcpStreams.empty() && o.ranks < 2) {
    return bagua::cli::usageError(app, "--tcp-ceiling needs --ranks >= 2");
  }

  // Rank 0 (this process) makes the id after forking the others, so no CUDA state is forked.
  // Each rank reports its samples to rank 0 through its result pipe.
  bagua::tools::ForkedRanks ranks;
  const bool forked = bagua::tools::forkRanks(
      o.ranks,
      [&](int r, const ncclUniqueId& id, int resultFd) {
        std::vector<TcpSample> tcp;
        std::vector<Sample> samples = runRank(o, r, id, &tcp);
        return writeResults(resultFd, samples, tcp) ? 0 : 6;
      },
      &ranks);
  if (!forked) {
    return 1;
  }
  const ncclUniqueId& id = ranks.id;
  int version = 0;
  BAGUA_TOOL_CHECK_NCCL(ncclGetVersion(&version));
  std::vector<TcpSample> tcp;
  std::vector<Sample> mine = runRank(o, 0, id, &tcp);
  std::vector<Sample> sum = mine;
  // TCP ceiling: per sample, the slowest rank's seconds and the ranks' CPU together.
  std::vector<TcpSample> tcpAll = tcp;
  bool allOk = true;
  for (int r = 1; r < o.ranks; ++r) {
    std::vector<Sample> theirs;
    std::vector<TcpSample> theirTcp;
    if (!readResults(ranks.results[r - 1], &theirs, &theirTcp) || theirs.size() != mine.size() ||
        theirTcp.size() != tcp.size()) {
      std::fprintf(stderr, "rank 0: no results from rank %d\n", r);
      allOk = false;
      continue;
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      sum[i].usec += theirs[i].usec;
      sum[i].cpu += theirs[i].cpu;
      sum[i].correct = static_cast<char>(sum[i].correct && theirs[i].correct);
    }
    for (size_t i = 0; i < tcp.size(); ++i) {
      tcpAll[i].seconds = std::max(tcpAll[i].seconds, theirTcp[i].seconds);
      tcpAll[i].cpu += theirTcp[i].cpu;
    }
  }
  if (!bagua::tools::waitRanks(ranks)) {
    allOk = false;
  }

  std::vector<Row> rows;
  size_t i = 0;
  for (uint64_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 2, ++i) {
    rows.push_back(
        {bytes, itersFor(o, bytes), sum[i].usec / o.ranks, sum[i].cpu, sum[i].correct != 0});
  }
  const double factor = 2.0 * (o.ranks - 1) / o.ranks;
  // Bytes all ranks send per all-reduce: 2(n-1) x size.
  auto sentGb = [&](uint64_t bytes, int iters) {
    return 2.0 * (o.ranks - 1) * static_cast<double>(bytes) * iters / 1e9;
  };
  std::printf(
      "# %s: NCCL %d, %d ranks, float sum, mean over ranks; CPU: the ranks' threads but\n"
      "# the launching ones, per GB sent\n",
      o.label.c_str(), version, o.ranks);
  std::printf("%12s %6s %12s %10s %10s %10s %8s\n", "bytes", "iters", "time(us)", "algbw", "busbw",
              "CPU s/GB", "check");
  // ordered_json: the fields in the order bench/gpu/summarize.py's readers have always seen.
  nlohmann::ordered_json js = {{"label", o.label}, {"nccl_version", version}, {"ranks", o.ranks}};
  nlohmann::ordered_json jsRows = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    double algbw = static_cast<double>(r.bytes) / 1e3 / r.usec;  // GB/s
    double busbw = algbw * factor;
    double cpuPerGb = r.cpu / sentGb(r.bytes, r.iters);
    std::printf("%12" PRIu64 " %6d %12.1f %10.2f %10.2f %10.3f %8s\n", r.bytes, r.iters, r.usec,
                algbw, busbw, cpuPerGb, r.correct ? "ok" : "WRONG");
    jsRows.push_back({{"bytes", r.bytes},
                      {"iters", r.iters},
                      {"usec", r.usec},
                      {"algbw", algbw},
                      {"busbw", busbw},
                      {"cpu_s", r.cpu},
                      {"cpu_s_per_gb", cpuPerGb},
                      {"correct", r.correct}});
    allOk = allOk && r.correct;
  }
  js["rows"] = std::move(jsRows);
  if (!tcpAll.empty()) {
    std::printf(
        "# TCP ceiling: the same processes, plain TCP sockets in a ring (no NCCL); rate =\n"
        "# bytes each rank sent per second (what busbw counts), slowest rank\n");
    std::printf("%12s %8s %10s %10s\n", "bytes", "streams", "GB/s", "CPU s/GB");
    nlohmann::ordered_json jsTcp = nlohmann::ordered_json::array();
    for (const TcpSample& t : tcpAll) {
      const double perRank = static_cast<double>(t.bytes / static_cast<uint64_t>(o.ranks) * 2 *
                                                 static_cast<uint64_t>(o.ranks - 1)) *
                             t.iters;
      const double gbps = perRank / t.seconds / 1e9;
      const double cpuPerGb = t.cpu / (perRank * o.ranks / 1e9);
      std::printf("%12" PRIu64 " %8d %10.2f %10.3f\n", t.bytes, t.streams, gbps, cpuPerGb);
      jsTcp.push_back({{"bytes", t.bytes},
                       {"streams", t.streams},
                       {"iters", t.iters},
                       {"busbw", gbps},
                       {"cpu_s_per_gb", cpuPerGb}});
    }
    js["tcp_ceiling"] = std::move(jsTcp);
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << js.dump() << "\n";
    if (!f.flush()) {
      std::fprintf(stderr, "bagua-nccl-bench: cannot write %s\n", o.json.c_str());
      allOk = false;
    }
  }
  return allOk ? 0 : 1;
}
