// bagua-net-bench: point-to-point throughput and latency of the Bagua-Net NCCL plugin over
// loopback, driven exactly like NCCL drives it (dlopen libnccl-net.so, ncclNetPlugin_v11,
// listen/connect/accept, isend/irecv/test with several requests in flight), against baselines
// measured in the same run:
//   tcp     one plain TCP socket, blocking send/recv of the same messages (what NCCL's Socket
//           transport does on a NIC without helper threads, e.g. lo)
//   rr      our engine with an equal split, chunk k to stream k mod N (NCCL Socket with helper
//           threads and the original Bagua-Net schedule)
//   bagua   our engine with dynamic chunk scheduling (the default)
//
//   bagua-net-bench [--plugin PATH] [--sizes 64K,1M,16M] [--streams 1,2,4,8] [--window 8]
//                   [--conns 1] [--seconds 0.3] [--latency-sizes 8,64K,1M] [--json FILE]
//   bagua-net-bench --demo          a ~20 s tour with a readable table
//   bagua-net-bench --netns RECV_NS,SEND_NS ...   across shaped links between two network
//                                   namespaces (links.cc; tools/net_bench/shaped_links.sh)
//   bagua-net-bench --ring N ...    N processes in a ring over loopback, NCCL's ring pattern
//                                   (ring.cc): throughput and CPU per GB
// The plugin: --plugin PATH, else BAGUA_NET_PLUGIN_PATH, else the build tree's, else the installed
// one (findDefaultPlugin()).
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/net/socket_io.h"
#include "driver.h"
#include "links.h"
#include "ring.h"

namespace {

using namespace bagua::netbench;

// GB/s of the plugin with `conns` connections in parallel.
double pluginThroughput(Plugin& p, uint64_t size, int window, int conns, double seconds) {
  ncclNet_v11_t* net = p.net();
  std::vector<void*> sends(static_cast<size_t>(conns)), recvs(static_cast<size_t>(conns));
  for (int c = 0; c < conns; ++c) {
    p.connectPair(&sends[static_cast<size_t>(c)], &recvs[static_cast<size_t>(c)]);
  }
  // Warm-up, timed to size the measured run (so a slow machine does not take forever).
  int warm = std::max(8, 2 * window);
  auto w0 = Clock::now();
  pumpPair(net, sends[0], recvs[0], size, warm, window);
  double guess = static_cast<double>(size) * warm / secondsSince(w0) / 1e9;
  int count = messagesFor(size, seconds, guess);
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < conns; ++c) {
    threads.emplace_back([&, c] {
      pumpPair(net, sends[static_cast<size_t>(c)], recvs[static_cast<size_t>(c)], size, count,
               window);
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  double secs = secondsSince(t0);
  for (int c = 0; c < conns; ++c) {
    net->closeSend(sends[static_cast<size_t>(c)]);
    net->closeRecv(recvs[static_cast<size_t>(c)]);
  }
  return static_cast<double>(size) * count * conns / secs / 1e9;
}

// One-way latency (us) from a ping-pong over two comm pairs.
double pluginLatency(Plugin& p, uint64_t size, int iters) {
  ncclNet_v11_t* net = p.net();
  void *abS, *abR, *baS, *baR;
  p.connectPair(&abS, &abR);
  p.connectPair(&baS, &baR);
  std::vector<uint8_t> a(size + 1), b(size + 1);
  auto once = [&](void* send, void* recv, std::vector<uint8_t>& buf, bool sendFirst) {
    void* req = nullptr;
    if (sendFirst) {
      while (req == nullptr) {
        Plugin::check(net->isend(send, buf.data(), size, 0, nullptr, nullptr, &req), "isend");
      }
      waitReq(net, req);
      req = nullptr;
    }
    void* data = buf.data();
    size_t cap = size;
    int tag = 0;
    while (req == nullptr) {
      Plugin::check(net->irecv(recv, 1, &data, &cap, &tag, nullptr, nullptr, &req), "irecv");
    }
    waitReq(net, req);
    if (!sendFirst) {
      req = nullptr;
      while (req == nullptr) {
        Plugin::check(net->isend(send, buf.data(), size, 0, nullptr, nullptr, &req), "isend");
      }
      waitReq(net, req);
    }
  };
  auto run = [&](int n) {
    std::thread peer([&] {
      for (int i = 0; i < n; ++i) {
        once(baS, abR, b, false);
      }
    });
    for (int i = 0; i < n; ++i) {
      once(abS, baR, a, true);
    }
    peer.join();
  };
  run(10);
  auto t0 = Clock::now();
  run(iters);
  double us = secondsSince(t0) * 1e6 / iters / 2;
  net->closeSend(abS);
  net->closeRecv(abR);
  net->closeSend(baS);
  net->closeRecv(baR);
  return us;
}

// ---- plain TCP baseline ------------------------------------------------------------------------

void tcpPair(int* a, int* b) {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(l, 1) != 0 || getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    die("tcp baseline: listen failed");
  }
  *a = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(*a, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    die("tcp baseline: connect failed");
  }
  *b = ::accept(l, nullptr, nullptr);
  ::close(l);
  int one = 1;
  setsockopt(*a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(*b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The raw-TCP baseline moves its bytes with the engine's own whole-buffer loop, so that the
// comparison is about the engine's streams and scheduling, not about a different send loop.
void sendFull(int fd, const uint8_t* p, size_t n) {
  bagua::Status s = bagua::net::sendAll(fd, p, n);
  if (!s.isOk()) {
    die("tcp baseline: " + s.toString());
  }
}

void recvFull(int fd, uint8_t* p, size_t n) {
  bagua::Status s = bagua::net::recvAll(fd, p, n);
  if (!s.isOk()) {
    die("tcp baseline: " + s.toString());
  }
}

double tcpThroughput(uint64_t size, int conns, double seconds) {
  std::vector<std::thread> threads;
  std::vector<int> fa(static_cast<size_t>(conns)), fb(static_cast<size_t>(conns));
  for (int c = 0; c < conns; ++c) {
    tcpPair(&fa[static_cast<size_t>(c)], &fb[static_cast<size_t>(c)]);
  }
  int count = 0;
  {
    // Timed warm-up on the first pair sizes the run.
    constexpr int kWarm = 8;
    std::vector<uint8_t> buf(size, 0x5a), rbuf(size);
    auto w0 = Clock::now();
    std::thread s([&] {
      for (int i = 0; i < kWarm; ++i) {
        sendFull(fa[0], buf.data(), size);
      }
    });
    for (int i = 0; i < kWarm; ++i) {
      recvFull(fb[0], rbuf.data(), size);
    }
    s.join();
    double guess = static_cast<double>(size) * kWarm / secondsSince(w0) / 1e9;
    count = messagesFor(size, seconds, guess);
  }
  auto t0 = Clock::now();
  for (int c = 0; c < conns; ++c) {
    threads.emplace_back([&, c] {
      std::vector<uint8_t> buf(size, 0x5a);
      for (int i = 0; i < count; ++i) {
        sendFull(fa[static_cast<size_t>(c)], buf.data(), size);
      }
    });
    threads.emplace_back([&, c] {
      std::vector<uint8_t> buf(size);
      for (int i = 0; i < count; ++i) {
        recvFull(fb[static_cast<size_t>(c)], buf.data(), size);
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  double secs = secondsSince(t0);
  for (int c = 0; c < conns; ++c) {
    ::close(fa[static_cast<size_t>(c)]);
    ::close(fb[static_cast<size_t>(c)]);
  }
  return static_cast<double>(size) * count * conns / secs / 1e9;
}

double tcpLatency(uint64_t size, int iters) {
  int a, b;
  tcpPair(&a, &b);
  std::vector<uint8_t> x(size + 1), y(size + 1);
  auto run = [&](int n) {
    std::thread peer([&] {
      for (int i = 0; i < n; ++i) {
        recvFull(b, y.data(), size);
        sendFull(b, y.data(), size);
      }
    });
    for (int i = 0; i < n; ++i) {
      sendFull(a, x.data(), size);
      recvFull(a, x.data(), size);
    }
    peer.join();
  };
  run(10);
  auto t0 = Clock::now();
  run(iters);
  double us = secondsSince(t0) * 1e6 / iters / 2;
  ::close(a);
  ::close(b);
  return us;
}

// ---- driver ------------------------------------------------------------------------------------

struct Options {
  std::string plugin;
  std::vector<uint64_t> sizes = {64 << 10, 1 << 20, 16 << 20};
  std::vector<uint64_t> streams = {1, 2, 4, 8};
  std::vector<uint64_t> latencySizes = {8, 64 << 10, 1 << 20};
  int window = 8;
  int conns = 1;
  double seconds = 0.3;
  std::string json;
  bool demo = false;
  std::string slowStream;  // BAGUA_NET_SLOW_STREAM_RATE for the plugin runs ("" = off)
};

// The installed plugin relative to the installed bench: <prefix>/<bindir>/ + this +
// libnccl-net.so, from Meson's bindir and libdir at configure time (tools/net_bench/meson.build);
// an absolute folder where libdir or bindir is absolute. A build without it (build_standalone.sh)
// has no installed form.
#ifndef BAGUA_NET_BENCH_INSTALLED_PLUGIN_DIR
#define BAGUA_NET_BENCH_INSTALLED_PLUGIN_DIR ""
#endif

// The folder of this executable ("" if /proc/self/exe does not say).
std::string exeDir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

bool readable(const std::string& path) {
  return access(path.c_str(), R_OK) == 0;
}

// The plugin when --plugin does not name one, first found of: BAGUA_NET_PLUGIN_PATH (when set,
// the only candidate); the build tree's (this executable in <build>/tools/net_bench, the plugin in
// <build>/net_plugin); the installed one (<prefix>/<libdir>/libnccl-net.so).
DefaultPlugin findDefaultPlugin() {
  if (std::optional<std::string> env = bagua::processEnv("BAGUA_NET_PLUGIN_PATH")) {
    if (!readable(*env)) {
      return {"", "BAGUA_NET_PLUGIN_PATH='" + *env +
                      "' is not a readable file (set it to the plugin, libnccl-net.so, or unset "
                      "it to use the build tree's or the installed one)"};
    }
    return {*env, ""};
  }
  const std::string dir = exeDir();
  if (dir.empty()) {
    return {"",
            "cannot tell where this executable is (/proc/self/exe): set "
            "BAGUA_NET_PLUGIN_PATH=/path/to/libnccl-net.so or pass --plugin PATH"};
  }
  const std::string buildTree =
      (std::filesystem::path(dir) / "../../net_plugin/libnccl-net.so").lexically_normal().string();
  if (readable(buildTree)) {
    return {buildTree, ""};
  }
  std::string installed;
  const std::string installedDir = BAGUA_NET_BENCH_INSTALLED_PLUGIN_DIR;
  if (!installedDir.empty()) {
    std::filesystem::path d(installedDir);
    installed = ((d.is_absolute() ? d : std::filesystem::path(dir) / d) / "libnccl-net.so")
                    .lexically_normal()
                    .string();
    if (readable(installed)) {
      return {installed, ""};
    }
  }
  return {"",
          "no Bagua-Net plugin found: BAGUA_NET_PLUGIN_PATH is not set, and neither the "
          "build tree's " +
              buildTree + (installed.empty() ? std::string() : " nor the installed " + installed) +
              " exists; set BAGUA_NET_PLUGIN_PATH=/path/to/libnccl-net.so or pass "
              "--plugin PATH"};
}

// The loopback mode's command line into `o`: nullopt to run, else main's exit status.
std::optional<int> parseArgs(int argc, char** argv, Options* o) {
  using bagua::cli::flagNames;
  CLI::App app{
      "Throughput (GB/s) and one-way latency (us) of the Bagua-Net plugin over loopback, with "
      "baselines from the same run: one plain TCP socket ('tcp') and our engine with an "
      "equal-split round-robin schedule ('rr', like NCCL Socket and the original Bagua-Net). "
      "--netns RECV_NS,SEND_NS switches to the shaped-link mode, --ring N to N processes in a "
      "ring over loopback (each mode's --help tells).",
      "bagua-net-bench"};
  bagua::cli::configure(app);
  app.add_option("--plugin", o->plugin,
                 "the plugin to load; default: BAGUA_NET_PLUGIN_PATH if set, else the build "
                 "tree's (net_plugin/libnccl-net.so beside tools/), else the installed one "
                 "(<libdir>/libnccl-net.so of this executable's prefix)")
      ->type_name("PATH");
  addSizeList(app, "--sizes", &o->sizes, "message sizes of the throughput runs");
  addSizeList(app, "--streams", &o->streams, "the plugin's stream counts (1..64 each)");
  addSizeList(app, flagNames("latency_sizes"), &o->latencySizes,
              "message sizes of the latency runs");
  app.add_option("--window", o->window, "messages in flight")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  app.add_option("--conns", o->conns, "connections")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--seconds", o->seconds, "seconds per measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--json", o->json, "also write the results to FILE as JSON")->type_name("FILE");
  app.add_flag("--demo", o->demo, "the quick version ./bagua demo runs");
  app.add_option(flagNames("slow_stream"), o->slowStream,
                 "pace data stream 0 of every plugin connection to RATE bytes/s (K/M/G suffixes; "
                 "BAGUA_NET_SLOW_STREAM_RATE): one slow flow among fast ones")
      ->type_name("RATE");
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return rc;
  }
  for (uint64_t s : o->streams) {
    if (s < 1 || s > 64) {
      return bagua::cli::usageError(app,
                                    "--streams values must be 1..64, got " + std::to_string(s));
    }
  }
  return std::nullopt;
}

struct Row {
  uint64_t size;
  int streams;
  double tcp, rr, dyn;
};

}  // namespace

int main(int argc, char** argv) {
  const DefaultPlugin defaultPlugin = findDefaultPlugin();
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--netns") {
      return bagua::netbench::linksMain(argc, argv, defaultPlugin);
    }
    if (std::string(argv[i]) == "--ring") {
      return bagua::netbench::ringMain(argc, argv, defaultPlugin);
    }
  }
  Options o;
  o.plugin = defaultPlugin.path;
  if (std::optional<int> rc = parseArgs(argc, argv, &o)) {
    return *rc;
  }
  if (o.demo) {
    o.sizes = {64 << 10, 1 << 20, 16 << 20};
    o.streams = {1, 2, 8};
    o.latencySizes = {8, 64 << 10, 1 << 20};
    o.seconds = 0.2;
    o.conns = 2;
  }
  requirePlugin(o.plugin, defaultPlugin);
  if (!bagua::processEnv("NCCL_SOCKET_IFNAME").has_value()) {
    setenv("NCCL_SOCKET_IFNAME", "=lo", 1);
  }
  if (!o.slowStream.empty()) {
    // The plugin validates it (and fails init naming the key if it is not a byte count).
    setenv("BAGUA_NET_SLOW_STREAM_RATE", o.slowStream.c_str(), 1);
  }
  unsigned cores = std::thread::hardware_concurrency();
  std::printf("Bagua-Net loopback benchmark: %s\n", o.plugin.c_str());
  if (!o.slowStream.empty()) {
    std::printf(
        "  SLOW STREAM: data stream 0 of every plugin connection paced to %s B/s (the\n"
        "  tcp baseline is not paced)\n",
        o.slowStream.c_str());
  }
  std::printf("  %d connection(s) in parallel, %d requests in flight per side, %u CPU cores\n",
              o.conns, o.window, cores);
  std::printf("  tcp = one plain TCP socket per connection; rr = equal split round-robin over N\n");
  std::printf(
      "  streams; bagua = dynamic chunk scheduling over N streams (GB/s, higher is better)\n\n");

  std::vector<double> tcp(o.sizes.size());
  for (size_t i = 0; i < o.sizes.size(); ++i) {
    tcp[i] = tcpThroughput(o.sizes[i], o.conns, o.seconds);
  }
  std::vector<Row> rows;
  for (uint64_t n : o.streams) {
    std::vector<double> rr(o.sizes.size()), dyn(o.sizes.size());
    {
      Plugin p(o.plugin, static_cast<int>(n), "roundrobin");
      for (size_t i = 0; i < o.sizes.size(); ++i) {
        rr[i] = pluginThroughput(p, o.sizes[i], o.window, o.conns, o.seconds);
      }
    }
    {
      Plugin p(o.plugin, static_cast<int>(n), "dynamic");
      for (size_t i = 0; i < o.sizes.size(); ++i) {
        dyn[i] = pluginThroughput(p, o.sizes[i], o.window, o.conns, o.seconds);
      }
    }
    for (size_t i = 0; i < o.sizes.size(); ++i) {
      rows.push_back(Row{o.sizes[i], static_cast<int>(n), tcp[i], rr[i], dyn[i]});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return a.size != b.size ? a.size < b.size : a.streams < b.streams;
  });
  std::printf("%8s %8s %9s %9s %9s %10s %9s\n", "size", "streams", "tcp", "rr", "bagua",
              "bagua/tcp", "bagua/rr");
  for (const Row& r : rows) {
    std::printf("%8s %8d %9.2f %9.2f %9.2f %9.2fx %8.2fx\n", fmtBytes(r.size).c_str(), r.streams,
                r.tcp, r.rr, r.dyn, r.dyn / r.tcp, r.dyn / r.rr);
  }

  struct Lat {
    uint64_t size;
    double tcp, bagua;
  };
  std::vector<Lat> lats;
  if (!o.latencySizes.empty()) {
    uint64_t n = o.streams.back();
    Plugin p(o.plugin, static_cast<int>(n), "dynamic");
    for (uint64_t s : o.latencySizes) {
      int iters = s <= (64 << 10) ? 2000 : 300;
      if (o.demo) {
        iters /= 4;
      }
      lats.push_back(Lat{s, tcpLatency(s, iters), pluginLatency(p, s, iters)});
    }
    std::printf("\none-way latency (ping-pong / 2, us, lower is better), bagua with %llu streams\n",
                static_cast<unsigned long long>(n));
    std::printf("%8s %10s %10s %12s\n", "size", "tcp", "bagua", "bagua/tcp");
    for (const Lat& l : lats) {
      std::printf("%8s %10.1f %10.1f %11.2fx\n", fmtBytes(l.size).c_str(), l.tcp, l.bagua,
                  l.bagua / l.tcp);
    }
  }

  if (!o.json.empty()) {
    nlohmann::ordered_json throughput = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      throughput.push_back({{"size", r.size},
                            {"streams", r.streams},
                            {"tcp_GBps", r.tcp},
                            {"rr_GBps", r.rr},
                            {"bagua_GBps", r.dyn}});
    }
    nlohmann::ordered_json latency = nlohmann::ordered_json::array();
    for (const Lat& l : lats) {
      latency.push_back({{"size", l.size}, {"tcp_us", l.tcp}, {"bagua_us", l.bagua}});
    }
    writeJson(o.json, {{"cores", cores},
                       {"conns", o.conns},
                       {"window", o.window},
                       {"throughput", std::move(throughput)},
                       {"latency", std::move(latency)}});
  }
  return 0;
}
