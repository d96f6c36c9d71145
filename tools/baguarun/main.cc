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
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/crypto.h"
#include "bagua/base/params.h"

namespace {

volatile sig_atomic_t gSignal = 0;

void onSignal(int sig) {
  gSignal = sig;
}

struct Options {
  int nprocPerNode = 1;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  double graceS = 5.0;
  std::vector<std::string> command;
  // Elastic (delegated to torchrun): nnodes as given ("2:4"), and torchrun's rendezvous flags.
  std::string nnodesText;
  std::string rdzvBackend;
  std::string rdzvEndpoint;
  std::string rdzvId;
  std::string rdzvConf;
  int maxRestarts = 3;
  std::string torchrun = "python3 -m bagua.distributed.run";
  bool elastic() const {
    return nnodesText.find(':') != std::string::npos || !rdzvBackend.empty() ||
           !rdzvEndpoint.empty();
  }
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: baguarun [--nproc_per_node N] [--nnodes M] [--node_rank R]\n"
               "                [--master_addr A] [--master_port P] [--grace_s S] [--] program "
               "[args...]\n"
               "Starts N workers with torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,\n"
               "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), forwards signals, and stops every\n"
               "worker when one fails, reporting which rank failed and why.\n"
               "  --master_port 0   pick a free port (single node)\n"
               "  --grace_s S       seconds between SIGTERM and SIGKILL (default 5)\n"
               "Elastic (torchrun underneath): --nnodes MIN:MAX, --rdzv_backend B (c10d),\n"
               "  --rdzv_endpoint HOST:PORT (--master_addr:--master_port), --rdzv_id ID,\n"
               "  --rdzv_conf K=V,..., --max_restarts R (3), --torchrun CMD\n"
               "  (python3 -m bagua.distributed.run)\n");
}

bool parseIntArg(const std::string& name, const std::string& text, int lo, int hi, int* out) {
  bagua::Result<int64_t> v = bagua::parseInt(text);
  if (!v.isOk() || *v < lo || *v > hi) {
    std::fprintf(stderr, "baguarun: %s must be an integer in [%d, %d], got '%s'\n", name.c_str(),
                 lo, hi, text.c_str());
    return false;
  }
  *out = static_cast<int>(*v);
  return true;
}

// Returns 0 on success, 2 on a usage error, -1 for --help.
int parseArgs(int argc, char** argv, Options* o) {
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      return -1;
    }
    if (a.rfind("--", 0) != 0) {
      break;  // the program
    }
    std::string key = a, value;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    static const char* const kKnown[] = {"--nproc_per_node", "--nproc-per-node", "--nnodes",
                                         "--node_rank",      "--node-rank",      "--master_addr",
                                         "--master-addr",    "--master_port",    "--master-port",
                                         "--grace_s",        "--rdzv_backend",   "--rdzv-backend",
                                         "--rdzv_endpoint",  "--rdzv-endpoint",  "--rdzv_id",
                                         "--rdzv-id",        "--rdzv_conf",      "--rdzv-conf",
                                         "--max_restarts",   "--max-restarts",   "--torchrun"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      std::fprintf(stderr, "baguarun: unknown option %s\n", key.c_str());
      return 2;
    }
    if (eq == std::string::npos) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "baguarun: %s needs a value\n", a.c_str());
        return 2;
      }
      value = argv[++i];
    }
    bool ok = true;
    if (key == "--nproc_per_node" || key == "--nproc-per-node") {
      ok = parseIntArg(key, value, 1, 4096, &o->nprocPerNode);
    } else if (key == "--nnodes") {
      o->nnodesText = value;
      const size_t colon = value.find(':');
      if (colon == std::string::npos) {
        ok = parseIntArg(key, value, 1, 65536, &o->nnodes);
      } else {
        int lo = 0;
        int hi = 0;
        ok = parseIntArg("--nnodes MIN", value.substr(0, colon), 1, 65536, &lo) &&
             parseIntArg("--nnodes MAX", value.substr(colon + 1), lo, 65536, &hi);
        o->nnodes = hi;
      }
    } else if (key == "--rdzv_backend" || key == "--rdzv-backend") {
      o->rdzvBackend = value;
    } else if (key == "--rdzv_endpoint" || key == "--rdzv-endpoint") {
      o->rdzvEndpoint = value;
    } else if (key == "--rdzv_id" || key == "--rdzv-id") {
      o->rdzvId = value;
    } else if (key == "--rdzv_conf" || key == "--rdzv-conf") {
      o->rdzvConf = value;
    } else if (key == "--max_restarts" || key == "--max-restarts") {
      ok = parseIntArg(key, value, 0, 1 << 20, &o->maxRestarts);
    } else if (key == "--torchrun") {
      o->torchrun = value;
    } else if (key == "--node_rank" || key == "--node-rank") {
      ok = parseIntArg(key, value, 0, 65535, &o->nodeRank);
    } else if (key == "--master_addr" || key == "--master-addr") {
      o->masterAddr = value;
    } else if (key == "--master_port" || key == "--master-port") {
      ok = parseIntArg(key, value, 0, 65535, &o->masterPort);
    } else if (key == "--grace_s") {
      bagua::Result<double> g = bagua::parseDouble(value);
      ok = g.isOk() && *g >= 0;
      if (ok) {
        o->graceS = *g;
      } else {
        std::fprintf(stderr, "baguarun: --grace_s must be a non-negative number\n");
      }
    } else {
      std::fprintf(stderr, "baguarun: unknown option %s\n", key.c_str());
      return 2;
    }
    if (!ok) {
      return 2;
    }
  }
  for (; i < argc; ++i) {
    o->command.push_back(argv[i]);
  }
  if (o->command.empty()) {
    std::fprintf(stderr, "baguarun: no program given\n");
    return 2;
  }
  if (o->elastic()) {
    return 0;  // ranks come from torchrun's rendezvous; --node_rank does not apply
  }
  if (o->nodeRank >= o->nnodes) {
    std::fprintf(stderr, "baguarun: --node_rank %d must be below --nnodes %d\n", o->nodeRank,
                 o->nnodes);
    return 2;
  }
  if (o->masterPort == 0 && o->nnodes > 1) {
    std::fprintf(stderr, "baguarun: --master_port 0 (pick a free port) works on one node only\n");
    return 2;
  }
  return 0;
}

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

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int rc = parseArgs(argc, argv, &o);
  if (rc != 0) {
    usage(rc < 0 ? stdout : stderr);
    return rc < 0 ? 0 : rc;
  }
  // Elastic: one node when MAX is 1 (torchrun's agent hands the environment to its workers).
  if (!ensureJobKey(o.nnodes == 1)) {
    return 1;
  }
  if (o.elastic()) {
    return execTorchrun(o);
  }
  if (o.masterPort == 0) {
    o.masterPort = pickFreePort();
    if (o.masterPort <= 0) {
      std::fprintf(stderr, "baguarun: could not find a free port\n");
      return 1;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    sigaction(s, &sa, nullptr);
  }
  const int world = o.nprocPerNode * o.nnodes;
  const pid_t self = ::getpid();
  std::vector<Worker> workers(o.nprocPerNode);
  for (int l = 0; l < o.nprocPerNode; ++l) {
    Worker& w = workers[l];
    w.localRank = l;
    w.rank = o.nodeRank * o.nprocPerNode + l;
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "baguarun: fork failed: %s\n", std::strerror(errno));
      for (auto& other : workers) {
        if (other.running) {
          ::kill(-other.pid, SIGKILL);
        }
      }
      return 1;
    }
    if (pid == 0) {
      // Own process group: signals reach the worker's whole tree (shells, helpers).
      ::setpgid(0, 0);
      dieWithParent(self);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int s : {SIGINT, SIGTERM, SIGHUP}) {
        sigaction(s, &dfl, nullptr);
      }
      ::setenv("MASTER_ADDR", o.masterAddr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(o.masterPort).c_str(), 1);
      ::setenv("RANK", std::to_string(w.rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(l).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nprocPerNode).c_str(), 1);
      ::setenv("NODE_RANK", std::to_string(o.nodeRank).c_str(), 1);
      ::setenv("NNODES", std::to_string(o.nnodes).c_str(), 1);
      std::vector<char*> args;
      for (auto& s : o.command) {
        args.push_back(s.data());
      }
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "baguarun: rank %d: cannot run '%s': %s\n", w.rank, args[0],
                   std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so there is no window before the child runs
    w.pid = pid;
    w.running = true;
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
               o.nprocPerNode, workers.front().rank, workers.back().rank, world,
               o.command[0].c_str(), o.masterAddr.c_str(), o.masterPort);

  using Clock = std::chrono::steady_clock;
  int failedIndex = -1;
  int forwarded = 0;
  bool stopping = false;
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
    int reaped = 0;
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) {
        break;
      }
      ++reaped;
      for (size_t i = 0; i < workers.size(); ++i) {
        Worker& w = workers[i];
        if (w.pid != pid || !w.running) {
          continue;
        }
        w.running = false;
        w.status = status;
        --running;
        guardian.reaped(w.pid);
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && failedIndex < 0 && !(stopping && gSignal != 0) &&
            (candidate < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(workers[candidate].status)))) {
          candidate = static_cast<int>(i);
        }
      }
    }
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
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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
