#include "bagua/dataset_cache/local_redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "bagua/base/logging.h"
#include "bagua/dataset_cache/params.h"

namespace bagua::cache {
namespace {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = fd;
  }

 private:
  int fd_;
};

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

std::string exitDescription(int status) {
  if (WIFEXITED(status)) {
    return strPrintf("exited with status %d", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return strPrintf("was killed by signal %d", WTERMSIG(status));
  }
  return "stopped";
}

}  // namespace

Result<int> freeLoopbackPort() {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    return BAGUA_ERRNO(errno, "socket");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return BAGUA_ERRNO(errno, "bind 127.0.0.1:0");
  }
  socklen_t len = sizeof(addr);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return BAGUA_ERRNO(errno, "getsockname");
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

Status pingRedis(const std::string& host, int port, std::chrono::milliseconds timeout,
                 const std::string& password) {
  const auto deadline = Clock::now() + timeout;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return BAGUA_ERROR(kInvalidArgument, "pingRedis: '%s' is not an IPv4 address", host.c_str());
  }
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) {
    return BAGUA_ERRNO(errno, "socket");
  }
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
      errno != EINPROGRESS) {
    return BAGUA_ERRNO(errno, strPrintf("connect %s:%d", host.c_str(), port));
  }
  pollfd p{fd.get(), POLLOUT, 0};
  if (::poll(&p, 1, remainingMs(deadline)) != 1) {
    return BAGUA_ERROR(kDeadlineExceeded, "connect %s:%d timed out", host.c_str(), port);
  }
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return BAGUA_ERRNO(err, strPrintf("connect %s:%d", host.c_str(), port));
  }
  // AUTH as a RESP array, so that no byte of the password is taken for a separator.
  std::string request;
  if (!password.empty()) {
    request = strPrintf("*2\r\n$4\r\nAUTH\r\n$%zu\r\n", password.size()) + password + "\r\n";
  }
  request += "PING\r\n";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return BAGUA_ERRNO(errno, strPrintf("send PING to %s:%d", host.c_str(), port));
  }
  std::string reply;
  char buf[64];
  const size_t lines = password.empty() ? 1 : 2;
  auto complete = [&] {
    size_t n = 0;
    for (size_t pos = reply.find("\r\n"); pos != std::string::npos;
         pos = reply.find("\r\n", pos + 2)) {
      ++n;
    }
    return n >= lines;
  };
  while (!complete()) {
    p = pollfd{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, remainingMs(deadline)) != 1) {
      return BAGUA_ERROR(kDeadlineExceeded, "no PING reply from %s:%d in time", host.c_str(), port);
    }
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) {
      return BAGUA_ERROR(kRemoteError, "%s:%d closed the connection before answering PING",
                         host.c_str(), port);
    }
    reply.append(buf, static_cast<size_t>(n));
  }
  if (!password.empty()) {
    if (reply.rfind("+OK\r\n", 0) != 0) {
      return BAGUA_ERROR(kUnavailable, "%s:%d refused the password: '%s'", host.c_str(), port,
                         reply.substr(0, reply.find("\r\n")).c_str());
    }
    reply = reply.substr(5);
  }
  if (reply.rfind("+PONG", 0) != 0) {
    // "-LOADING ..." while a server loads its data set, "-NOAUTH ..." with a password.
    return BAGUA_ERROR(kUnavailable, "%s:%d answered PING with '%s'", host.c_str(), port,
                       reply.substr(0, reply.find("\r\n")).c_str());
  }
  return Status::ok();
}

LocalRedisServer::~LocalRedisServer() {
  stop();
}

LocalRedisServer::LocalRedisServer(LocalRedisServer&& other) noexcept
    : options_(std::move(other.options_)),
      pid_(std::exchange(other.pid_, -1)),
      port_(std::exchange(other.port_, 0)) {}

LocalRedisServer& LocalRedisServer::operator=(LocalRedisServer&& other) noexcept {
  if (this != &other) {
    stop();
    options_ = std::move(other.options_);
    pid_ = std::exchange(other.pid_, -1);
    port_ = std::exchange(other.port_, 0);
  }
  return *this;
}

Status LocalRedisServer::start(LocalRedisOptions options) {
  if (running()) {
    return BAGUA_ERROR(kFailedPrecondition, "redis-server already running on port %d", port_);
  }
  options_ = std::move(options);
  const bool pickPort = options_.port == 0;
  Status last;
  for (int attempt = 0; attempt < (pickPort ? 5 : 1); ++attempt) {
    int port = options_.port;
    if (pickPort) {
      BAGUA_ASSIGN_OR_RETURN(port, freeLoopbackPort());
    }
    last = startOnce(port);
    if (last.isOk() || last.code() == StatusCode::kNotFound ||
        last.code() == StatusCode::kSystemError) {
      return last;
    }
    // Most likely another process took the port between our probe and the server's bind.
  }
  return last;
}

// The server's command line: loopback only, no persistence, in the foreground; the password, if
// any, goes to its standard input instead (see startOnce).
Result<std::vector<std::string>> LocalRedisServer::serverArgs(int port) const {
  std::vector<std::string> args = {options_.binary,
                                   "--port",
                                   std::to_string(port),
                                   "--bind",
                                   "127.0.0.1",
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--daemonize",
                                   "no",
                                   "--protected-mode",
                                   "yes",
                                   "--loglevel",
                                   "warning"};
  if (options_.maxMemoryBytes > 0) {
    args.insert(args.end(), {"--maxmemory", std::to_string(options_.maxMemoryBytes),
                             "--maxmemory-policy", options_.maxMemoryPolicy});
  }
  if (!options_.password.empty()) {
    if (options_.password.find_first_of(" \t\r\n\"'") != std::string::npos) {
      return BAGUA_ERROR(kInvalidArgument,
                         "redis-server password: no white space or quotes (it goes into a "
                         "configuration line)");
    }
    args.push_back("-");  // the rest of the configuration (the password) on standard input
  }
  return args;
}

Status LocalRedisServer::startOnce(int port) {
  BAGUA_ASSIGN_OR_RETURN(std::vector<std::string> args, serverArgs(port));
  std::vector<char*> argv;
  for (std::string& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  // Everything the child needs is prepared before fork(): between fork and exec only
  // async-signal-safe calls are made.
  const bool hasSlash = options_.binary.find('/') != std::string::npos;
  std::string fallback = "/usr/bin/" + options_.binary;

  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) {
    return BAGUA_ERRNO(errno, "pipe2");
  }
  Fd errRead(errPipe[0]);
  Fd errWrite(errPipe[1]);
  Fd devNull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (devNull.get() < 0) {
    return BAGUA_ERRNO(errno, "open /dev/null");
  }
  // The server's standard input: the configuration lines that must not be on its command line,
  // written before the fork (a few bytes: the pipe holds them) and closed so it reads to EOF.
  Fd configRead;
  if (!options_.password.empty()) {
    int cfg[2];
    if (::pipe2(cfg, O_CLOEXEC) != 0) {
      return BAGUA_ERRNO(errno, "pipe2");
    }
    configRead.reset(cfg[0]);
    Fd configWrite(cfg[1]);
    const std::string config = "requirepass " + options_.password + "\n";
    if (::write(configWrite.get(), config.data(), config.size()) !=
        static_cast<ssize_t>(config.size())) {
      return BAGUA_ERRNO(errno, "writing redis-server's configuration");
    }
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    return BAGUA_ERRNO(errno, "fork");
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) {
      ::_exit(127);
    }
    ::dup2(configRead.get() >= 0 ? configRead.get() : devNull.get(), STDIN_FILENO);
    ::dup2(devNull.get(), STDOUT_FILENO);
    ::dup2(devNull.get(), STDERR_FILENO);
    ::execvp(argv[0], argv.data());
    int e = errno;
    if (e == ENOENT && !hasSlash) {
      ::execv(fallback.c_str(), argv.data());
      e = errno;
    }
    ssize_t ignored = ::write(errPipe[1], &e, sizeof(e));
    (void)ignored;
    ::_exit(127);
  }
  errWrite.reset();
  // The pipe closes on a successful exec (O_CLOEXEC) or carries the exec errno.
  const auto deadline = Clock::now() + options_.startTimeout;
  int execErr = 0;
  pollfd p{errRead.get(), POLLIN, 0};
  if (::poll(&p, 1, remainingMs(deadline)) == 1 &&
      ::read(errRead.get(), &execErr, sizeof(execErr)) == sizeof(execErr)) {
    int status = 0;
    ::waitpid(pid, &status, 0);  // it has already called _exit
    if (execErr == ENOENT) {
      return BAGUA_ERROR(kNotFound,
                         "cannot run '%s': not found on PATH%s (install redis-server or set "
                         "BAGUA_CACHE_REDIS_SERVER)",
                         options_.binary.c_str(), hasSlash ? "" : " nor in /usr/bin");
    }
    return BAGUA_ERRNO(execErr, strPrintf("exec %s", options_.binary.c_str()));
  }
  pid_ = pid;
  port_ = port;
  return awaitPing(deadline);
}

// Polls the started server (pid_ on port_) until it answers PING; reports its exit or the
// deadline, killing it in the latter case.
Status LocalRedisServer::awaitPing(std::chrono::steady_clock::time_point deadline) {
  const int port = port_;
  while (true) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return BAGUA_ERROR(kUnavailable,
                         "redis-server on port %d %s before answering PING (port taken? run "
                         "'%s --port %d' by hand to see its message)",
                         port, exitDescription(status).c_str(), options_.binary.c_str(), port);
    }
    Status ping = pingRedis("127.0.0.1", port, std::chrono::milliseconds(200), options_.password);
    if (ping.isOk()) {
      BAGUA_LOG_DEBUG(kLogCache, "redis-server pid %d answers on 127.0.0.1:%d",
                      static_cast<int>(pid_), port);
      return Status::ok();
    }
    if (Clock::now() >= deadline) {
      kill();
      return BAGUA_ERROR(
          kUnavailable, "redis-server on port %d did not answer PING within %lld ms: %s", port,
          static_cast<long long>(options_.startTimeout.count()), ping.message().c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void LocalRedisServer::reap(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  while (pid_ > 0) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      return;
    }
    if (Clock::now() >= deadline) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void LocalRedisServer::stop() {
  if (pid_ <= 0) {
    return;
  }
  ::kill(pid_, SIGTERM);
  reap(std::chrono::milliseconds(5000));
  if (pid_ > 0) {
    BAGUA_LOG_WARN(kLogCache, "redis-server pid %d ignored SIGTERM for 5 s; killing it",
                   static_cast<int>(pid_));
    kill();
  }
}

void LocalRedisServer::kill() {
  if (pid_ <= 0) {
    return;
  }
  ::kill(pid_, SIGKILL);
  reap(std::chrono::milliseconds(5000));
  if (pid_ > 0) {
    BAGUA_LOG_ERROR(kLogCache, "redis-server pid %d did not exit after SIGKILL within 5 s",
                    static_cast<int>(pid_));
    pid_ = -1;
  }
}

}  // namespace bagua::cache
