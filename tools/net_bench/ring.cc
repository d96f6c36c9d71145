// bagua-net-bench --ring N: N processes on this host in a ring, the traffic pattern of NCCL's ring
// all-reduce over the network path: each rank sends to the next and receives from the previous
// one over C connections (NCCL's channels), every connection carrying messages of one size with a
// window in flight (NCCL keeps up to 8 steps per connection). What grows from 2 to 4 ranks on one
// host is the number of processes, connections and helper threads sharing its cores: this mode
// shows the transport's throughput and CPU cost per GB in that setting, against one plain TCP
// socket per connection (NCCL's Socket transport without helper threads).
//
// Processes: the bench forks N ranks before any thread exists. Neighbours exchange connection
// handles over socketpairs made before the fork; each rank reports to the bench through a pipe.
// Per rank: the plugin's connections are driven by one progress thread, as NCCL's proxy thread
// drives them (polling test(), yielding when idle); the plain sockets by one blocking thread per
// connection and direction (cheaper than NCCL's Socket transport, which polls them from its proxy
// thread too).
#include "ring.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "bagua/net/engine.h"
#include "driver.h"

namespace bagua::netbench {

namespace {

struct RingOptions {
  std::string plugin;
  int ranks = 4;
  int channels = 4;
  std::vector<uint64_t> sizes = {512 << 10, 2 << 20};
  std::vector<Case> cases = {parseCase("socket"), parseCase("bagua:8"), parseCase("bagua:2")};
  int window = 8;
  uint64_t bytesPerConn = 256 << 20;
  std::string json;
  int repeat = 1;  // a case may name its own build (Case::pluginPath): A/B in one run
};

struct RankResult {
  double seconds = 0;     // the pump phase, this rank
  double cpu = 0;         // process CPU seconds in the pump phase
  double pluginCpu = 0;   // of which the plugin's own threads (all but the progress thread)
  double switches = 0;    // voluntary context switches of the process in the pump phase
  uint64_t sent = 0;      // payload bytes this rank sent
  uint64_t messages = 0;  // messages this rank sent
};

// A --cases item of the ring mode: a case (socket, bagua:S, rr:S), a plugin case with its own
// build (bagua:S@PATH, rr:S@PATH), or another NCCL net plugin under a label (NAME@PATH); the
// error for anything else ("" when it is one of these).
std::string ringCaseError(const std::string& c) {
  const size_t at = c.find('@');
  const std::string kind = c.substr(0, at);
  if (at != std::string::npos && at + 1 < c.size() && kind.find(':') == std::string::npos &&
      kind != "socket") {
    return "";  // NAME@PATH
  }
  if (std::string why = caseError(kind); !why.empty()) {
    return why;
  }
  if (at != std::string::npos && kind == "socket") {
    return "'" + c + "': only plugin cases (bagua:S, rr:S) take @PATH";
  }
  return "";
}

Case ringCase(const std::string& c) {
  const size_t at = c.find('@');
  const std::string kind = c.substr(0, at);
  if (at != std::string::npos && at + 1 < c.size() && kind.find(':') == std::string::npos &&
      kind != "socket") {
    // NAME@PATH: another NCCL net plugin (v11 or v6 table), e.g. Google's fastsocket.
    Case k;
    k.label = kind;
    k.plugin = true;
    k.pluginPath = c.substr(at + 1);
    return k;
  }
  Case k = parseCase(kind);
  if (at != std::string::npos && at + 1 < c.size()) {
    k.pluginPath = c.substr(at + 1);
    k.label = kind + "@" + k.pluginPath.substr(k.pluginPath.rfind('/') + 1);
  }
  return k;
}

// The ring mode's command line into `o`: nullopt to run, else ringMain's exit status.
std::optional<int> parseArgs(int argc, char** argv, RingOptions* o) {
  CLI::App app{
      "N processes (2..16) on loopback in a ring, each sending to the next and receiving from "
      "the previous one over C connections (NCCL's channels), messages of each size with "
      "--window in flight, --bytes per connection. Prints the ranks' aggregate send rate, CPU "
      "seconds per GB sent (all threads, and the plugin's own threads alone: all but the "
      "progress thread) and voluntary context switches per message sent.",
      "bagua-net-bench"};
  bagua::cli::configure(app);
  app.add_option("--ring", o->ranks, "processes in the ring")->check(CLI::Range(2, 16))->required();
  app.add_option("--channels", o->channels, "connections each way per rank")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  addSizeList(app, "--sizes", &o->sizes, "message sizes");
  std::vector<std::string> cases = {"socket", "bagua:8", "bagua:2"};
  app.add_option("--cases", cases,
                 "socket (one TCP socket per connection), bagua:S (the plugin, S streams), rr:S "
                 "(equal split); a plugin case may name its own build (bagua:8@/path/"
                 "libnccl-net.so); NAME@PATH loads another NCCL net plugin under that label "
                 "(ncclNetPlugin_v11 or _v6: fastsocket@/path/libnccl-net-fastsocket.so)")
      ->type_name("LIST")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Validator([](std::string& c) { return ringCaseError(c); }, "CASE"))
      ->capture_default_str();
  app.add_option("--repeat", o->repeat,
                 "runs of every size, the cases interleaved within each; prints each case's "
                 "median with the range")
      ->check(CLI::Range(1, 50))
      ->capture_default_str();
  app.add_option("--window", o->window, "messages in flight per connection")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  bagua::cli::addBytes(app, "--bytes", &o->bytesPerConn, 1, "bytes per connection");
  app.add_option("--plugin", o->plugin, "the plugin to load (as in the loopback mode)")
      ->type_name("PATH");
  app.add_option("--json", o->json, "also write the results to FILE as JSON")->type_name("FILE");
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return rc;
  }
  o->cases.clear();
  for (const std::string& c : cases) {
    o->cases.push_back(ringCase(c));
  }
  if (o->cases.empty()) {
    return bagua::cli::usageError(app, "--cases needs at least one case");
  }
  for (Case& k : o->cases) {
    if (k.plugin && k.pluginPath.empty()) {
      k.pluginPath = o->plugin;
    }
  }
  return std::nullopt;
}

// ---- one rank ----------------------------------------------------------------------------------

// Plain sockets: rank r listens (C sockets on 127.0.0.1), tells rank r-1 the ports, connects C
// sockets to rank r+1, then pumps.
void socketRank(const RingOptions& o, uint64_t size, int toPrev, int toNext, RankResult* out) {
  std::vector<int> listeners(static_cast<size_t>(o.channels));
  std::vector<uint16_t> ports(static_cast<size_t>(o.channels));
  for (int c = 0; c < o.channels; ++c) {
    int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        ::listen(l, 16) != 0 || getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      die("ring: listen failed");
    }
    listeners[static_cast<size_t>(c)] = l;
    ports[static_cast<size_t>(c)] = ntohs(sa.sin_port);
  }
  ctlSend(toPrev, ports.data(), ports.size() * sizeof(uint16_t));
  std::vector<uint16_t> nextPorts(static_cast<size_t>(o.channels));
  ctlRecv(toNext, nextPorts.data(), nextPorts.size() * sizeof(uint16_t));
  std::vector<int> sends(static_cast<size_t>(o.channels));
  std::vector<int> recvs(static_cast<size_t>(o.channels));
  for (int c = 0; c < o.channels; ++c) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(nextPorts[static_cast<size_t>(c)]);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      die(std::string("ring: connect: ") + std::strerror(errno));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sends[static_cast<size_t>(c)] = fd;
  }
  for (int c = 0; c < o.channels; ++c) {
    recvs[static_cast<size_t>(c)] = ::accept(listeners[static_cast<size_t>(c)], nullptr, nullptr);
    ::close(listeners[static_cast<size_t>(c)]);
    if (recvs[static_cast<size_t>(c)] < 0) {
      die("ring: accept failed");
    }
  }
  // Connections are accepted in arrival order, one listener per channel: no pairing needed.
  const int count = static_cast<int>(std::max<uint64_t>(1, o.bytesPerConn / size));
  char go = 1;
  ctlSend(toNext, &go, 1);  // both neighbours ready before anyone starts the clock
  ctlRecv(toPrev, &go, 1);
  double cpu0 = cpuSeconds();
  double sw0 = contextSwitches();
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < o.channels; ++c) {
    threads.emplace_back([&, c] {
      std::vector<uint8_t> buf(size, 0x5a);
      for (int i = 0; i < count; ++i) {
        if (!bagua::net::sendAll(sends[static_cast<size_t>(c)], buf.data(), size).isOk()) {
          die("ring: send failed");
        }
      }
    });
    threads.emplace_back([&, c] {
      std::vector<uint8_t> buf(size);
      for (int i = 0; i < count; ++i) {
        if (!bagua::net::recvAll(recvs[static_cast<size_t>(c)], buf.data(), size).isOk()) {
          die("ring: recv failed");
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  out->seconds = secondsSince(t0);
  out->cpu = cpuSeconds() - cpu0;
  out->switches = contextSwitches() - sw0;
  out->sent = size * static_cast<uint64_t>(count) * static_cast<uint64_t>(o.channels);
  out->messages = static_cast<uint64_t>(count) * static_cast<uint64_t>(o.channels);
  for (int c = 0; c < o.channels; ++c) {
    ::close(sends[static_cast<size_t>(c)]);
    ::close(recvs[static_cast<size_t>(c)]);
  }
}

// One progress thread for every connection of the rank, as NCCL's proxy thread drives them:
// keeps `window` sends and receives in flight per connection, tests the oldest of each, yields
// when nothing completed.
void progressLoop(ncclNet_v11_t* net, const std::vector<void*>& sends,
                  const std::vector<void*>& recvs, uint64_t size, int count, int window) {
  struct Dir {
    void* comm;
    bool send;
    std::vector<void*> inflight;  // oldest first
    int posted = 0;
    int done = 0;
  };
  std::vector<Dir> dirs;
  for (void* s : sends) {
    dirs.push_back(Dir{s, true, {}});
  }
  for (void* r : recvs) {
    dirs.push_back(Dir{r, false, {}});
  }
  std::vector<uint8_t> sbuf(size, 0x5a);
  std::vector<uint8_t> rbuf(size);
  int remaining = static_cast<int>(dirs.size());
  while (remaining > 0) {
    bool progress = false;
    for (Dir& d : dirs) {
      if (d.done == count) {
        continue;
      }
      while (d.posted < count && static_cast<int>(d.inflight.size()) < window) {
        void* req = nullptr;
        if (d.send) {
          Plugin::check(net->isend(d.comm, sbuf.data(), size, 0, nullptr, nullptr, &req), "isend");
        } else {
          void* data = rbuf.data();
          size_t cap = size;
          int tag = 0;
          Plugin::check(net->irecv(d.comm, 1, &data, &cap, &tag, nullptr, nullptr, &req), "irecv");
        }
        if (req == nullptr) {
          break;
        }
        d.inflight.push_back(req);
        ++d.posted;
      }
      int isDone = 0;
      Plugin::check(net->test(d.inflight.front(), &isDone, nullptr), "test");
      if (isDone) {
        d.inflight.erase(d.inflight.begin());
        progress = true;
        if (++d.done == count) {
          --remaining;
        }
      }
    }
    if (!progress) {
      std::this_thread::yield();
    }
  }
}

void pluginRank(const RingOptions& o, const Case& kase, uint64_t size, int toPrev, int toNext,
                RankResult* out) {
  Plugin p(kase.pluginPath, kase.streams, kase.schedule);
  ncclNet_v11_t* net = p.net();
  const size_t n = static_cast<size_t>(o.channels);
  std::vector<void*> listens(n);
  std::vector<char> handles(n * NCCL_NET_HANDLE_MAXSIZE);
  for (size_t c = 0; c < n; ++c) {
    char h[NCCL_NET_HANDLE_MAXSIZE] = {};
    listens[c] = p.listen(0, h);
    std::memcpy(&handles[c * NCCL_NET_HANDLE_MAXSIZE], h, sizeof(h));
  }
  ctlSend(toPrev, handles.data(), handles.size());
  std::vector<char> nextHandles(handles.size());
  ctlRecv(toNext, nextHandles.data(), nextHandles.size());
  std::vector<void*> sends(n, nullptr);
  std::vector<void*> recvs(n, nullptr);
  auto c0 = Clock::now();
  for (size_t done = 0; done < 2 * n;) {
    done = 0;
    for (size_t c = 0; c < n; ++c) {
      if (sends[c] == nullptr) {
        char h[NCCL_NET_HANDLE_MAXSIZE];
        std::memcpy(h, &nextHandles[c * NCCL_NET_HANDLE_MAXSIZE], sizeof(h));
        sends[c] = p.connectStep(0, h);
        std::memcpy(&nextHandles[c * NCCL_NET_HANDLE_MAXSIZE], h, sizeof(h));  // connect state
      }
      if (recvs[c] == nullptr) {
        recvs[c] = p.acceptStep(listens[c]);
      }
      done += (sends[c] != nullptr) + (recvs[c] != nullptr);
    }
    if (secondsSince(c0) > 30 || peerGone(toPrev) || peerGone(toNext)) {
      die("ring: connections not up (a neighbour exited, or 30 s passed)");
    }
  }
  for (void* l : listens) {
    Plugin::check(net->closeListen(l), "closeListen");
  }
  const int count = static_cast<int>(std::max<uint64_t>(1, o.bytesPerConn / size));
  char go = 1;
  ctlSend(toNext, &go, 1);
  ctlRecv(toPrev, &go, 1);
  double cpu0 = cpuSeconds();
  double self0 = threadCpuSeconds();
  double sw0 = contextSwitches();
  auto t0 = Clock::now();
  progressLoop(net, sends, recvs, size, count, o.window);
  out->seconds = secondsSince(t0);
  out->cpu = cpuSeconds() - cpu0;
  out->switches = contextSwitches() - sw0;
  out->messages = static_cast<uint64_t>(count) * n;
  // The transport's own threads: everything but this progress thread (NCCL's proxy here).
  out->pluginCpu = std::max(0.0, out->cpu - (threadCpuSeconds() - self0));
  out->sent = size * static_cast<uint64_t>(count) * n;
  // Close the sends only once the next rank received everything (it says so to its previous).
  ctlSend(toPrev, &go, 1);
  ctlRecv(toNext, &go, 1);
  for (size_t c = 0; c < n; ++c) {
    Plugin::check(net->closeSend(sends[c]), "closeSend");
    Plugin::check(net->closeRecv(recvs[c]), "closeRecv");
  }
}

// ---- the bench: N forked ranks -----------------------------------------------------------------

struct Aggregate {
  double gbps = 0;      // payload GB/s sent by all ranks together (sum of bytes / slowest rank)
  double cpuPerGb = 0;  // CPU seconds of all ranks per GB sent
  double pluginCpuPerGb = 0;
  double switchesPerMessage = 0;  // voluntary context switches of all ranks per message sent
};

Aggregate runCase(const RingOptions& o, const Case& kase, uint64_t size) {
  const int n = o.ranks;
  // links[k]: between rank k (end 0, its "next" side) and rank k+1 (end 1, its "prev" side).
  std::vector<std::array<int, 2>> links(static_cast<size_t>(n));
  std::vector<std::array<int, 2>> results(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, links[static_cast<size_t>(k)].data()) !=
            0 ||
        pipe2(results[static_cast<size_t>(k)].data(), O_CLOEXEC) != 0) {
      die(std::string("socketpair/pipe: ") + std::strerror(errno));
    }
  }
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      die(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
      int toNext = links[static_cast<size_t>(r)][0];
      int toPrev = links[static_cast<size_t>((r + n - 1) % n)][1];
      RankResult res;
      if (!kase.plugin) {
        socketRank(o, size, toPrev, toNext, &res);
      } else {
        pluginRank(o, kase, size, toPrev, toNext, &res);
      }
      int fd = results[static_cast<size_t>(r)][1];
      if (::write(fd, &res, sizeof(res)) != static_cast<ssize_t>(sizeof(res))) {
        _exit(3);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (int k = 0; k < n; ++k) {
    ::close(links[static_cast<size_t>(k)][0]);
    ::close(links[static_cast<size_t>(k)][1]);
    ::close(results[static_cast<size_t>(k)][1]);
  }
  Aggregate agg;
  double slowest = 0;
  double cpu = 0;
  double pluginCpu = 0;
  double switches = 0;
  uint64_t sent = 0;
  uint64_t messages = 0;
  bool ok = true;
  for (int r = 0; r < n; ++r) {
    int fd = results[static_cast<size_t>(r)][0];
    RankResult res;
    pollfd pfd{fd, POLLIN, 0};
    // Bounded: set-up is bounded at 30 s in the ranks; the pump at --bytes per connection.
    if (::poll(&pfd, 1, 300 * 1000) <= 0 ||
        ::read(fd, &res, sizeof(res)) != static_cast<ssize_t>(sizeof(res))) {
      ok = false;
      break;
    }
    slowest = std::max(slowest, res.seconds);
    cpu += res.cpu;
    pluginCpu += res.pluginCpu;
    switches += res.switches;
    sent += res.sent;
    messages += res.messages;
  }
  for (pid_t pid : pids) {
    if (!ok) {
      kill(pid, SIGKILL);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  for (int k = 0; k < n; ++k) {
    ::close(results[static_cast<size_t>(k)][0]);
  }
  if (!ok || slowest <= 0) {
    die("ring case " + kase.label + " " + fmtBytes(size) + " failed (see the messages above)");
  }
  double gb = static_cast<double>(sent) / 1e9;
  agg.gbps = gb / slowest;
  agg.cpuPerGb = cpu / gb;
  agg.pluginCpuPerGb = pluginCpu / gb;
  agg.switchesPerMessage = switches / static_cast<double>(std::max<uint64_t>(messages, 1));
  return agg;
}

}  // namespace

int ringMain(int argc, char** argv, const DefaultPlugin& defaultPlugin) {
  RingOptions o;
  o.plugin = defaultPlugin.path;
  if (std::optional<int> rc = parseArgs(argc, argv, &o)) {
    return *rc;
  }
  requirePlugin(o.plugin, defaultPlugin);
  for (const Case& k : o.cases) {
    if (k.plugin && access(k.pluginPath.c_str(), R_OK) != 0) {
      die("plugin not found at " + k.pluginPath + " (its case names it)");
    }
  }
  if (!bagua::processEnv("NCCL_SOCKET_IFNAME").has_value()) {
    setenv("NCCL_SOCKET_IFNAME", "=lo", 1);
  }
  unsigned cores = std::thread::hardware_concurrency();
  std::printf(
      "Ring of %d processes over loopback, %d connections each way per rank, %d in flight\n",
      o.ranks, o.channels, o.window);
  std::printf("  %u CPU cores; %s per connection\n\n", cores, fmtBytes(o.bytesPerConn).c_str());
  if (o.repeat > 1) {
    std::printf("%d repetitions, cases interleaved: median [min - max]\n", o.repeat);
  }
  std::printf("%8s %10s %10s %12s %14s %10s\n", "size", "case", "GB/s", "CPU s/GB", "plugin s/GB",
              "wakes/msg");
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  for (uint64_t size : o.sizes) {
    std::vector<std::vector<Aggregate>> runs(o.cases.size());
    for (int rep = 0; rep < o.repeat; ++rep) {
      for (size_t k = 0; k < o.cases.size(); ++k) {
        runs[k].push_back(runCase(o, o.cases[k], size));
      }
    }
    for (size_t k = 0; k < o.cases.size(); ++k) {
      std::vector<double> gbps, cpu, pcpu, sw;
      for (const Aggregate& a : runs[k]) {
        gbps.push_back(a.gbps);
        cpu.push_back(a.cpuPerGb);
        pcpu.push_back(a.pluginCpuPerGb);
        sw.push_back(a.switchesPerMessage);
      }
      Aggregate a{median(gbps), median(cpu), median(pcpu), median(sw)};
      std::printf("%8s %10s %10.3f %12.3f %14.3f %10.2f", fmtBytes(size).c_str(),
                  o.cases[k].label.c_str(), a.gbps, a.cpuPerGb, a.pluginCpuPerGb,
                  a.switchesPerMessage);
      if (o.repeat > 1) {
        std::printf(
            "   [%.3f - %.3f GB/s, %.3f - %.3f s/GB]", *std::min_element(gbps.begin(), gbps.end()),
            *std::max_element(gbps.begin(), gbps.end()), *std::min_element(cpu.begin(), cpu.end()),
            *std::max_element(cpu.begin(), cpu.end()));
      }
      std::printf("\n");
      std::fflush(stdout);
      results.push_back({{"case", o.cases[k].label},
                         {"size", size},
                         {"GBps", a.gbps},
                         {"cpu_s_per_GB", a.cpuPerGb},
                         {"plugin_cpu_s_per_GB", a.pluginCpuPerGb},
                         {"switches_per_message", a.switchesPerMessage},
                         {"GBps_runs", gbps},
                         {"cpu_s_per_GB_runs", cpu},
                         {"switches_per_message_runs", sw}});
    }
  }
  if (!o.json.empty()) {
    writeJson(o.json, {{"mode", "ring"},
                       {"ranks", o.ranks},
                       {"channels", o.channels},
                       {"cores", cores},
                       {"results", std::move(results)}});
  }
  return 0;
}

}  // namespace bagua::netbench
