// A CPU-only program of the SDK: links bagua-core, bagua-algorithms, bagua-optimizer and
// bagua-loader, and cpu_only_link_test.sh runs it with no CUDA library reachable. Two processes
// (a fork) rendezvous over the TCP store and run each library's CPU path: a host all-reduce
// (core), a few training steps of a small MLP under ByteGrad (algorithms) with a fused SGD
// (optimizer), checked for equal weights on both ranks, and a pinned-memory data loader over an
// in-memory dataset (loader), checked batch by batch. Then each library's CUDA path is asked for.
//
//   cpu_only_program refused CORE ALGO OPTIM   every CUDA path must fail with kFailedPrecondition
//                                              containing the words given for its library (the
//                                              loader must fall back to mlock), and no CUDA or
//                                              NCCL library may be loaded in either rank
//   cpu_only_program loads HALF...             (the CUDA halves beside their libraries) asking for
//                                              the CUDA path of each library named (core,
//                                              algorithms, optimizer, loader) must load its
//                                              libbagua_<lib>_cuda; with a GPU, MinMaxUInt8 on
//                                              device memory must equal the host bytes
//
// Exit 0 when every check held, 1 with a message on stderr otherwise, 2 for bad usage.
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/compression.h"
#include "bagua/algorithms/cuda_compression.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/data_loader.h"
#include "bagua/loader/dataset.h"
#include "bagua/loader/host_buffer.h"
#include "bagua/loader/sampler.h"
#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/elementwise.h"
#include "example_mlp.h"

namespace {

using bagua::Status;
using namespace bagua::core;
using std::chrono::milliseconds;

int failed(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "cpu_only_program %s: %s\n", who.c_str(), what.c_str());
  return 1;
}

// The loaded objects whose name contains one of `libs`.
std::vector<std::string> loadedLibraries(const std::vector<std::string>& libs) {
  struct Query {
    const std::vector<std::string>* libs;
    std::vector<std::string> found;
  } q{&libs, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        auto* query = static_cast<Query*>(out);
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        for (const std::string& lib : *query->libs) {
          if (name.find(lib) != std::string::npos) {
            query->found.push_back(name);
          }
        }
        return 0;
      },
      &q);
  return q.found;
}

// What the command line asks for.
struct Mode {
  bool refused = false;
  std::string coreWords, algoWords, optimWords;  // refused: what each CUDA path's error contains
  std::vector<std::string> halves;               // loads: the libraries whose half must load
  bool wants(const std::string& lib) const {
    return std::find(halves.begin(), halves.end(), lib) != halves.end();
  }
};

// kFailedPrecondition containing `words`, or the reason it is not.
std::string refusal(const Status& s, const std::string& words) {
  if (s.isOk()) {
    return "succeeded with no CUDA library reachable";
  }
  if (s.code() != bagua::StatusCode::kFailedPrecondition ||
      s.message().find(words) == std::string::npos) {
    return "not kFailedPrecondition with '" + words + "': " + s.message();
  }
  return "";
}

// algorithms + optimizer on the host: 5 steps of a small MLP under ByteGrad with a fused SGD.
// ByteGrad all-reduces the same compressed average on both ranks, so their weights stay equal.
std::string trainOnHost(ProcessGroup& pg, int rank) {
  bagua::example::MlpConfig mc;
  mc.sizes = {8, 16, 4};
  mc.seed = 11 + static_cast<uint64_t>(rank);  // different: withBagua broadcasts rank 0's
  bagua::example::Mlp model(mc);
  bagua::optim::SgdRule::Hyper h;
  h.lr = 0.05;
  h.momentum = 0.9;
  auto opt = bagua::optim::Sgd::create(model.parameters(), h);
  if (!opt.isOk()) {
    return "fused SGD: " + opt.status().message();
  }
  auto algorithm = bagua::algo::createAlgorithm("bytegrad", {{"hierarchical", "false"}});
  if (!algorithm.isOk()) {
    return "bytegrad: " + algorithm.status().message();
  }
  auto ddp = withBagua(model.parameters(), model.buffers(), {opt->get()}, *algorithm, pg);
  if (!ddp.isOk()) {
    return "withBagua: " + ddp.status().message();
  }
  if (Status s = (*opt)->fuse(); !s.isOk()) {
    return "fused SGD fuse(): " + s.message();
  }
  const int batch = 6;
  std::vector<float> x(static_cast<size_t>(batch) * 8);
  std::vector<int32_t> y(batch);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>((i * 7 + static_cast<size_t>(step * 3 + rank * 5)) % 11) / 11.0f;
    }
    for (int b = 0; b < batch; ++b) {
      y[b] = (b + step + rank) % 4;
    }
    (*opt)->zeroGrad();
    Status s = (*ddp)->prepareForward();
    const float loss = model.forward(x.data(), y.data(), batch);
    if (!std::isfinite(loss)) {
      return "step " + std::to_string(step) + ": loss " + std::to_string(loss);
    }
    model.backward([&](int p) {
      if (s.isOk()) {
        s = (*ddp)->markGradReady(p);
      }
    });
    if (s.isOk()) {
      s = (*ddp)->finishBackward();
    }
    if (s.isOk()) {
      s = (*ddp)->step();
    }
    if (!s.isOk()) {
      return "step " + std::to_string(step) + ": " + s.message();
    }
  }
  std::vector<float> mine;
  for (const Parameter& p : model.parameters()) {
    const float* d = static_cast<const float*>(p.data);
    mine.insert(mine.end(), d, d + p.numel);
  }
  std::vector<float> hi(mine.size()), lo(mine.size());
  for (auto [out, op] : {std::pair{&hi, ReduceOp::kMax}, std::pair{&lo, ReduceOp::kMin}}) {
    Status s = pg.global()
                   .allReduce(mine.data(), out->data(), mine.size(), DataType::kF32, op)
                   ->wait(milliseconds(20000));
    if (!s.isOk()) {
      return "weight comparison: " + s.message();
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (!std::isfinite(mine[i]) || hi[i] != lo[i]) {
      return "weight " + std::to_string(i) + " differs between ranks (" + std::to_string(lo[i]) +
             " .. " + std::to_string(hi[i]) + ")";
    }
  }
  return "";
}

// loader on the host: one epoch of this rank's half of 20 samples, pinned, 2 workers; every batch
// must hold exactly its samples' bytes.
std::string loadOnHost(int rank) {
  std::vector<bagua::Sample> samples;
  for (int i = 0; i < 20; ++i) {
    samples.push_back(std::string(static_cast<size_t>(i % 5 + 1), static_cast<char>('a' + i)));
  }
  bagua::loader::VectorDataset dataset(samples);
  bagua::loader::SamplerOptions so;
  so.numReplicas = 2;
  so.rank = rank;
  auto sampler = bagua::loader::DistributedSampler::create(dataset.size(), so);
  if (!sampler.isOk()) {
    return "sampler: " + sampler.status().message();
  }
  auto plan = bagua::loader::FixedSizeBatchPlan::create(**sampler, 3, false);
  if (!plan.isOk()) {
    return "batch plan: " + plan.status().message();
  }
  bagua::loader::LoaderOptions lo;
  lo.numWorkers = 2;
  lo.pinMemory = true;
  lo.progress = false;
  auto loader =
      bagua::loader::DataLoader::create(dataset, **plan, bagua::loader::concatCollate(), lo);
  if (!loader.isOk()) {
    return "data loader: " + loader.status().message();
  }
  if (Status s = (*loader)->startEpoch(0); !s.isOk()) {
    return "startEpoch: " + s.message();
  }
  size_t seen = 0;
  while (true) {
    auto b = (*loader)->next();
    if (!b.isOk()) {
      return "next: " + b.status().message();
    }
    if (!b->has_value()) {
      break;
    }
    const bagua::loader::Batch& batch = **b;
    std::string want;
    for (size_t i : batch.indices) {
      want += samples.at(i);
    }
    const std::string got(reinterpret_cast<const char*>(batch.data.data()), batch.data.size());
    if (got != want) {
      return "batch " + std::to_string(batch.step) + " holds '" + got + "', not '" + want + "'";
    }
    seen += batch.indices.size();
  }
  if (seen != 10) {
    return "the epoch gave " + std::to_string(seen) + " samples, not 10";
  }
  return "";
}

// With the algorithms' and optimizer's CUDA halves loaded: MinMaxUInt8 on device memory (made
// and copied through the optimizer's cuda.h) must write the host kernel's bytes, bit for bit.
// Without a GPU the allocation fails with the runtime's reason, which is returned as "skipped".
std::string deviceRoundTrip(int rank, bool* skipped) {
  const size_t numel = 1000, chunks = 3;
  std::vector<float> host(numel);
  for (size_t i = 0; i < numel; ++i) {
    host[i] = static_cast<float>((i * 37 + static_cast<size_t>(rank) * 11) % 101) / 7.0f - 5.0f;
  }
  std::vector<uint8_t> want(bagua::algo::minMaxCompressedBytes(numel, chunks));
  if (Status s = bagua::algo::minMaxCompress(host.data(), numel, chunks, want.data(), want.size());
      !s.isOk()) {
    return "host compress: " + s.message();
  }
  const size_t wsBytes = bagua::algo::minMaxCudaWorkspaceBytes(numel, chunks);
  void* src = nullptr;
  void* dst = nullptr;
  void* ws = nullptr;
  Status s = bagua::optim::cudaAllocZeroed(0, numel * sizeof(float), &src);
  if (!s.isOk()) {
    *skipped = true;
    return s.message();
  }
  s = bagua::optim::cudaAllocZeroed(0, want.size(), &dst);
  if (s.isOk()) {
    s = bagua::optim::cudaAllocZeroed(0, wsBytes, &ws);
  }
  std::vector<uint8_t> got(want.size());
  if (s.isOk()) {
    s = bagua::optim::cudaCopy(0, src, host.data(), numel * sizeof(float), 1);
  }
  if (s.isOk()) {
    s = bagua::algo::minMaxCompressCuda(static_cast<const float*>(src), numel, chunks,
                                        static_cast<uint8_t*>(dst), got.size(), ws, wsBytes);
  }
  if (s.isOk()) {  // a synchronous copy on the legacy stream: after the kernel
    s = bagua::optim::cudaCopy(0, got.data(), dst, got.size(), 2);
  }
  for (void* p : {src, dst, ws}) {
    bagua::optim::cudaRelease(0, p);
  }
  if (!s.isOk()) {
    return "device compress: " + s.message();
  }
  if (got != want) {
    return "MinMaxUInt8 on cuda:0 wrote other bytes than the host kernel";
  }
  return "";
}

// One rank: joins the 2-rank group, runs the CPU paths, and asks for the CUDA ones (the NCCL
// backend on rank 0 only: it needs a store of its own).
int runRank(int rank, int port, const Mode& mode) {
  const std::string who = "rank " + std::to_string(rank);
  TcpStoreOptions so;
  so.port = port;
  so.connectTimeout = milliseconds(20000);
  auto store = TcpStore::connect(so);
  if (!store.isOk()) {
    return failed(who, "store: " + store.status().message());
  }
  std::shared_ptr<Store> shared(std::move(*store));
  ProcessGroupOptions opts;
  opts.rank = rank;
  opts.worldSize = 2;
  opts.hierarchical = false;
  opts.rendezvousTimeout = milliseconds(20000);
  opts.collectiveTimeout = milliseconds(20000);
  auto pg = ProcessGroup::create(shared, opts);
  if (!pg.isOk()) {
    return failed(who, "process group: " + pg.status().message());
  }
  // Rank r holds (r + 1) * i: the sum over both ranks is 3 * i, exact in float.
  const size_t n = 1000;
  std::vector<float> data(n);
  for (size_t i = 0; i < n; ++i) {
    data[i] = static_cast<float>((rank + 1) * i);
  }
  Status s = (*pg)
                 ->global()
                 .allReduce(data.data(), data.data(), n, DataType::kF32, ReduceOp::kSum)
                 ->wait(milliseconds(20000));
  if (!s.isOk()) {
    return failed(who, "all-reduce: " + s.message());
  }
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != static_cast<float>(3 * i)) {
      return failed(who, "all-reduce: element " + std::to_string(i) + " is " +
                             std::to_string(data[i]) + ", not " + std::to_string(3 * i));
    }
  }
  if (std::string e = trainOnHost(**pg, rank); !e.empty()) {
    return failed(who, "training (algorithms, optimizer): " + e);
  }
  if (std::string e = loadOnHost(rank); !e.empty()) {
    return failed(who, "loader: " + e);
  }
  std::string cuda;
  // core: the NCCL backend.
  if (rank == 0 && (mode.refused || mode.wants("core"))) {
    ProcessGroupOptions one = opts;
    one.cudaDevice = 0;  // where there is a GPU, a real 1-rank NCCL communicator
    auto comm = createCommunicator(Backend::kNccl, *shared, 0, 1, one);
    if (mode.refused) {
      if (std::string e = refusal(comm.status(), mode.coreWords); !e.empty()) {
        return failed(who, "the NCCL backend: " + e);
      }
      cuda += "; NCCL backend refused: " + comm.status().message();
    } else {
      if (!comm.isOk() &&
          comm.status().message().find("is not installed or does not load") != std::string::npos) {
        return failed(who, "the CUDA half did not load: " + comm.status().message());
      }
      cuda += "; NCCL backend: libbagua_core_cuda loaded, " +
              (comm.isOk() ? std::string("communicator made") : comm.status().message());
    }
  }
  // algorithms: the MinMaxUInt8 CUDA kernels.
  if (mode.refused || mode.wants("algorithms")) {
    const bool available = bagua::algo::cudaCompressionAvailable();
    if (mode.refused) {
      // Valid arguments (host memory: the call must refuse before touching it).
      std::vector<float> src(64, 1.0f);
      std::vector<uint8_t> dst(bagua::algo::minMaxCompressedBytes(src.size(), 1));
      std::vector<uint32_t> workspace(4);
      Status c = bagua::algo::minMaxCompressCuda(src.data(), src.size(), 1, dst.data(), dst.size(),
                                                 workspace.data(), workspace.size() * 4);
      if (std::string e = refusal(c, mode.algoWords); !e.empty() || available) {
        return failed(
            who, "the algorithms' CUDA kernels: " + (available ? std::string("available") : e));
      }
      cuda += "; algorithms' CUDA kernels refused";
    } else if (!available) {
      return failed(who, "cudaCompressionAvailable() is false with the CUDA half beside");
    }
  }
  // optimizer: CUDA device memory.
  if (mode.refused || mode.wants("optimizer")) {
    const bool available = bagua::optim::cudaKernelsAvailable();
    if (mode.refused) {
      void* p = nullptr;
      Status c = bagua::optim::cudaAllocZeroed(0, 64, &p);
      if (std::string e = refusal(c, mode.optimWords); !e.empty() || available) {
        return failed(
            who, "the optimizer's CUDA kernels: " + (available ? std::string("available") : e));
      }
      cuda += "; optimizer's CUDA kernels refused";
    } else if (!available) {
      return failed(who, "cudaKernelsAvailable() is false with the CUDA half beside");
    }
  }
  // loader: pinned memory comes from mlock without CUDA (the loader above already chose).
  const std::string pinned = bagua::loader::pinnedHostAllocator().name();
  if (mode.refused) {
    if (pinned != "mlock") {
      return failed(who, "pinned batch memory from " + pinned + ", not mlock");
    }
    cuda += "; pinned memory from mlock";
  }
  if (!mode.refused && mode.wants("algorithms") && mode.wants("optimizer")) {
    bool skipped = false;
    const std::string e = deviceRoundTrip(rank, &skipped);
    if (skipped) {
      cuda += "; no device round trip (" + e + ")";
    } else if (!e.empty()) {
      return failed(who, e);
    } else {
      cuda += "; MinMaxUInt8 on cuda:0 equals the host bytes";
    }
  }
  if (!mode.refused) {
    for (const std::string& lib : mode.halves) {
      if (lib == "core" && rank != 0) {
        continue;
      }
      if (loadedLibraries({"libbagua_" + lib + "_cuda.so"}).empty()) {
        return failed(
            who, "asking for the CUDA path of " + lib + " did not load libbagua_" + lib + "_cuda");
      }
      cuda += "; libbagua_" + lib + "_cuda loaded";
    }
  } else {
    const std::vector<std::string> loaded = loadedLibraries({"libcudart", "libcuda.so", "libnccl"});
    if (!loaded.empty()) {
      return failed(who, "CUDA/NCCL libraries loaded: " + loaded.front());
    }
    cuda += "; no CUDA or NCCL library loaded";
  }
  std::printf(
      "cpu_only_program rank %d/2: host all-reduce of %zu floats correct; bytegrad + fused SGD: "
      "5 steps, weights equal on both ranks; loader: 10 samples in order%s\n",
      rank, n, cuda.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Mode mode;
  const std::string verb = argc >= 2 ? argv[1] : "";
  if (verb == "refused" && argc == 5) {
    mode.refused = true;
    mode.coreWords = argv[2];
    mode.algoWords = argv[3];
    mode.optimWords = argv[4];
  } else if (verb == "loads") {
    for (int i = 2; i < argc; ++i) {
      mode.halves.push_back(argv[i]);
    }
  } else {
    std::fprintf(stderr,
                 "usage: cpu_only_program refused CORE_WORDS ALGO_WORDS OPTIM_WORDS | "
                 "cpu_only_program loads [core] [algorithms] [optimizer] [loader]\n");
    return 2;
  }
  // Fork first (rank 1 is a single-threaded copy); rank 0 then starts the store's server and
  // sends its port down the pipe.
  int fds[2];
  if (pipe(fds) != 0) {
    return failed("rank 0", "pipe failed");
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    return failed("rank 0", "fork failed");
  }
  if (child == 0) {
    close(fds[1]);
    int port = 0;
    if (read(fds[0], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port)) || port <= 0) {
      _exit(failed("rank 1", "no store port from rank 0"));
    }
    _exit(runRank(1, port, mode));
  }
  close(fds[0]);
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  const int port = server.isOk() ? (*server)->port() : -1;
  const bool sent = write(fds[1], &port, sizeof(port)) == static_cast<ssize_t>(sizeof(port));
  close(fds[1]);
  if (!server.isOk() || !sent) {
    waitpid(child, nullptr, 0);
    return failed("rank 0", "store server: " + server.status().message());
  }
  const int mine = runRank(0, port, mode);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return failed("rank 0", "rank 1 failed (wait status " + std::to_string(status) + ")");
  }
  return mine;
}
