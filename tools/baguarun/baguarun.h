// What baguarun's files share: the options and their parser (args.cc), the signal flag and the
// exit-status helpers (main.cc), and the SSH start (ssh.cc).
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace bagua::baguarun {

// The last SIGINT/SIGTERM/SIGHUP received (0: none), set by the handler installInterruptHandlers
// installs.
extern volatile sig_atomic_t gSignal;

struct Options {
  int nprocPerNode = 1;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  bool masterAddrGiven = false;
  bool placementGiven = false;  // --nnodes or --node_rank on the command line
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
  // The SSH start (ssh.cc): hosts as given, ssh port (-1: not given), ssh options (unset: the
  // environment's), -x variables, and the baguarun to run on each host (empty: this one's path).
  std::string hostList;
  int sshPort = -1;
  std::optional<std::string> sshOpts;
  std::vector<std::string> exportVars;
  std::string remoteBaguarun;
  // What the SSH start asks of the baguarun it runs on each host.
  bool stdinControl = false;  // job key from stdin's first line; stop when stdin ends
  bool rankPrefix = false;    // "[rank R] " before every line of a worker's output
  // Bagua's launcher flags: run a *.py program directly, not as `python3 -u PROG` (Bagua's
  // --no_python); NCCL_NET_PLUGIN = our Bagua-Net plugin for the ranks; BAGUA_SERVICE_PORT for
  // the ranks (-1: not given).
  bool noPython = false;
  bool enableBaguaNet = false;
  int baguaServicePort = -1;

  bool elastic() const {
    return nnodesText.find(':') != std::string::npos || !rdzvBackend.empty() ||
           !rdzvEndpoint.empty();
  }
};

// Parses the command line into `o`: 0 on success, 2 on a usage error (after printing why, one
// line as tools/cli_support words it), -1 for --help, -2 after printing --version.
int parseArgs(int argc, char** argv, Options* o);
void usage(FILE* out);

// "exited with code 3", "was killed by signal 9 (Killed)".
std::string describe(int status);
// The exit status baguarun reports for a child's wait status (128 + signal when killed).
int exitCodeOf(int status);
// Handles SIGINT, SIGTERM and SIGHUP by setting gSignal.
void installInterruptHandlers();

// Reaps every child that has ended (waitpid(-1, WNOHANG) until none is left) and, for each one
// that is an entry of `children` still marked running (Child: pid, running, status), marks it
// ended with its wait status and calls ended(index). Returns how many children were reaped,
// those outside `children` included.
template <typename Child, typename Ended>
int reapEnded(std::vector<Child>& children, Ended ended) {
  int reaped = 0;
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      return reaped;
    }
    ++reaped;
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.pid == pid && c.running) {
        c.running = false;
        c.status = status;
        ended(i);
      }
    }
  }
}

// Starts the job on o.hostList over SSH (one baguarun per host, node rank = position in the
// list) and supervises it; returns baguarun's exit status (2: a bad host list).
int runOverSsh(const Options& o);

}  // namespace bagua::baguarun
