// The SSH start: `baguarun --host_list H0,H1,...` runs one baguarun per host over ssh (OpenSSH's
// client, fork/exec), node rank = the host's position in the list, master = the first host (or
// --master_addr), and supervises them as the local baguarun supervises its workers.
//
// Ending the remote ranks without a terminal: each host's baguarun runs with --stdin_control.
// Its stdin is a pipe from this process through ssh: the first line carries the job key (so it
// never appears in a command line), and its end stops that host's job as SIGTERM would (its
// workers get SIGTERM, then SIGKILL after --grace_s). The pipe ends when this baguarun closes it
// (a failure elsewhere, Ctrl-C, SIGTERM), when this baguarun dies (even by SIGKILL: the kernel
// closes it), and when the connection drops (sshd closes the command's stdin), so no path leaves
// ranks running on a host that is still up. ssh's exit status is the remote baguarun's, or 255
// when ssh itself failed: the host could not be reached, or the connection was lost.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bagua/base/crypto.h"
#include "bagua/base/params.h"
#include "baguarun.h"
#include "baguarun_params.h"
#include "output.h"

namespace bagua::baguarun {

namespace {

constexpr int kSshFailed = 255;  // ssh's own exit status for its failures
// After --grace_s, how long the hosts get to report their workers' end before their ssh is
// killed (the remote baguarun needs the grace, then a connection's round trip).
constexpr int kSshMarginMs = 5000;

struct Host {
  std::string given;   // as in the list: the prefix of its output and the name in messages
  std::string target;  // what ssh connects to: [user@]host
  std::string addr;    // the host alone (master address when first)
  int port = 0;        // 0: ssh's own choice
  int nodeRank = 0;
  pid_t pid = -1;
  int stdinFd = -1;  // the write end of the remote baguarun's stdin
  bool running = false;
  bool started = false;  // its baguarun said it started the workers
  int status = 0;
};

// One "[user@]host[:port]" (IPv6: "[addr]:port" or a bare address) into `h`; false after
// printing why.
bool parseHost(const std::string& item, int defaultPort, Host* h) {
  h->given = item;
  const size_t at = item.rfind('@');
  const std::string user = at == std::string::npos ? "" : item.substr(0, at + 1);
  std::string rest = at == std::string::npos ? item : item.substr(at + 1);
  std::string portText;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos || (close + 1 < rest.size() && rest[close + 1] != ':')) {
      std::fprintf(stderr,
                   "baguarun: --host_list: bad host '%s' (want [ADDRESS] or [ADDRESS]:PORT)\n",
                   item.c_str());
      return false;
    }
    portText = close + 1 < rest.size() ? rest.substr(close + 2) : "";
    rest = rest.substr(1, close - 1);
  } else if (std::count(rest.begin(), rest.end(), ':') == 1) {
    portText = rest.substr(rest.find(':') + 1);
    rest = rest.substr(0, rest.find(':'));
  }
  if (rest.empty()) {
    std::fprintf(stderr, "baguarun: --host_list: empty host name in '%s'\n", item.c_str());
    return false;
  }
  h->addr = rest;
  h->target = user + rest;
  h->port = defaultPort;
  if (!portText.empty() || (item.back() == ':')) {
    bagua::Result<int64_t> p = bagua::parseInt(portText);
    if (!p.isOk() || *p < 1 || *p > 65535) {
      std::fprintf(stderr, "baguarun: --host_list: bad port '%s' in '%s' (want 1..65535)\n",
                   portText.c_str(), item.c_str());
      return false;
    }
    h->port = static_cast<int>(*p);
  }
  return true;
}

// The ssh port for hosts without their own: --ssh_port, else BAGUA_SSH_PORT, else 0 (ssh's).
bool defaultSshPort(const Options& o, int* port) {
  if (o.sshPort > 0) {
    *port = o.sshPort;
    return true;
  }
  bagua::Result<int64_t> env = baguarunParams().sshPort.get();
  if (!env.isOk()) {
    std::fprintf(stderr, "baguarun: %s\n", env.status().message().c_str());
    return false;
  }
  *port = static_cast<int>(*env);
  return true;
}

bool parseHosts(const Options& o, std::vector<Host>* hosts) {
  int port = 0;
  if (!defaultSshPort(o, &port)) {
    return false;
  }
  std::string item;
  for (size_t i = 0; i <= o.hostList.size(); ++i) {
    if (i < o.hostList.size() && o.hostList[i] != ',') {
      item += o.hostList[i];
      continue;
    }
    Host h;
    if (!parseHost(item, port, &h)) {
      return false;
    }
    h.nodeRank = static_cast<int>(hosts->size());
    hosts->push_back(h);
    item.clear();
  }
  return true;
}

// The placement flags an SSH start decides itself; false after printing which one clashes.
bool checkPlacement(const Options& o, size_t hosts) {
  if (o.placementGiven && (o.nodeRank != 0 || o.nnodes != static_cast<int>(hosts))) {
    std::fprintf(stderr,
                 "baguarun: --host_list gives %zu node(s), their ranks in list order; drop "
                 "--nnodes/--node_rank\n",
                 hosts);
    return false;
  }
  if (o.masterPort == 0) {
    std::fprintf(stderr,
                 "baguarun: --master_port 0 (pick a free port) works on one node only; give the "
                 "port the first host's rank 0 listens on\n");
    return false;
  }
  if (o.stdinControl) {
    std::fprintf(stderr, "baguarun: --stdin_control is for the baguarun an SSH start runs\n");
    return false;
  }
  return true;
}

// `s` as one word for the remote user's shell.
std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return out + "'";
}

bool validVarName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// The variables every host's baguarun gets: PATH and LD_LIBRARY_PATH as here (Bagua's choice:
// the same installation on every host), BAGUA_JOB_KEY_FILE when set here, then each -x.
bool remoteEnv(const Options& o, std::vector<std::string>* env) {
  for (const char* name : {"PATH", "LD_LIBRARY_PATH", "BAGUA_JOB_KEY_FILE"}) {
    if (std::optional<std::string> v = bagua::processEnv(name)) {
      env->push_back(std::string(name) + "=" + *v);
    }
  }
  for (const std::string& x : o.exportVars) {
    const size_t eq = x.find('=');
    const std::string name = x.substr(0, eq);
    if (!validVarName(name)) {
      std::fprintf(stderr, "baguarun: -x %s: '%s' is not a variable name\n", x.c_str(),
                   name.c_str());
      return false;
    }
    env->push_back(eq == std::string::npos ? name + "=" + bagua::processEnv(name).value_or("") : x);
  }
  return true;
}

// The command line the remote user's shell runs on host `h`.
std::string remoteCommand(const Options& o, const std::vector<std::string>& env,
                          const std::string& baguarun, const std::string& masterAddr,
                          const std::string& cwd, int nnodes, const Host& h) {
  std::string cmd = "cd " + shellQuote(cwd) + " && exec env";
  for (const std::string& kv : env) {
    cmd += " " + shellQuote(kv);
  }
  cmd += " " + shellQuote(baguarun) + " --stdin_control --rank_prefix";
  cmd += bagua::strPrintf(" --nnodes %d --node_rank %d --nproc_per_node %d", nnodes, h.nodeRank,
                          o.nprocPerNode);
  cmd += " --master_addr " + shellQuote(masterAddr) +
         bagua::strPrintf(" --master_port %d --grace_s %g", o.masterPort, o.graceS);
  // Bagua's flags: each host's baguarun applies them for its own ranks (its own plugin).
  if (o.noPython) {
    cmd += " --no_python";
  }
  if (o.enableBaguaNet) {
    cmd += " --enable_bagua_net";
  }
  if (o.baguaServicePort >= 0) {
    cmd += bagua::strPrintf(" --bagua_service_port %d", o.baguaServicePort);
  }
  cmd += " --";
  for (const std::string& word : o.command) {
    cmd += " " + shellQuote(word);
  }
  return cmd;
}

// ssh's arguments for host `h`: the user's options first (ssh keeps the first value of each, so
// theirs win), then ours: no password prompt, no terminal, new host keys accepted and changed
// ones refused, a dead connection noticed within 15 s.
bool sshArgs(const Options& o, const Host& h, const std::string& command,
             std::vector<std::string>* args) {
  std::string userOpts;
  if (o.sshOpts.has_value()) {
    userOpts = *o.sshOpts;
  } else {
    bagua::Result<std::string> env = baguarunParams().sshOpts.get();
    if (!env.isOk()) {
      std::fprintf(stderr, "baguarun: %s\n", env.status().message().c_str());
      return false;
    }
    userOpts = *env;
  }
  args->push_back("ssh");
  std::string word;
  for (char c : userOpts + " ") {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!word.empty()) {
        args->push_back(word);
      }
      word.clear();
    } else {
      word += c;
    }
  }
  for (const char* opt : {"BatchMode=yes", "StrictHostKeyChecking=accept-new", "ConnectTimeout=10",
                          "ServerAliveInterval=5", "ServerAliveCountMax=3"}) {
    args->push_back("-o");
    args->push_back(opt);
  }
  args->push_back("-T");
  if (h.port > 0) {
    args->push_back("-p");
    args->push_back(std::to_string(h.port));
  }
  args->push_back("--");
  args->push_back(h.target);
  args->push_back(command);
  return true;
}

// The job key the hosts get on stdin: the user's BAGUA_JOB_KEY, nothing when a
// BAGUA_JOB_KEY_FILE is set (each host reads its own), else a fresh one. False when none could be
// made.
bool jobKeyLine(std::string* line) {
  if (std::optional<std::string> key = bagua::processEnv("BAGUA_JOB_KEY")) {
    *line = *key + "\n";
    return true;
  }
  if (bagua::processEnv("BAGUA_JOB_KEY_FILE").has_value()) {
    *line = "\n";
    return true;
  }
  uint8_t raw[32];
  bagua::Status s = bagua::randomBytes(raw, sizeof(raw));
  if (!s.isOk()) {
    std::fprintf(stderr, "baguarun: cannot make a job key: %s\n", s.message().c_str());
    return false;
  }
  *line = bagua::toHex(raw, sizeof(raw)) + "\n";
  return true;
}

// Forks ssh for `h` with its stdin from a pipe (the job key, then kept open) and its output into
// `pumps`, "[HOST] " before each line. False when the pipes or the fork failed.
bool startHost(Host& h, const std::vector<std::string>& args, const std::string& keyLine,
               Pumps& pumps) {
  int in[2], out[2], err[2];
  if (!makePipe(in) || !makePipe(out) || !makePipe(err)) {
    std::fprintf(stderr, "baguarun: pipe: %s\n", std::strerror(errno));
    return false;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "baguarun: fork (ssh to %s): %s\n", h.given.c_str(), std::strerror(errno));
    return false;
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // Ctrl-C reaches baguarun only; it stops the hosts in order
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
      sigaction(s, &dfl, nullptr);
    }
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const std::string& a : args) {
      argv.push_back(const_cast<char*>(a.c_str()));
    }
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "baguarun: cannot run ssh (install openssh-client): %s\n",
                 std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  h.pid = pid;
  h.running = true;
  h.stdinFd = in[1];
  writeAll(h.stdinFd, keyLine);
  const std::string prefix = "[" + h.given + "] ";
  pumps.push_back(std::make_unique<LinePump>(out[0], STDOUT_FILENO, prefix));
  Host* hp = &h;
  pumps.push_back(
      std::make_unique<LinePump>(err[0], STDERR_FILENO, prefix, [hp](std::string_view line) {
        if (line.rfind("baguarun: started ", 0) == 0) {
          hp->started = true;
        }
      }));
  return true;
}

void closeStdin(Host& h) {
  if (h.stdinFd >= 0) {
    ::close(h.stdinFd);
    h.stdinFd = -1;
  }
}

// What went wrong on host `h`, for the line that names it.
std::string hostFailure(const Host& h) {
  if (WIFEXITED(h.status) && WEXITSTATUS(h.status) == kSshFailed) {
    if (h.started) {
      return "lost its connection while the job ran (ssh exited with 255: the host died, "
             "rebooted or left the network; ssh's message, if any, is above)";
    }
    return "cannot be reached over SSH (ssh exited with 255; its message is above): check the "
           "name, the port (--ssh_port, HOST:PORT) and that `ssh HOST true` logs in without a "
           "password";
  }
  if (WIFEXITED(h.status) && WEXITSTATUS(h.status) == 127 && !h.started) {
    return "could not start baguarun there (exit code 127: the shell found no such file; "
           "baguarun must be at the same path on every host, or give --remote_baguarun)";
  }
  if (WIFSIGNALED(h.status)) {
    return "its ssh " + describe(h.status);
  }
  return "its baguarun " + describe(h.status) + " (its first failed rank is named above)";
}

}  // namespace

namespace {

// Waits for every host's ssh: at the first failure, or a signal, closes every host's stdin (each
// stops its ranks), and kills what is left of the ssh processes after --grace_s plus a margin.
// Returns the exit status.
int superviseHosts(const Options& o, std::vector<Host>& hosts, Pumps& pumps) {
  using Clock = std::chrono::steady_clock;
  int failedIndex = -1;
  int forwarded = 0;
  bool stopping = false;
  Clock::time_point killAt{};
  auto stopAll = [&]() {
    for (Host& h : hosts) {
      closeStdin(h);
    }
    if (!stopping) {
      stopping = true;
      killAt = Clock::now() +
               std::chrono::milliseconds(static_cast<int64_t>(o.graceS * 1000) + kSshMarginMs);
    }
  };
  size_t running = hosts.size();
  while (running > 0) {
    if (gSignal != 0 && forwarded != gSignal) {
      forwarded = gSignal;
      std::fprintf(stderr, "baguarun: got signal %d (%s), stopping the ranks on every host\n",
                   forwarded, strsignal(forwarded));
      stopAll();
    }
    // As for local workers: reap all that ended, then blame one; a lost connection (255) is
    // taken as the cause over a host whose ranks failed (they lost their peers).
    int candidate = -1;
    reapEnded(hosts, [&](size_t i) {
      Host& h = hosts[i];
      const int status = h.status;
      --running;
      closeStdin(h);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      const bool lost = WIFEXITED(status) && WEXITSTATUS(status) == kSshFailed;
      if (lost) {  // always said: an unreachable or dead host is news even while stopping
        std::fprintf(stderr, "baguarun: host %s (node rank %d) %s\n", h.given.c_str(), h.nodeRank,
                     hostFailure(h).c_str());
      }
      if (failed && failedIndex < 0 && !(stopping && gSignal != 0) &&
          (candidate < 0 || (lost && WEXITSTATUS(hosts[candidate].status) != kSshFailed))) {
        candidate = static_cast<int>(i);
      }
    });
    if (candidate >= 0) {
      failedIndex = candidate;
      std::fprintf(stderr, "baguarun: host %s (node rank %d) failed; stopping the other hosts\n",
                   hosts[candidate].given.c_str(), hosts[candidate].nodeRank);
      stopAll();
    }
    if (stopping && Clock::now() >= killAt) {
      for (Host& h : hosts) {
        if (h.running) {
          std::fprintf(stderr,
                       "baguarun: host %s did not report its ranks' end in time; killing its ssh "
                       "(its baguarun stops them when the connection closes)\n",
                       h.given.c_str());
          ::kill(-h.pid, SIGKILL);
        }
      }
      killAt = Clock::now() + std::chrono::hours(24);
    }
    pollPumps(pumps, -1, 20);
  }
  drainPumps(pumps, 1000);
  if (failedIndex >= 0) {
    const Host& h = hosts[failedIndex];
    std::fprintf(stderr, "baguarun: FAILED: host %s (node rank %d) %s (first failure)\n",
                 h.given.c_str(), h.nodeRank, hostFailure(h).c_str());
    return exitCodeOf(h.status);
  }
  if (gSignal != 0) {
    std::fprintf(stderr, "baguarun: stopped by signal %d\n", static_cast<int>(gSignal));
    return 128 + gSignal;
  }
  return 0;
}

// This baguarun's absolute path (what the hosts run unless --remote_baguarun says otherwise).
std::string selfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("baguarun");
}

}  // namespace

int runOverSsh(const Options& o) {
  std::vector<Host> hosts;
  if (!parseHosts(o, &hosts) || !checkPlacement(o, hosts.size())) {
    return 2;
  }
  std::vector<std::string> env;
  if (!remoteEnv(o, &env)) {
    return 2;
  }
  std::string keyLine;
  if (!jobKeyLine(&keyLine)) {
    return 1;
  }
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
    std::fprintf(stderr, "baguarun: getcwd: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string baguarun = o.remoteBaguarun.empty() ? selfPath() : o.remoteBaguarun;
  const std::string masterAddr = o.masterAddrGiven ? o.masterAddr : hosts.front().addr;
  installInterruptHandlers();
  ::signal(SIGPIPE, SIG_IGN);  // a host's ssh gone before it read the key line
  Pumps pumps;
  for (Host& h : hosts) {
    const std::string cmd =
        remoteCommand(o, env, baguarun, masterAddr, cwd, static_cast<int>(hosts.size()), h);
    std::vector<std::string> args;
    if (!sshArgs(o, h, cmd, &args)) {
      return 2;
    }
    if (!startHost(h, args, keyLine, pumps)) {
      for (Host& other : hosts) {
        closeStdin(other);  // the started ones stop their ranks and exit
      }
      return 1;
    }
  }
  std::fprintf(stderr,
               "baguarun: started %zu host(s) over ssh (%d rank(s) each, %zu in all) for '%s', "
               "master %s:%d\n",
               hosts.size(), o.nprocPerNode, hosts.size() * o.nprocPerNode, o.command[0].c_str(),
               masterAddr.c_str(), o.masterPort);
  return superviseHosts(o, hosts, pumps);
}

}  // namespace bagua::baguarun
