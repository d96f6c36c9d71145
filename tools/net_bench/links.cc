// bagua-net-bench --netns RECV,SEND: one endpoint in each of two network namespaces (made by
// tools/net_bench/shaped_links.sh, joined by htb-shaped veth links), so that the plugin crosses a
// link with a line rate instead of loopback.
//
// Each trial forks two children from the (single-threaded) bench: the receiver enters RECV, the
// sender SEND (setns), each loads the plugin itself, as two ranks on two hosts would. They talk
// over a socketpair made before the fork (AF_UNIX is not bound to a network namespace): the
// receiver's handle, the message count, the sender's CPU time. The receiver reports to the parent
// through a pipe. Cases:
//   socket     one plain TCP socket with kernel-default buffers, whole messages with blocking
//              send/recv (NCCL's Socket transport on a NIC without helper threads)
//   bagua:N    the plugin, dynamic schedule, N data streams
//   rr:N       the plugin, equal-split round-robin over N streams (NCCL Socket with helper
//              threads, the original Bagua-Net)
// Per trial the receiver counts the bytes each interface of its namespace received
// (/proc/self/net/dev), so a device spanning several links shows how it spread the load.
#include "links.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "bagua/net/engine.h"
#include "bagua/net/socket_io.h"
#include "driver.h"

namespace bagua::netbench {

namespace {

struct LinkOptions {
  std::string plugin;
  std::string recvNs, sendNs;
  std::vector<uint64_t> sizes = {8 << 20, 64 << 20};
  std::vector<Case> cases;
  int window = 8;
  double seconds = 2.0;
  int trials = 1;
  uint64_t lineRateBits = 0;  // for the "of line rate" column; 0: not shown
  std::string json;
};

// Result of one trial, as the receiver measured it.
struct Trial {
  double gbps = 0;     // payload Gbit/s
  double recvCpu = 0;  // receiver CPU seconds (user + system) over the measured phase
  double sendCpu = 0;  // sender CPU seconds
  double seconds = 0;  // measured phase
  uint64_t bytes = 0;  // payload bytes of the measured phase
  std::map<std::string, uint64_t> linkBytes;  // per interface of the receiver's namespace
};

// "4gbit" -> 4e9 (gbit, mbit, kbit; any case); 0 when `text` is not such a rate.
uint64_t parseRateBits(const std::string& text) {
  std::string t;
  for (char c : text) {
    t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 15) {
    return 0;
  }
  uint64_t n = std::stoull(t.substr(0, digits));
  std::string unit = t.substr(digits);
  if (unit == "gbit") {
    return n * 1000000000ULL;
  }
  if (unit == "mbit") {
    return n * 1000000ULL;
  }
  if (unit == "kbit") {
    return n * 1000ULL;
  }
  return 0;
}

// The shaped-link mode's command line into `o`: nullopt to run, else linksMain's exit status.
std::optional<int> parseArgs(int argc, char** argv, LinkOptions* o) {
  using bagua::cli::flagNames;
  CLI::App app{
      "Goodput between two network namespaces (tools/net_bench/shaped_links.sh makes them): the "
      "receiver runs in RECV_NS, the sender in SEND_NS, each a process of its own. Cases: socket "
      "(one TCP socket, NCCL Socket without helper threads), bagua:N (the plugin, N streams), "
      "rr:N (the plugin, equal-split round-robin). Each figure is the best of --trials runs: a "
      "shaped link caps from above and a loaded machine only lowers a figure. "
      "NCCL_SOCKET_IFNAME (default =bn0) picks the interfaces in both namespaces; the socket "
      "case uses the first one. Other BAGUA_NET_* variables reach the plugin as they are.",
      "bagua-net-bench"};
  bagua::cli::configure(app);
  std::vector<std::string> ns;
  app.add_option("--netns", ns, "the receiver's and the sender's network namespace")
      ->type_name("RECV_NS,SEND_NS")
      ->delimiter(',')
      ->expected(2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->required();
  app.add_option("--plugin", o->plugin, "the plugin to load (as in the loopback mode)")
      ->type_name("PATH");
  addSizeList(app, "--sizes", &o->sizes, "message sizes");
  std::vector<std::string> cases = {"socket", "bagua:8"};
  app.add_option("--cases", cases, "the contestants: socket, bagua:N, rr:N")
      ->type_name("LIST")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Validator([](std::string& c) { return caseError(c); }, "CASE"))
      ->capture_default_str();
  app.add_option("--window", o->window, "messages in flight")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  app.add_option("--seconds", o->seconds, "seconds per trial")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--trials", o->trials, "trials per figure (the best is shown)")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  app.add_option_function<std::string>(
         flagNames("line_rate"), [o](const std::string& v) { o->lineRateBits = parseRateBits(v); },
         "the links' rate, for the 'of line rate' column (e.g. 4gbit, 500mbit)")
      ->type_name("RATE")
      ->check(CLI::Validator(
          [](std::string& v) {
            return parseRateBits(v) > 0
                       ? std::string()
                       : "want a rate such as 4gbit, 500mbit or 100kbit, got '" + v + "'";
          },
          "RATE"));
  app.add_option("--json", o->json, "also write the results to FILE as JSON")->type_name("FILE");
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return rc;
  }
  if (ns.size() != 2) {
    return bagua::cli::usageError(app, "--netns takes RECV_NS,SEND_NS");
  }
  o->recvNs = ns[0];
  o->sendNs = ns[1];
  for (const std::string& c : cases) {
    o->cases.push_back(parseCase(c));
  }
  if (o->cases.empty()) {
    return bagua::cli::usageError(app, "--cases needs at least one case");
  }
  return std::nullopt;
}

// A namespace name (`ip netns` keeps them in /var/run/netns) or a path; exits when absent.
int openNetns(const std::string& ns) {
  std::string path = ns.find('/') == std::string::npos ? "/var/run/netns/" + ns : ns;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    die("cannot open network namespace " + path + ": " + std::strerror(errno) +
        " (make it with tools/net_bench/shaped_links.sh up)");
  }
  return fd;
}

void enterNetns(const std::string& ns) {
  int fd = openNetns(ns);
  std::string path = ns;
  if (::setns(fd, CLONE_NEWNET) != 0) {
    die("setns(" + path + "): " + std::strerror(errno) + " (needs CAP_SYS_ADMIN)");
  }
  ::close(fd);
}

// Received bytes per interface of this process's network namespace (lo left out).
std::map<std::string, uint64_t> rxBytes() {
  std::map<std::string, uint64_t> out;
  std::ifstream f("/proc/self/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) {
      continue;
    }
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name == "lo") {
      continue;
    }
    std::istringstream rest(line.substr(colon + 1));
    uint64_t bytes = 0;
    rest >> bytes;
    out[name] = bytes;
  }
  return out;
}

// Warm-up messages (TCP's slow start, the rate guess that sizes the measured phase): about
// 64 MiB, 2 to 2 x window messages, so that large messages on a slow link stay short.
int warmMessages(uint64_t size, int window) {
  return static_cast<int>(std::clamp<uint64_t>((64u << 20) / std::max<uint64_t>(size, 1), 2,
                                               static_cast<uint64_t>(2 * window)));
}

// One trial's receiving side, whatever carries the bytes: `receive(n)` takes n messages of
// `size`. Warm-up, then a count sized to --seconds from the warm-up's rate (sent to the sender
// over `ctl`), then the timed phase with CPU time and per-link byte counters.
template <typename Receive>
void measureReceive(const LinkOptions& o, uint64_t size, int ctl, Trial* t, Receive&& receive) {
  const int warm = warmMessages(size, o.window);
  auto w0 = Clock::now();
  receive(warm);
  int count =
      messagesFor(size, o.seconds, static_cast<double>(size) * warm / secondsSince(w0) / 1e9);
  auto links0 = rxBytes();
  double cpu0 = cpuSeconds();
  auto t0 = Clock::now();
  ctlSend(ctl, &count, sizeof(count));
  receive(count);
  t->seconds = secondsSince(t0);
  t->recvCpu = cpuSeconds() - cpu0;
  t->bytes = size * static_cast<uint64_t>(count);
  for (auto& [name, bytes] : rxBytes()) {
    t->linkBytes[name] = bytes - links0[name];
  }
}

// The sending side of measureReceive: warm-up, the count from the receiver, the timed phase;
// its CPU time goes back over `ctl`.
template <typename Send>
void measureSend(const LinkOptions& o, uint64_t size, int ctl, Send&& send) {
  send(warmMessages(size, o.window));
  int count = 0;
  ctlRecv(ctl, &count, sizeof(count));
  double cpu0 = cpuSeconds();
  send(count);
  double cpu = cpuSeconds() - cpu0;
  ctlSend(ctl, &cpu, sizeof(cpu));
}

// The address of the first interface NCCL_SOCKET_IFNAME selects in this namespace.
bagua::net::SocketAddress firstInterface() {
  std::string spec = bagua::processEnv("NCCL_SOCKET_IFNAME").value_or("");
  auto ifs = bagua::net::findInterfaces(spec, AF_INET, 16);
  if (!ifs.isOk() || ifs->empty()) {
    die("no interface matches NCCL_SOCKET_IFNAME='" + spec + "' in this namespace");
  }
  return (*ifs)[0].address;
}

// ---- the plain socket case ---------------------------------------------------------------------

void socketReceiver(const LinkOptions& o, uint64_t size, int ctl, Trial* t) {
  bagua::net::SocketAddress addr = firstInterface();
  reinterpret_cast<sockaddr_in*>(&addr.storage)->sin_port = 0;
  int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof(addr.storage);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&addr.storage), addr.length) != 0 ||
      ::listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&addr.storage), &len) != 0) {
    die("socket case: listen on " + addr.toString() + " failed: " + std::strerror(errno));
  }
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  std::memcpy(handle, &addr.storage, sizeof(sockaddr_in));
  ctlSend(ctl, handle, sizeof(handle));
  int fd = ::accept(l, nullptr, nullptr);
  ::close(l);
  if (fd < 0) {
    die(std::string("socket case: accept: ") + std::strerror(errno));
  }
  std::vector<uint8_t> buf(size);
  measureReceive(o, size, ctl, t, [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (!bagua::net::recvAll(fd, buf.data(), size).isOk()) {
        die("socket case: recv failed");
      }
    }
  });
  ::close(fd);
}

void socketSender(const LinkOptions& o, uint64_t size, int ctl) {
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  ctlRecv(ctl, handle, sizeof(handle));
  sockaddr_in sa{};
  std::memcpy(&sa, handle, sizeof(sa));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    die(std::string("socket case: connect: ") + std::strerror(errno));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<uint8_t> buf(size, 0x5a);
  measureSend(o, size, ctl, [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (!bagua::net::sendAll(fd, buf.data(), size).isOk()) {
        die("socket case: send failed");
      }
    }
  });
  ::close(fd);
}

// ---- the plugin cases --------------------------------------------------------------------------

void pluginReceiver(const LinkOptions& o, const Case& c, uint64_t size, int ctl, Trial* t) {
  Plugin p(o.plugin, c.streams, c.schedule);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = p.listen(0, handle);
  ctlSend(ctl, handle, sizeof(handle));
  void* recv = nullptr;
  auto a0 = Clock::now();
  while ((recv = p.acceptStep(listenComm)) == nullptr) {
    if (secondsSince(a0) > 30 || peerGone(ctl)) {
      die("no connection from the sender (it exited, or 30 s passed)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  Plugin::check(p.net()->closeListen(listenComm), "closeListen");
  std::vector<uint8_t> buf(size);
  measureReceive(o, size, ctl, t, [&](int n) { recvMessages(p.net(), recv, buf, n, o.window); });
  Plugin::check(p.net()->closeRecv(recv), "closeRecv");
}

void pluginSender(const LinkOptions& o, const Case& c, uint64_t size, int ctl) {
  Plugin p(o.plugin, c.streams, c.schedule);
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  ctlRecv(ctl, handle, sizeof(handle));
  void* send = nullptr;
  auto c0 = Clock::now();
  while ((send = p.connectStep(0, handle)) == nullptr) {
    if (secondsSince(c0) > 30 || peerGone(ctl)) {
      die("could not connect to the receiver (it exited, or 30 s passed)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<uint8_t> buf(size, 0x5a);
  measureSend(o, size, ctl, [&](int n) { sendMessages(p.net(), send, buf, n, o.window); });
  // Wait for the receiver to finish before closing (closing first would cut the last bytes).
  char bye = 0;
  ctlRecv(ctl, &bye, 1);
  Plugin::check(p.net()->closeSend(send), "closeSend");
}

// ---- one trial: two processes ------------------------------------------------------------------

std::string encodeTrial(const Trial& t) {
  std::string s = strPrintf("%.9f %.6f %.6f %llu", t.seconds, t.recvCpu, t.sendCpu,
                            static_cast<unsigned long long>(t.bytes));
  for (auto& [name, bytes] : t.linkBytes) {
    s += strPrintf(" %s=%llu", name.c_str(), static_cast<unsigned long long>(bytes));
  }
  return s + "\n";
}

Trial decodeTrial(const std::string& text) {
  Trial t;
  std::istringstream in(text);
  unsigned long long bytes = 0;
  in >> t.seconds >> t.recvCpu >> t.sendCpu >> bytes;
  t.bytes = bytes;
  std::string item;
  while (in >> item) {
    size_t eq = item.find('=');
    if (eq != std::string::npos) {
      t.linkBytes[item.substr(0, eq)] = std::stoull(item.substr(eq + 1));
    }
  }
  if (!in.eof() || t.seconds <= 0) {
    die("receiver reported '" + text + "'");
  }
  t.gbps = static_cast<double>(t.bytes) * 8 / t.seconds / 1e9;
  return t;
}

Trial runTrial(const LinkOptions& o, const Case& c, uint64_t size) {
  int ctl[2];
  int result[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) != 0 ||
      pipe2(result, O_CLOEXEC) != 0) {
    die(std::string("socketpair/pipe: ") + std::strerror(errno));
  }
  std::fflush(stdout);
  pid_t recvPid = fork();
  if (recvPid == 0) {
    ::close(ctl[1]);
    ::close(result[0]);
    enterNetns(o.recvNs);
    Trial t;
    if (c.plugin) {
      pluginReceiver(o, c, size, ctl[0], &t);
    } else {
      socketReceiver(o, size, ctl[0], &t);
    }
    ctlRecv(ctl[0], &t.sendCpu, sizeof(t.sendCpu));
    char bye = 1;
    ctlSend(ctl[0], &bye, 1);
    std::string line = encodeTrial(t);  // short: one write(2) to a pipe is atomic
    if (::write(result[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      die(std::string("write to the bench: ") + std::strerror(errno));
    }
    _exit(0);
  }
  pid_t sendPid = fork();
  if (sendPid == 0) {
    ::close(ctl[0]);
    ::close(result[0]);
    ::close(result[1]);
    enterNetns(o.sendNs);
    if (c.plugin) {
      pluginSender(o, c, size, ctl[1]);
    } else {
      socketSender(o, size, ctl[1]);
      char bye = 0;
      ctlRecv(ctl[1], &bye, 1);
    }
    _exit(0);
  }
  ::close(ctl[0]);
  ::close(ctl[1]);
  ::close(result[1]);
  if (recvPid < 0 || sendPid < 0) {
    die(std::string("fork: ") + std::strerror(errno));
  }
  // Bounded: connection set-up (30 s at most in the children) plus the measured phase, which
  // is sized to --seconds from a warm-up; a link far slower than the warm-up saw stays bounded
  // by this deadline.
  std::string text;
  auto deadline = Clock::now() + std::chrono::duration<double>(60 + 10 * o.seconds);
  for (;;) {
    double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) {
      kill(recvPid, SIGKILL);
      kill(sendPid, SIGKILL);
      waitpid(recvPid, nullptr, 0);
      waitpid(sendPid, nullptr, 0);
      die("trial " + c.label + " " + fmtBytes(size) + " did not finish in time");
    }
    pollfd pfd{result[0], POLLIN, 0};
    int n = ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1);
    if (n <= 0) {
      continue;
    }
    char buf[512];
    ssize_t got = ::read(result[0], buf, sizeof(buf));
    if (got <= 0) {
      break;
    }
    text.append(buf, static_cast<size_t>(got));
  }
  ::close(result[0]);
  int recvStatus = 0;
  int sendStatus = 0;
  waitpid(recvPid, &recvStatus, 0);
  waitpid(sendPid, &sendStatus, 0);
  if (!WIFEXITED(recvStatus) || WEXITSTATUS(recvStatus) != 0 || !WIFEXITED(sendStatus) ||
      WEXITSTATUS(sendStatus) != 0 || text.empty()) {
    auto how = [](int st) {
      return WIFEXITED(st) ? strPrintf("exit %d", WEXITSTATUS(st))
                           : strPrintf("signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    };
    die("trial " + c.label + " " + fmtBytes(size) + " failed: receiver " + how(recvStatus) +
        ", sender " + how(sendStatus) + " (see the messages above)");
  }
  return decodeTrial(text);
}

}  // namespace

int linksMain(int argc, char** argv, const DefaultPlugin& defaultPlugin) {
  LinkOptions o;
  o.plugin = defaultPlugin.path;
  if (std::optional<int> rc = parseArgs(argc, argv, &o)) {
    return *rc;
  }
  requirePlugin(o.plugin, defaultPlugin);
  ::close(openNetns(o.recvNs));
  ::close(openNetns(o.sendNs));
  if (!bagua::processEnv("NCCL_SOCKET_IFNAME").has_value()) {
    setenv("NCCL_SOCKET_IFNAME", "=bn0", 1);
  }
  std::string ifname = *bagua::processEnv("NCCL_SOCKET_IFNAME");
  std::printf("Bagua-Net between network namespaces: receiver in %s, sender in %s\n",
              o.recvNs.c_str(), o.sendNs.c_str());
  std::printf("  NCCL_SOCKET_IFNAME=%s, %d requests in flight, best of %d trial(s) of ~%.1f s\n",
              ifname.c_str(), o.window, o.trials, o.seconds);
  if (o.lineRateBits > 0) {
    std::printf("  line rate R = %.3f Gbit/s\n", static_cast<double>(o.lineRateBits) / 1e9);
  }
  std::printf("\n%8s %10s %10s %8s %11s %11s  %s\n", "size", "case", "Gbit/s", "of R", "sendCPU/GB",
              "recvCPU/GB", "bytes per interface (receiver)");
  struct Row {
    uint64_t size;
    Case c;
    Trial t;
  };
  std::vector<Row> rows;
  for (uint64_t size : o.sizes) {
    for (const Case& c : o.cases) {
      Trial best;
      for (int k = 0; k < o.trials; ++k) {
        Trial t = runTrial(o, c, size);
        if (t.gbps > best.gbps) {
          best = t;
        }
      }
      double gb = static_cast<double>(best.bytes) / 1e9;
      std::string links;
      uint64_t total = 0;
      for (auto& [name, bytes] : best.linkBytes) {
        total += bytes;
      }
      for (auto& [name, bytes] : best.linkBytes) {
        if (total > 0 && bytes * 100 >= total) {
          links += strPrintf("%s %.0f%% ", name.c_str(),
                             100.0 * static_cast<double>(bytes) / static_cast<double>(total));
        }
      }
      std::string ofR =
          o.lineRateBits > 0
              ? strPrintf("%.3f", best.gbps * 1e9 / static_cast<double>(o.lineRateBits))
              : "-";
      std::printf("%8s %10s %10.3f %8s %11.3f %11.3f  %s\n", fmtBytes(size).c_str(),
                  c.label.c_str(), best.gbps, ofR.c_str(), best.sendCpu / gb, best.recvCpu / gb,
                  links.c_str());
      std::fflush(stdout);
      rows.push_back(Row{size, c, best});
    }
  }
  if (!o.json.empty()) {
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      const double gb = static_cast<double>(r.t.bytes) / 1e9;
      nlohmann::ordered_json linkBytes = nlohmann::ordered_json::object();
      for (const auto& [name, bytes] : r.t.linkBytes) {
        linkBytes[name] = bytes;
      }
      results.push_back({{"case", r.c.label},
                         {"size", r.size},
                         {"gbps", r.t.gbps},
                         {"seconds", r.t.seconds},
                         {"send_cpu_s_per_GB", r.t.sendCpu / gb},
                         {"recv_cpu_s_per_GB", r.t.recvCpu / gb},
                         {"link_bytes", std::move(linkBytes)}});
    }
    writeJson(o.json, {{"mode", "netns"},
                       {"recv_netns", o.recvNs},
                       {"send_netns", o.sendNs},
                       {"ifname", ifname},
                       {"line_rate_bps", o.lineRateBits},
                       {"window", o.window},
                       {"trials", o.trials},
                       {"results", std::move(results)}});
  }
  return 0;
}

}  // namespace bagua::netbench
