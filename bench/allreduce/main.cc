// bagua-allreduce-bench: all-reduce bandwidth of the host backend against gloo (and, on a GPU
// machine, nothing else yet), over loopback TCP, same processes, same run. Launch it with
// baguarun, one process per rank:
//
//   baguarun --nproc_per_node 4 --master_port 0 bagua-allreduce-bench [--sizes 4K,1M,64M]
//            [--iters N] [--reps R] [--no_gloo] [--transports shm,engine,socket]
//
// --transports runs the host backend once per listed transport, each its own process group in
// the same processes: shm (socket mesh + shared-memory rings), engine (the Bagua-Net TCP
// engine), socket (our single-socket TCP mesh, no shm), auto (what BAGUA_HOST_TRANSPORT picks).
// Without it: one host-backend group configured by the environment.
//
// Figures follow nccl-tests: time = the slowest rank's mean time per all-reduce (in-place, sum),
// algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. For each size the contestants alternate
// in R rounds and each reports its best round, so background load hits all alike. Every result
// is checked against its closed form before a figure is printed. Ratios are against gloo.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "bagua/core/process_group.h"
#include "bagua/demo_support/bench_args.h"

#if BAGUA_BENCH_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <stdexcept>
#endif

namespace {

using namespace bagua;
using namespace bagua::core;
using Clock = std::chrono::steady_clock;

// --sizes, --iters (0, the default: adaptive) and --reps, plus the bench's own options.
struct Args : demo::BenchArgs {
  Args() { sizes = {4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}; }
  bool gloo = true;
  std::vector<std::string> transports;  // empty: one group configured by the environment
};

#if BAGUA_BENCH_HAVE_GLOO
// gloo's rendezvous through our store (gloo reports errors by throwing).
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<core::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status st = s_->set(key, Bytes(data.begin(), data.end()));
    if (!st.isOk()) {
      throw std::runtime_error(st.toString());
    }
  }
  std::vector<char> get(const std::string& key) override {
    Result<Bytes> b = s_->get(key, std::chrono::seconds(60));
    if (!b.isOk()) {
      throw std::runtime_error(b.status().toString());
    }
    return std::vector<char>(b->begin(), b->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, std::chrono::seconds(60)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Status st = s_->wait(keys, timeout);
    if (!st.isOk()) {
      throw std::runtime_error(st.toString());
    }
  }

 private:
  std::shared_ptr<core::Store> s_;
};
#endif

double maxOverRanks(ProcessGroup& pg, double v) {
  Status s = pg.global()
                 .allReduce(&v, &v, 1, DataType::kF64, ReduceOp::kMax)
                 ->wait(std::chrono::seconds(120));
  return s.isOk() ? v : -1;
}

void fill(std::vector<float>& buf, int rank) {
  for (size_t i = 0; i < buf.size(); ++i) {
    buf[i] = static_cast<float>((i % 7) + rank);
  }
}

bool check(const std::vector<float>& buf, int world, int timesReduced) {
  // After k in-place sums starting from (i % 7) + r: sum over ranks times world^(k-1).
  double base = 0;
  for (int r = 0; r < world; ++r) {
    base += r;
  }
  for (size_t i = 0; i < buf.size(); i += std::max<size_t>(1, buf.size() / 1024)) {
    double want = (static_cast<double>(i % 7) * world + base) * std::pow(world, timesReduced - 1);
    if (std::fabs(buf[i] - want) > 1e-3 * std::max(1.0, std::fabs(want))) {
      std::fprintf(stderr, "bagua-allreduce-bench: wrong result at %zu: %g != %g\n", i, buf[i],
                   want);
      return false;
    }
  }
  return true;
}

std::string sizeText(size_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) {
    return strPrintf("%zuM", b >> 20);
  }
  if (b >= 1024 && b % 1024 == 0) {
    return strPrintf("%zuK", b >> 10);
  }
  return strPrintf("%zu", b);
}

int run(const Args& a) {
  ProcessGroupOptions po;
  po.hierarchical = false;
  po.name = "allreduce_bench";
  auto pgr = ProcessGroup::initFromEnv(po);
  if (!pgr.isOk()) {
    std::fprintf(stderr, "bagua-allreduce-bench: %s\n", pgr.status().toString().c_str());
    return 1;
  }
  ProcessGroup& pg = **pgr;
  const int rank = pg.rank();
  const int world = pg.size();
  bool useGloo = a.gloo;
#if BAGUA_BENCH_HAVE_GLOO
  std::shared_ptr<gloo::rendezvous::Context> gctx;
  if (useGloo) {
    try {
      gloo::transport::tcp::attr attr("127.0.0.1");
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto store =
          std::make_shared<GlooStoreAdapter>(std::make_shared<PrefixStore>("gloo", pg.store()));
      gctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
      gctx->setTimeout(std::chrono::seconds(120));
      gctx->connectFullMesh(*store, device);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bagua-allreduce-bench: gloo set-up failed: %s\n", e.what());
      return 1;
    }
  }
#else
  if (useGloo && rank == 0) {
    std::printf("(gloo was not found at build time: the host backend only)\n");
  }
  useGloo = false;
#endif
  // The host-backend contestants: one process group per transport, same processes.
  struct Contestant {
    std::string name;
    Communicator* comm = nullptr;  // null: gloo
  };
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  std::vector<Contestant> contestants;
  if (a.transports.empty()) {
    contestants.push_back({"bagua", &pg.global()});
  }
  for (const std::string& t : a.transports) {
    ProcessGroupOptions o = pg.options();
    o.hierarchical = false;
    o.name = "allreduce_bench_" + t;
    if (t == "shm") {
      o.hostTransport = HostTransport::kSocket;
      o.hostSharedMemory = true;
    } else if (t == "engine") {
      o.hostTransport = HostTransport::kEngine;
    } else if (t == "socket") {
      o.hostTransport = HostTransport::kSocket;
      o.hostSharedMemory = false;
    } else if (t == "auto") {
      o.hostTransport = HostTransport::kAuto;
    } else {
      std::fprintf(stderr, "bagua-allreduce-bench: unknown transport '%s'\n", t.c_str());
      return 2;
    }
    auto g = ProcessGroup::create(pg.store(), o);
    if (!g.isOk()) {
      std::fprintf(stderr, "bagua-allreduce-bench: %s: %s\n", t.c_str(),
                   g.status().toString().c_str());
      return 1;
    }
    contestants.push_back({t, &(*g)->global()});
    groups.push_back(std::move(*g));
  }
  if (useGloo) {
    contestants.push_back({"gloo", nullptr});
  }
  if (rank == 0) {
    std::printf("bagua-allreduce-bench: %d ranks, f32 sum in place, loopback; host backend%s\n",
                world, useGloo ? " vs gloo (gloo::allreduce, tcp transport)" : "");
    std::printf("%8s %5s", "size", "iters");
    for (const Contestant& c : contestants) {
      std::printf(" | %8s us %7s busbw", c.name.c_str(), "");
    }
    if (useGloo) {
      for (size_t i = 0; i + 1 < contestants.size(); ++i) {
        std::printf(" | %s/gloo", contestants[i].name.c_str());
      }
    }
    std::printf("\n");
  }
  const double busFactor = world > 1 ? 2.0 * (world - 1) / world : 1.0;
#if BAGUA_BENCH_HAVE_GLOO
  uint32_t tag = 0;  // gloo collective tags
#endif
  for (size_t bytes : a.sizes) {
    const size_t count = bytes / 4;
    std::vector<float> buf(count);
    int iters = a.iters;
    if (iters <= 0) {
      // Aim for about 0.3 s per round at a pessimistic 0.1 GB/s, between 3 and 200 iterations.
      iters = static_cast<int>(
          std::clamp<double>(0.3 / (static_cast<double>(bytes) / 1e8 + 5e-4), 3, 200));
    }
    std::vector<double> best(contestants.size(), 1e30);
    for (int rep = 0; rep < a.reps; ++rep) {
      for (size_t peer = 0; peer < contestants.size(); ++peer) {
        fill(buf, rank);
        // One warm-up, then the timed loop; all start together.
        auto once = [&]() -> bool {
          if (contestants[peer].comm != nullptr) {
            Status s =
                contestants[peer]
                    .comm->allReduce(buf.data(), buf.data(), count, DataType::kF32, ReduceOp::kSum)
                    ->wait(std::chrono::seconds(120));
            if (!s.isOk()) {
              std::fprintf(stderr, "bagua-allreduce-bench: %s\n", s.toString().c_str());
              return false;
            }
            return true;
          }
#if BAGUA_BENCH_HAVE_GLOO
          try {
            gloo::AllreduceOptions opts(gctx);
            opts.setOutput(buf.data(), count);
            opts.setReduceFunction(
                static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
            opts.setTag(tag++);
            gloo::allreduce(opts);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "bagua-allreduce-bench: gloo: %s\n", e.what());
            return false;
          }
#endif
          return true;
        };
        if (!once()) {
          return 1;
        }
        if (!check(buf, world, 1)) {
          return 1;
        }
        fill(buf, rank);
        if (!pg.global().barrier()->wait(std::chrono::seconds(120)).isOk()) {
          return 1;
        }
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) {
          if (!once()) {
            return 1;
          }
        }
        double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
        us = maxOverRanks(pg, us);
        if (us < 0) {
          return 1;
        }
        best[peer] = std::min(best[peer], us);
        // Values grow by `world` per iteration; keep them finite and checkable for short runs.
        if (iters <= 6 && !check(buf, world, iters)) {
          return 1;
        }
      }
    }
    if (rank == 0) {
      std::printf("%8s %5d", sizeText(bytes).c_str(), iters);
      std::vector<double> bus(contestants.size());
      for (size_t i = 0; i < contestants.size(); ++i) {
        bus[i] = static_cast<double>(bytes) / (best[i] * 1e-6) / 1e9 * busFactor;
        std::printf(" | %11.1f %7.3f GB/s", best[i], bus[i]);
      }
      if (useGloo) {
        for (size_t i = 0; i + 1 < contestants.size(); ++i) {
          std::printf(" | %*.2fx", static_cast<int>(contestants[i].name.size() + 4),
                      bus[i] / bus.back());
        }
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return pg.global().barrier()->wait(std::chrono::seconds(60)).isOk() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "All-reduce bandwidth of the host backend against gloo, same processes, same run; "
      "one process per rank, under baguarun: baguarun --nproc_per_node N "
      "bagua-allreduce-bench [options]",
      "bagua-allreduce-bench"};
  bagua::cli::configure(app);
  demo::addBenchOptions(app, &a);
  app.add_flag_callback(
      bagua::cli::flagNames("no_gloo"), [&a] { a.gloo = false; }, "leave gloo out");
  app.add_option("--transports", a.transports,
                 "run the host backend once per transport: shm, engine, socket, auto "
                 "(default: one group configured by the environment)")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::IsMember({"shm", "engine", "socket", "auto"}));
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  return run(a);
}
