// baguarun: a torchrun-like launcher. Starts --nproc_per_node workers on this node with
// MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (plus NODE_RANK and
// NNODES) set, forwards SIGINT/SIGTERM/SIGHUP to them, and when the first worker fails stops the
// others (SIGTERM, then SIGKILL after --grace_s) and reports which rank failed and why.
//
//   baguarun [--nproc_per_node N] [--nnodes M] [--node_rank R] [--master_addr A]
//            [--master_port P] [--grace_s S] [--] program [args...]
//
// --master_port 0 picks a free port (single-node jobs only). Exit status: 0 when every worker
// succeeded, else the first failed worker's exit code (128 + signal when it was killed).
//
// The job key (core/README.md, "Security"): for a single-node job without BAGUA_JOB_KEY or
// BAGUA_JOB_KEY_FILE in its environment, baguarun makes a fresh random BAGUA_JOB_KEY for its
// workers; several nodes need the user's key, the same on every node. Workers die with baguarun:
// each gets SIGKILL when baguarun dies (PR_SET_PDEATHSIG), and a guardian process ends their
// process groups (SIGTERM, SIGKILL 1 s later) when baguarun ends without saying goodbye, so a
// `kill -9` of baguarun leaves no worker or worker's child running.
//
// Elastic jobs (--nnodes MIN:MAX, or any --rdzv_* option) are torchrun's: baguarun replaces
// itself with `--torchrun CMD` (default: python3 -m bagua.distributed.run) and torchrun's flags,
//   CMD --nnodes MIN:MAX --nproc_per_node N --rdzv_backend B --rdzv_endpoint E --rdzv_id ID
//       --max_restarts R [--rdzv_conf C] --no_python program [args...]
// (B default c10d, E default --master_addr:--master_port, ID default "baguarun", R default 3),
// so C++ trainers restart on membership changes like Python ones.
//
// On several hosts over SSH (--host_list, ssh.cc; tools/README.md "baguarun on several nodes"):
// one baguarun per host, started with --stdin_control (the job key on stdin's first line; the
// job stopped as by SIGTERM when stdin ends) and --rank_prefix ("[rank R] " before each line a
// worker prints, also usable alone). The command line is args.cc's.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/crypto.h"
#include "bagua/base/params.h"
#include "baguarun.h"
#include "baguarun_params.h"
#include "output.h"

namespace bagua::baguarun {

volatile sig_atomic_t gSignal = 0;

namespace {

void onSignal(int sig) {
  gSignal = sig;
}

}  // namespace

void installInterruptHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    sigaction(s, &sa, nullptr);
  }
}

std::string describe(int status) {
  if (WIFEXITED(status)) {
    return bagua::strPrintf("exited with code %d", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return bagua::strPrintf("was killed by signal %d (%s)", WTERMSIG(status),
                            strsignal(WTERMSIG(status)));
  }
  return "ended abnormally";
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) {
    return WEXITSTATUS(status);
  }
  if (WIFSIGNALED(status)) {
    return 128 + WTERMSIG(status);
  }
  return 1;
}

namespace {

// A port no other process holds now and none is likely to take before rank 0's store binds it:
// one outside the kernel's ephemeral range (net.ipv4.ip_local_port_range), where outgoing
// connections never land, tried on every address as the store binds it. A port the kernel
// hands out for bind(0) comes from that range, so any connection opened meanwhile (a parallel
// test suite, a download) may take it: that clash was seen, as "Address already in use" in the
// workers. Falls back to bind(0) when no port outside the range is free.
int bindableAnyAddress(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return -1;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  int got = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    got = ntohs(a.sin_port);
  }
  ::close(fd);
  return got;
}

int pickFreePort() {
  int lo = 32768, hi = 60999;  // Linux's default ephemeral range
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) {
      lo = 32768;
      hi = 60999;
    }
    std::fclose(f);
  }
  // The wider of the two gaps around the ephemeral range, above the well-known ports.
  int first = 10000, last = lo - 1;
  if (last - first < 65535 - (hi + 1)) {
    first = hi + 1;
    last = 65535;
  }
  if (last - first >= 100) {
    std::mt19937 rng(static_cast<uint32_t>(
        std::chrono::steady_clock::now().time_since_epoch().count() ^ ::getpid()));
    std::uniform_int_distribution<int> pick(first, last);
    for (int i = 0; i < 64; ++i) {
      const int port = pick(rng);
      if (bindableAnyAddress(port) == port) {
        return port;
      }
    }
  }
  return bindableAnyAddress(0);
}

struct Worker {
  pid_t pid = -1;
  int rank = 0;
  int localRank = 0;
  bool running = false;
  int status = 0;
};

// ---- The job key ------------------------------------------------------------------------------

// Gives the workers a fresh BAGUA_JOB_KEY (through this process's environment, which they
// inherit) when the user set none and every worker is on this node. Several nodes must share
// the user's key; their ranks then run unauthenticated, and rank 0 warns naming the variable.
// Returns false when no random key could be made.
bool ensureJobKey(bool singleNode) {
  if (bagua::processEnv("BAGUA_JOB_KEY").has_value() ||
      bagua::processEnv("BAGUA_JOB_KEY_FILE").has_value() || !singleNode) {
    return true;
  }
  uint8_t raw[32];
  bagua::Status s = bagua::randomBytes(raw, sizeof(raw));
  if (!s.isOk()) {
    std::fprintf(stderr, "baguarun: cannot make a job key: %s\n", s.message().c_str());
    return false;
  }
  return ::setenv("BAGUA_JOB_KEY", bagua::toHex(raw, sizeof(raw)).c_str(), 1) == 0;
}

// ---- Workers die with baguarun -----------------------------------------------------------------

// In a worker, between fork and exec: SIGKILL when baguarun (`parent`) dies, even by SIGKILL. If
// it died already (before the call), exit now.
void dieWithParent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) {
    ::_exit(128 + SIGKILL);
  }
}

// A process outside baguarun's process group that outlives baguarun: when baguarun ends without
// writing 0 to the pipe (it was killed), it ends every worker's process group (a worker's own
// children are in it) that baguarun has not reported reaped: SIGTERM, then SIGKILL after
// `graceMs` for what is left. baguarun writes a worker's pid when it reaps it (its group may be
// gone and the number reused), and 0 when it exits normally.
class Guardian {
 public:
  Guardian() = default;
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;
  ~Guardian() { release(); }

  bool start(const std::vector<pid_t>& groups, int graceMs) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "baguarun: pipe: %s\n", std::strerror(errno));
      return false;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "baguarun: fork (guardian): %s\n", std::strerror(errno));
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    if (pid == 0) {
      ::close(fds[1]);
      run(fds[0], parent, groups, graceMs);  // never returns
    }
    ::close(fds[0]);
    write_ = fds[1];
    return true;
  }

  void reaped(pid_t worker) { send(static_cast<int32_t>(worker)); }
  // Normal exit: the guardian leaves the process groups alone and exits.
  void release() {
    if (write_ >= 0) {
      send(0);
      ::close(write_);
      write_ = -1;
    }
  }

 private:
  void send(int32_t v) {
    if (write_ >= 0) {
      ssize_t n = ::write(write_, &v, sizeof(v));
      (void)n;
    }
  }

  [[noreturn]] static void run(int fd, pid_t parent, std::vector<pid_t> groups, int graceMs) {
    ::setpgid(0, 0);  // not killed with baguarun's group
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
      sigaction(sig, &ign, nullptr);
    }
    int devNull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devNull >= 0) {
      ::dup2(devNull, STDIN_FILENO);
      ::dup2(devNull, STDOUT_FILENO);
    }
    int32_t v = 0;
    while (true) {
      ssize_t n = ::read(fd, &v, sizeof(v));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n != static_cast<ssize_t>(sizeof(v))) {
        break;  // EOF: baguarun is gone without a goodbye
      }
      if (v == 0) {
        ::_exit(0);
      }
      std::erase(groups, static_cast<pid_t>(v));
    }
    if (groups.empty()) {
      ::_exit(0);
    }
    std::fprintf(stderr,
                 "baguarun: baguarun (pid %d) died; ending its %zu worker process group(s)\n",
                 static_cast<int>(parent), groups.size());
    for (pid_t g : groups) {
      ::kill(-g, SIGTERM);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(graceMs);
    while (std::chrono::steady_clock::now() < until) {
      bool any = false;
      for (pid_t g : groups) {
        any = any || ::kill(-g, 0) == 0;
      }
      if (!any) {
        ::_exit(0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t g : groups) {
      ::kill(-g, SIGKILL);
    }
    ::_exit(0);
  }

  int write_ = -1;
};

// Replaces this process with torchrun (see the file comment); returns only on failure.
int execTorchrun(const Options& o) {
  std::vector<std::string> args;
  std::string word;
  for (char c : o.torchrun + " ") {
    if (c == ' ') {
      if (!word.empty()) {
        args.push_back(word);
      }
      word.clear();
    } else {
      word += c;
    }
  }
  if (args.empty()) {
    std::fprintf(stderr, "baguarun: --torchrun is empty\n");
    return 2;
  }
  const std::string endpoint =
      o.rdzvEndpoint.empty() ? o.masterAddr + ":" + std::to_string(o.masterPort) : o.rdzvEndpoint;
  std::vector<std::string> more = {
      "--nnodes",         o.nnodesText.empty() ? std::to_string(o.nnodes) : o.nnodesText,
      "--nproc_per_node", std::to_string(o.nprocPerNode),
      "--rdzv_backend",   o.rdzvBackend.empty() ? "c10d" : o.rdzvBackend,
      "--rdzv_endpoint",  endpoint,
      "--rdzv_id",        o.rdzvId.empty() ? "baguarun" : o.rdzvId,
      "--max_restarts",   std::to_string(o.maxRestarts)};
  if (!o.rdzvConf.empty()) {
    more.push_back("--rdzv_conf");
    more.push_back(o.rdzvConf);
  }
  more.push_back("--no_python");
  args.insert(args.end(), more.begin(), more.end());
  args.insert(args.end(), o.command.begin(), o.command.end());
  std::string line;
  for (const auto& a : args) {
    line += (line.empty() ? "" : " ") + a;
  }
  std::fprintf(stderr, "baguarun: elastic job, handing over to torchrun: %s\n", line.c_str());
  std::fflush(stderr);
  std::vector<char*> argvOut;
  for (auto& a : args) {
    argvOut.push_back(a.data());
  }
  argvOut.push_back(nullptr);
  ::execvp(argvOut[0], argvOut.data());
  std::fprintf(stderr, "baguarun: cannot run '%s' (--torchrun): %s\n", argvOut[0],
               std::strerror(errno));
  return 127;
}

// ---- The SSH start's side on each host (--stdin_control) ---------------------------------------

// The job key the SSH start sends as stdin's first line (empty: none; the hosts' own
// BAGUA_JOB_KEY_FILE or key then). Read byte by byte so nothing after the line is taken.
bool readJobKeyFromStdin() {
  std::string line;
  char c = 0;
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      std::fprintf(stderr, "baguarun: --stdin_control: stdin ended before the job key line\n");
      return false;
    }
    if (c == '\n') {
      break;
    }
    line += c;
  }
  return line.empty() || ::setenv("BAGUA_JOB_KEY", line.c_str(), 1) == 0;
}

// True when stdin ended (the SSH start closed it, or its connection is gone); discards data.
bool stdinEnded() {
  char buf[256];
  ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
  return n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
}

// ---- Local workers ------------------------------------------------------------------------------

// In the forked worker: its own process group, dies with baguarun, torchrun's variables, output
// into the pipes (when given), then the program. Never returns.
[[noreturn]] void execWorker(const Options& o, const Worker& w, pid_t parent, int outFd,
                             int errFd) {
  // Own process group: signals reach the worker's whole tree (shells, helpers).
  ::setpgid(0, 0);
  dieWithParent(parent);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    sigaction(s, &dfl, nullptr);
  }
  if (outFd >= 0) {
    ::dup2(outFd, STDOUT_FILENO);
    ::dup2(errFd, STDERR_FILENO);
  }
  if (o.stdinControl) {
    // Only baguarun watches the connection; a worker reading stdin must not eat the end.
    int devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devNull >= 0) {
      ::dup2(devNull, STDIN_FILENO);
    }
  }
  const int world = o.nprocPerNode * o.nnodes;
  ::setenv("MASTER_ADDR", o.masterAddr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(o.masterPort).c_str(), 1);
  ::setenv("RANK", std::to_string(w.rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(w.localRank).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nprocPerNode).c_str(), 1);
  ::setenv("NODE_RANK", std::to_string(o.nodeRank).c_str(), 1);
  ::setenv("NNODES", std::to_string(o.nnodes).c_str(), 1);
  std::vector<char*> args;
  for (const auto& s : o.command) {
    args.push_back(const_cast<char*>(s.c_str()));
  }
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "baguarun: rank %d: cannot run '%s': %s\n", w.rank, args[0],
               std::strerror(errno));
  ::_exit(127);
}

// Forks the workers (with --rank_prefix, their output into `pumps`); false after a fork failed
// (the ones started are killed).
bool startWorkers(const Options& o, std::vector<Worker>& workers, Pumps& pumps) {
  const pid_t self = ::getpid();
  for (int l = 0; l < o.nprocPerNode; ++l) {
    Worker& w = workers[l];
    w.localRank = l;
    w.rank = o.nodeRank * o.nprocPerNode + l;
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    if (o.rankPrefix && (!makePipe(out) || !makePipe(err))) {
      std::fprintf(stderr, "baguarun: pipe: %s\n", std::strerror(errno));
      return false;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "baguarun: fork failed: %s\n", std::strerror(errno));
      for (auto& other : workers) {
        if (other.running) {
          ::kill(-other.pid, SIGKILL);
        }
      }
      return false;
    }
    if (pid == 0) {
      execWorker(o, w, self, out[1], err[1]);
    }
    ::setpgid(pid, pid);  // also here, so there is no window before the child runs
    w.pid = pid;
    w.running = true;
    if (o.rankPrefix) {
      ::close(out[1]);
      ::close(err[1]);
      const std::string prefix = bagua::strPrintf("[rank %d] ", w.rank);
      pumps.push_back(std::make_unique<LinePump>(out[0], STDOUT_FILENO, prefix));
      pumps.push_back(std::make_unique<LinePump>(err[0], STDERR_FILENO, prefix));
    }
  }
  return true;
}

// Waits for every worker: forwards signals, stops the others at the first failure (SIGTERM,
// SIGKILL after --grace_s) and with --stdin_control when stdin ends. Returns the exit status.
int superviseWorkers(const Options& o, std::vector<Worker>& workers, Pumps& pumps,
                     Guardian& guardian) {
  using Clock = std::chrono::steady_clock;
  int failedIndex = -1;
  int forwarded = 0;
  bool stopping = false;
  bool stdinOpen = o.stdinControl;
  Clock::time_point killAt{};
  auto stopAll = [&](int sig) {
    for (auto& w : workers) {
      if (w.running) {
        ::kill(-w.pid, sig);
      }
    }
  };
  int running = o.nprocPerNode;
  while (running > 0) {
    if (gSignal != 0 && forwarded != gSignal) {
      forwarded = gSignal;
      std::fprintf(stderr, "baguarun: got signal %d (%s), forwarding to the workers\n", forwarded,
                   strsignal(forwarded));
      stopAll(forwarded);
      if (!stopping) {
        stopping = true;
        killAt = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.graceS * 1000));
      }
    }
    // Reap every worker that has ended since the last poll before picking the first failure:
    // when one rank dies, its peers fail within milliseconds (connection closed), and waitpid
    // returns the lowest rank first, so taking the first reaped one would blame a peer. Within
    // one poll a worker killed by a signal is taken as the cause over one that exited with an
    // error code.
    int candidate = -1;
    const int reaped = reapEnded(workers, [&](size_t i) {
      const Worker& w = workers[i];
      --running;
      guardian.reaped(w.pid);
      const bool failed = !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0);
      if (failed && failedIndex < 0 && !(stopping && gSignal != 0) &&
          (candidate < 0 || (WIFSIGNALED(w.status) && !WIFSIGNALED(workers[candidate].status)))) {
        candidate = static_cast<int>(i);
      }
    });
    if (candidate >= 0) {
      failedIndex = candidate;
      const Worker& w = workers[candidate];
      std::fprintf(stderr,
                   "baguarun: rank %d (local rank %d, pid %d) %s; stopping the other "
                   "workers\n",
                   w.rank, w.localRank, static_cast<int>(w.pid), describe(w.status).c_str());
      if (!stopping) {
        stopping = true;
        stopAll(SIGTERM);
        killAt = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.graceS * 1000));
      }
    }
    if (reaped > 0) {
      continue;
    }
    if (stopping && Clock::now() >= killAt) {
      for (auto& w : workers) {
        if (w.running) {
          std::fprintf(stderr, "baguarun: rank %d did not stop within %.1f s, killing it\n", w.rank,
                       o.graceS);
          ::kill(-w.pid, SIGKILL);
        }
      }
      killAt = Clock::now() + std::chrono::hours(24);
    }
    if (pollPumps(pumps, stdinOpen ? STDIN_FILENO : -1, 20) && stdinEnded()) {
      stdinOpen = false;
      std::fprintf(stderr,
                   "baguarun: stdin ended (the SSH start stopped the job, or its connection is "
                   "gone); stopping the workers\n");
      gSignal = SIGTERM;
    }
  }
  drainPumps(pumps, 1000);
  if (failedIndex >= 0) {
    const Worker& w = workers[failedIndex];
    std::fprintf(stderr, "baguarun: FAILED: rank %d %s (first failure)\n", w.rank,
                 describe(w.status).c_str());
    return exitCodeOf(w.status);
  }
  if (gSignal != 0) {
    std::fprintf(stderr, "baguarun: stopped by signal %d\n", static_cast<int>(gSignal));
    return 128 + gSignal;
  }
  return 0;
}

// The static job's ranks on this node.
int runLocal(Options& o) {
  if (o.masterPort == 0) {
    o.masterPort = pickFreePort();
    if (o.masterPort <= 0) {
      std::fprintf(stderr, "baguarun: could not find a free port\n");
      return 1;
    }
  }
  installInterruptHandlers();
  if (o.stdinControl) {
    // A connection gone must not kill baguarun before it has stopped the workers.
    ::signal(SIGPIPE, SIG_IGN);
  }
  std::vector<Worker> workers(o.nprocPerNode);
  Pumps pumps;
  if (!startWorkers(o, workers, pumps)) {
    return 1;
  }
  Guardian guardian;
  {
    std::vector<pid_t> groups;
    for (const Worker& w : workers) {
      groups.push_back(w.pid);
    }
    if (!guardian.start(groups, 1000)) {
      std::fprintf(stderr,
                   "baguarun: continuing without a guardian: a kill -9 of baguarun would "
                   "leave the workers' children running\n");
    }
  }
  std::fprintf(stderr,
               "baguarun: started %d worker(s) (ranks %d..%d of %d) for '%s', master %s:%d\n",
               o.nprocPerNode, workers.front().rank, workers.back().rank, o.nprocPerNode * o.nnodes,
               o.command[0].c_str(), o.masterAddr.c_str(), o.masterPort);
  return superviseWorkers(o, workers, pumps, guardian);
}

// The hosts of an SSH start: --host_list, else BAGUA_NODE_DOMAIN_NAMES unless the command line
// places this node itself (the baguarun an SSH start runs on each host gets --nnodes and
// --node_rank, so a cluster that exports the variable everywhere does not recurse). False after
// printing a bad value.
bool resolveHostList(Options* o) {
  if (!o->hostList.empty() || o->placementGiven || o->elastic() || o->stdinControl) {
    return true;
  }
  bagua::Result<std::string> env = baguarunParams().nodeDomainNames.get();
  if (!env.isOk()) {
    std::fprintf(stderr, "baguarun: %s\n", env.status().message().c_str());
    return false;
  }
  o->hostList = *env;
  return true;
}

// The Bagua-Net plugin of this build or installation, for --enable_bagua_net: the build tree's
// (this executable in <build>/tools/baguarun, the plugin in <build>/net_plugin), else the
// installed one (<prefix>/<libdir>, from Meson's options: BAGUARUN_INSTALLED_PLUGIN_DIR, relative
// to this executable's folder unless absolute). "" with the reason in `why` when neither exists.
std::string findBaguaNetPlugin(std::string* why) {
  std::error_code ec;
  const std::filesystem::path dir =
      std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) {
    *why = "cannot tell where baguarun is (/proc/self/exe)";
    return "";
  }
  const std::filesystem::path buildTree =
      (dir / "../../net_plugin/libnccl-net.so").lexically_normal();
  const std::filesystem::path installedDir(BAGUARUN_INSTALLED_PLUGIN_DIR);
  const std::filesystem::path installed =
      ((installedDir.is_absolute() ? installedDir : dir / installedDir) / "libnccl-net.so")
          .lexically_normal();
  for (const std::filesystem::path& p : {buildTree, installed}) {
    if (::access(p.c_str(), R_OK) == 0) {
      return p.string();
    }
  }
  *why = "neither the build tree's " + buildTree.string() + " nor the installed " +
         installed.string() + " exists";
  return "";
}

// Bagua's launcher flags for the ranks of this host: the environment they inherit and the
// program's form. Returns false after saying why (the plugin not found).
bool applyBaguaFlags(Options* o) {
  if (o->enableBaguaNet) {
    std::string why;
    const std::string plugin = findBaguaNetPlugin(&why);
    if (plugin.empty()) {
      std::fprintf(stderr,
                   "baguarun: --enable_bagua_net: no Bagua-Net plugin (libnccl-net.so) found: %s; "
                   "build net_plugin/, or set NCCL_NET_PLUGIN yourself instead\n",
                   why.c_str());
      return false;
    }
    ::setenv("NCCL_NET_PLUGIN", plugin.c_str(), 1);
  }
  if (o->baguaServicePort >= 0) {
    ::setenv("BAGUA_SERVICE_PORT", std::to_string(o->baguaServicePort).c_str(), 1);
  }
  // Bagua's launcher runs its program with the Python interpreter unless --no_python; ours runs
  // any program directly, and a Python script (*.py) the way Bagua's did.
  const std::string& prog = o->command[0];
  if (!o->noPython && prog.size() > 3 && prog.compare(prog.size() - 3, 3, ".py") == 0) {
    o->command.insert(o->command.begin(), {"python3", "-u"});
  }
  return true;
}

}  // namespace
}  // namespace bagua::baguarun

int main(int argc, char** argv) {
  using namespace bagua::baguarun;
  Options o;
  int rc = parseArgs(argc, argv, &o);
  if (rc == 0 && !resolveHostList(&o)) {
    rc = 2;
  }
  if (rc == -1) {
    usage(stdout);
    return 0;
  }
  if (rc != 0) {
    return rc == -2 ? 0 : rc;  // -2: --version, printed
  }
  if (!o.hostList.empty()) {
    return runOverSsh(o);  // each host's baguarun applies Bagua's flags for its ranks
  }
  if (!applyBaguaFlags(&o)) {
    return 1;
  }
  if (o.stdinControl && !readJobKeyFromStdin()) {
    return 1;
  }
  // Elastic: one node when MAX is 1 (torchrun's agent hands the environment to its workers).
  if (!ensureJobKey(o.nnodes == 1)) {
    return 1;
  }
  if (o.elastic()) {
    return execTorchrun(o);
  }
  return runLocal(o);
}
