// bagua-net-bench's plumbing shared by its loopback mode (main.cc) and its shaped-link mode
// (links.cc): the plugin loaded and driven the way NCCL drives it (dlopen, ncclNetPlugin_v11,
// listen/connect/accept, isend/irecv/test with a window of requests in flight), size parsing and
// formatting. Single-threaded set-up; the pump functions run one sender and one receiver thread.
#pragma once

#include <dlfcn.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "bagua/net/socket_io.h"
#include "bench_abi.h"
#include "nccl_net_abi.h"

namespace bagua::netbench {

using Clock = std::chrono::steady_clock;

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "bagua-net-bench: %s\n", what.c_str());
  std::exit(1);
}

// The plugin a run loads when --plugin does not name one (main.cc, findDefaultPlugin()): the
// path, or "" with the reason in `why`.
struct DefaultPlugin {
  std::string path;
  std::string why;
};

// The plugin a mode will load: `path` (--plugin's value or the default); dies with the reason when
// there is none or it is not readable.
inline void requirePlugin(const std::string& path, const DefaultPlugin& def) {
  if (path.empty()) {
    die(def.why);
  }
  if (access(path.c_str(), R_OK) != 0) {
    die("plugin not found at " + path + " (build net_plugin, set BAGUA_NET_PLUGIN_PATH or pass " +
        "--plugin PATH)");
  }
}

inline double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline std::string fmtBytes(uint64_t b) {
  if (b >= (1u << 30) && b % (1u << 30) == 0) {
    return std::to_string(b >> 30) + "G";
  }
  if (b >= (1u << 20) && b % (1u << 20) == 0) {
    return std::to_string(b >> 20) + "M";
  }
  if (b >= 1024 && b % 1024 == 0) {
    return std::to_string(b >> 10) + "K";
  }
  return std::to_string(b);
}

inline std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) {
      out.push_back(item);
    }
    if (comma == std::string::npos) {
      break;
    }
    pos = comma + 1;
  }
  return out;
}

inline std::vector<uint64_t> parseSizeList(const std::string& text) {
  std::vector<uint64_t> out;
  for (const std::string& item : splitList(text)) {
    bagua::Result<uint64_t> v = bagua::parseBytes(item);
    if (!v.isOk()) {
      die("bad size '" + item + "': " + v.status().message());
    }
    out.push_back(*v);
  }
  return out;
}

// A comma-separated list of byte sizes as an option (--sizes 64K,1M): a bad or missing item is a
// usage error naming the option and the item. `out` keeps its value unless the option is given.
inline CLI::Option* addSizeList(CLI::App& app, const std::string& names, std::vector<uint64_t>* out,
                                const std::string& help) {
  std::string shown;
  for (uint64_t v : *out) {
    shown += (shown.empty() ? "" : ",") + std::to_string(v);
  }
  return app
      .add_option_function<std::string>(
          names, [out](const std::string& v) { *out = parseSizeList(v); }, help)
      ->type_name("LIST")
      ->default_str(shown)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const std::vector<std::string> items = splitList(v);
            if (items.empty()) {
              return "want a comma-separated list of sizes (e.g. 64K,1M), got '" + v + "'";
            }
            for (const std::string& item : items) {
              if (!bagua::parseBytes(item).isOk()) {
                return "bad size '" + item + "' in '" + v + "' (e.g. 64K,1M)";
              }
            }
            return "";
          },
          "LIST"));
}

// Writes `j` to `path` (the --json of each mode); dies when it cannot.
inline void writeJson(const std::string& path, const nlohmann::ordered_json& j) {
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  if (!f.flush()) {
    die("cannot write " + path);
  }
}

// One contestant of the ring and shaped-link modes: "socket" (plain TCP), "bagua:S" (the plugin
// with S streams, dynamic schedule) or "rr:S" (round-robin), S in 1..64. Dies on anything else.
struct Case {
  std::string label;  // as given: "socket", "bagua:8", "rr:8"
  bool plugin = false;
  int streams = 1;
  const char* schedule = "dynamic";
  std::string pluginPath;  // --ring: "bagua:8@PATH" loads another build ("" = --plugin's)
};

// Why `text` is not a case ("" when it is one): the check behind --cases' usage errors.
inline std::string caseError(const std::string& text) {
  if (text == "socket") {
    return "";
  }
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const int streams = colon == std::string::npos ? 0 : std::atoi(text.c_str() + colon + 1);
  if ((kind != "bagua" && kind != "rr") || streams < 1 || streams > 64) {
    return "bad case '" + text + "' (accepted: socket, bagua:N, rr:N with N in 1..64)";
  }
  return "";
}

inline Case parseCase(const std::string& text) {
  Case c;
  c.label = text;
  if (text == "socket") {
    return c;
  }
  size_t colon = text.find(':');
  std::string kind = text.substr(0, colon);
  if ((kind != "bagua" && kind != "rr") || colon == std::string::npos) {
    die("bad case '" + text + "' (accepted: socket, bagua:N, rr:N with N in 1..64)");
  }
  c.plugin = true;
  c.schedule = kind == "bagua" ? "dynamic" : "roundrobin";
  c.streams = std::atoi(text.c_str() + colon + 1);
  if (c.streams < 1 || c.streams > 64) {
    die("bad case '" + text + "': streams must be 1..64");
  }
  return c;
}

// ---- the bench's own processes ----------------------------------------------------------------

// CPU seconds (user + system) of this process, all threads.
inline double cpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// Voluntary context switches of this process, all threads: a thread blocking to wait for work or
// for its socket, i.e. the wake-ups a transport costs (preemptions, which follow the host's load,
// are left out).
inline double contextSwitches() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_nvcsw);
}

// CPU seconds (user + system) of the calling thread.
inline double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// The control channel between the bench's processes (a socketpair made before fork).
inline void ctlSend(int fd, const void* p, size_t n) {
  if (!bagua::net::sendAll(fd, p, n).isOk()) {
    die("peer process went away (control channel closed)");
  }
}

inline void ctlRecv(int fd, void* p, size_t n) {
  if (!bagua::net::recvAll(fd, p, n).isOk()) {
    die("peer process went away (control channel closed)");
  }
}

// True once the process at the other end of `ctl` has exited, so that a set-up loop stops at once
// instead of waiting for its deadline.
inline bool peerGone(int ctl) {
  pollfd pfd{ctl, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) {
    return false;
  }
  char c = 0;
  return ::recv(ctl, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// A plugin that exports only ncclNetPlugin_v6 (Google's nccl-fastsocket, for one) seen through
// the v11 table the bench drives: sizes narrowed to int, no per-comm context, NCCL's devComm and
// profiler arguments dropped, as NCCL's own v6 shim does. One v6 plugin per process at a time
// (the ring's ranks and the loopback modes load one contestant after another).
namespace v6 {

inline ncclNet_v6_t*& table() {
  static ncclNet_v6_t* t = nullptr;
  return t;
}

inline void quietLogger(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}

inline ncclResult_t init(void** ctx, uint64_t, ncclNetCommConfig_v10_t*, ncclDebugLogger_t,
                         ncclProfilerCallback_t) {
  *ctx = nullptr;
  return table()->init(quietLogger);  // v6 plugins may log through it unchecked
}
inline ncclResult_t listen(void*, int dev, void* handle, void** listenComm) {
  return table()->listen(dev, handle, listenComm);
}
inline ncclResult_t connect(void*, int dev, void* handle, void** sendComm,
                            ncclNetDeviceHandle_v7_t**) {
  return table()->connect(dev, handle, sendComm);
}
inline ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v7_t**) {
  return table()->accept(listenComm, recvComm);
}
inline ncclResult_t isend(void* comm, void* data, size_t size, int tag, void* mh, void*,
                          void** request) {
  if (size > INT32_MAX) {
    return ncclInvalidUsage;
  }
  return table()->isend(comm, data, static_cast<int>(size), tag, mh, request);
}
inline ncclResult_t irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mh,
                          void**, void** request) {
  if (n != 1 || sizes[0] > INT32_MAX) {
    return ncclInvalidUsage;
  }
  int size = static_cast<int>(sizes[0]);
  return table()->irecv(comm, 1, data, &size, tags, mh, request);
}
inline ncclResult_t finalize(void*) {
  return ncclSuccess;
}

// The v11 view of `t` (members the bench does not call stay null).
inline ncclNet_v11_t* adapt(ncclNet_v6_t* t) {
  table() = t;
  static ncclNet_v11_t view{};
  view.name = t->name;
  view.init = init;
  view.devices = t->devices;
  view.listen = listen;
  view.connect = connect;
  view.accept = accept;
  view.deregMr = t->deregMr;
  view.isend = isend;
  view.irecv = irecv;
  view.test = t->test;
  view.closeSend = t->closeSend;
  view.closeRecv = t->closeRecv;
  view.closeListen = t->closeListen;
  view.finalize = finalize;
  return &view;
}

}  // namespace v6

// The plugin, loaded like NCCL loads it: ncclNetPlugin_v11, else ncclNetPlugin_v6 (adapted). The
// stream count goes through our plugin's own environment variable (read at init), as a user
// would set it, a foreign plugin ignores it; the schedule through the benchmark's entry
// (bench_abi.h), which a plugin without it cannot run other than dynamically.
class Plugin {
 public:
  Plugin(const std::string& path, int streams, const char* schedule) {
    setenv("BAGUA_NET_NSTREAMS", std::to_string(streams).c_str(), 1);
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      die(std::string("dlopen failed: ") + dlerror());
    }
    const bool roundRobin = std::string(schedule) == "roundrobin";
    auto setSchedule =
        reinterpret_cast<baguaNetBenchSchedule_v1_t>(dlsym(lib_, BAGUA_NET_BENCH_SCHEDULE_SYMBOL));
    if (setSchedule != nullptr) {
      check(static_cast<ncclResult_t>(setSchedule(roundRobin ? 1 : 0)), "the schedule entry");
    } else if (roundRobin) {
      die(path + " has no " BAGUA_NET_BENCH_SCHEDULE_SYMBOL ": it cannot run the round-robin " +
          "cases (rr)");
    }
    net_ = static_cast<ncclNet_v11_t*>(dlsym(lib_, "ncclNetPlugin_v11"));
    if (net_ == nullptr) {
      auto* old = static_cast<ncclNet_v6_t*>(dlsym(lib_, "ncclNetPlugin_v6"));
      if (old == nullptr) {
        die("neither ncclNetPlugin_v11 nor ncclNetPlugin_v6 in " + path);
      }
      net_ = v6::adapt(old);
    }
    check(net_->init(&ctx_, 1, nullptr, nullptr, nullptr), "init");
  }
  ~Plugin() {
    net_->finalize(ctx_);
    dlclose(lib_);
  }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  static void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) {
      die(std::string(what) + " failed with ncclResult " + std::to_string(r));
    }
  }

  // Starts listening on device `dev`; the handle goes to the peer.
  void* listen(int dev, char (&handle)[NCCL_NET_HANDLE_MAXSIZE]) {
    void* listenComm = nullptr;
    check(net_->listen(ctx_, dev, handle, &listenComm), "listen");
    return listenComm;
  }
  // One non-blocking connect attempt (NCCL retries with the same handle); null while pending.
  void* connectStep(int dev, char (&handle)[NCCL_NET_HANDLE_MAXSIZE]) {
    void* send = nullptr;
    ncclNetDeviceHandle_v7_t* devComm = nullptr;
    check(net_->connect(ctx_, dev, handle, &send, &devComm), "connect");
    return send;
  }
  void* acceptStep(void* listenComm) {
    void* recv = nullptr;
    ncclNetDeviceHandle_v7_t* devComm = nullptr;
    check(net_->accept(listenComm, &recv, &devComm), "accept");
    return recv;
  }

  // One send/recv comm pair over loopback (device 0).
  void connectPair(void** send, void** recv) {
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* listenComm = listen(0, handle);
    *send = nullptr;
    *recv = nullptr;
    auto t0 = Clock::now();
    while (*send == nullptr || *recv == nullptr) {
      if (*send == nullptr) {
        *send = connectStep(0, handle);
      }
      if (*recv == nullptr) {
        *recv = acceptStep(listenComm);
      }
      if (secondsSince(t0) > 10) {
        die("connect/accept took more than 10 s");
      }
    }
    check(net_->closeListen(listenComm), "closeListen");
  }

  ncclNet_v11_t* net() const { return net_; }

 private:
  void* lib_ = nullptr;
  ncclNet_v11_t* net_ = nullptr;
  void* ctx_ = nullptr;
};

// Polls test() like NCCL's proxy thread, yielding between polls so that polling threads do not
// starve the plugin's helper threads on small machines.
inline void waitReq(ncclNet_v11_t* net, void* req) {
  int done = 0;
  for (;;) {
    Plugin::check(net->test(req, &done, nullptr), "test");
    if (done) {
      return;
    }
    std::this_thread::yield();
  }
}

// Completes `count` requests in posting order, keeping up to `window` in flight; post() returns
// the next request, or null when the plugin has no free slot (retried after the oldest completes).
template <typename Post>
void keepWindow(ncclNet_v11_t* net, int count, int window, Post post) {
  std::vector<void*> q;
  int posted = 0;
  for (int done = 0; done < count;) {
    while (posted < count && static_cast<int>(q.size()) < window) {
      void* req = post();
      if (req == nullptr) {
        break;
      }
      q.push_back(req);
      ++posted;
    }
    waitReq(net, q.front());
    q.erase(q.begin());
    ++done;
  }
}

// Sends `count` messages of `size` bytes from `buf`, `window` in flight.
inline void sendMessages(ncclNet_v11_t* net, void* send, std::vector<uint8_t>& buf, int count,
                         int window) {
  keepWindow(net, count, window, [&] {
    void* req = nullptr;
    Plugin::check(net->isend(send, buf.data(), buf.size(), 0, nullptr, nullptr, &req), "isend");
    return req;
  });
}

// Receives `count` messages into `buf` (each up to buf.size() bytes), `window` in flight.
inline void recvMessages(ncclNet_v11_t* net, void* recv, std::vector<uint8_t>& buf, int count,
                         int window) {
  keepWindow(net, count, window, [&] {
    void* req = nullptr;
    void* data = buf.data();
    size_t cap = buf.size();
    int tag = 0;
    Plugin::check(net->irecv(recv, 1, &data, &cap, &tag, nullptr, nullptr, &req), "irecv");
    return req;
  });
}

// Streams `count` messages of `size` bytes over one comm pair, `window` in flight per side.
inline void pumpPair(ncclNet_v11_t* net, void* send, void* recv, uint64_t size, int count,
                     int window) {
  std::vector<uint8_t> sbuf(size, 0x5a), rbuf(size);
  std::thread sender([&] { sendMessages(net, send, sbuf, count, window); });
  recvMessages(net, recv, rbuf, count, window);
  sender.join();
}

// Messages of `size` that take about `seconds` at `guessGBps`, at least 8.
inline int messagesFor(uint64_t size, double seconds, double guessGBps) {
  double n = seconds * guessGBps * 1e9 / static_cast<double>(size);
  return static_cast<int>(std::clamp(n, 8.0, 200000.0));
}

}  // namespace bagua::netbench
