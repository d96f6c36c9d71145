// LocalRedisServer: one redis-server child process on a loopback port, owned by this object.
// Used by RedisStore when no hosts are given (Bagua spawns one server per node) and by the tests
// and benchmarks as their fixture.
//
// The child runs in the foreground (--daemonize no) with no persistence (--save '',
// --appendonly no), bound to 127.0.0.1 in protected mode, with a memory cap and eviction policy,
// and with a password when one is given (RedisStore gives each server it spawns a fresh random
// one, so that no other process of the machine can read or plant cached values). The password
// reaches the server on its standard input, never on its command line (which every local user
// can read in /proc). start() returns
// only once the server answers PING (or fails within the deadline, killing the child). stop()
// (and the destructor) terminate it with SIGTERM, wait a bounded time, then SIGKILL. The child
// also gets SIGKILL if the thread that started it exits (Linux PR_SET_PDEATHSIG), so a crashed
// job or test never leaves a server behind: start it from a thread that outlives its use.
//
// Thread safety: none; one owner calls start/stop/kill.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::cache {

struct LocalRedisOptions {
  std::string binary = "redis-server";  // a path, or a name looked up on PATH then /usr/bin
  int port = 0;                         // 0: pick a free loopback port
  uint64_t maxMemoryBytes = 0;          // 0: no cap
  std::string maxMemoryPolicy = "allkeys-random";
  std::chrono::milliseconds startTimeout{5000};
  std::string password;  // empty: none (test fixtures)
};

class LocalRedisServer {
 public:
  LocalRedisServer() = default;
  ~LocalRedisServer();
  LocalRedisServer(const LocalRedisServer&) = delete;
  LocalRedisServer& operator=(const LocalRedisServer&) = delete;
  LocalRedisServer(LocalRedisServer&& other) noexcept;
  LocalRedisServer& operator=(LocalRedisServer&& other) noexcept;

  // Starts the server. kNotFound when the binary is missing (tests skip on that), kUnavailable
  // when it did not answer PING in time or exited (port taken, bad option). With port 0 a
  // taken port is retried on a fresh one a few times.
  [[nodiscard]] Status start(LocalRedisOptions options);
  // Graceful stop (SIGTERM, bounded wait, then SIGKILL). Idempotent.
  void stop();
  // Abrupt stop (SIGKILL): what a crash or OOM kill looks like to clients. Idempotent.
  void kill();
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const LocalRedisOptions& options() const { return options_; }

 private:
  Status startOnce(int port);
  Result<std::vector<std::string>> serverArgs(int port) const;
  Status awaitPing(std::chrono::steady_clock::time_point deadline);
  void reap(std::chrono::milliseconds wait);

  LocalRedisOptions options_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// A port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
Result<int> freeLoopbackPort();

// Sends PING to host:port over a plain socket (after AUTH when a password is given) and waits
// for +PONG, within `timeout`.
Status pingRedis(const std::string& host, int port, std::chrono::milliseconds timeout,
                 const std::string& password = "");

}  // namespace bagua::cache
