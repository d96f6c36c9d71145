// What the control-plane tests share: the job keys they use, raw sockets (connect, send, wait
// for the peer to close, read the engine's challenge), the store's server in a process of its own
// (control_worker, where its memory and descriptors are measured) and a capture of the log.
// Header only, for tests/core/control_plane_*_test.cc.
//
// Thread safety: each helper touches only its arguments; LogCapture's sink takes its own lock.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/host/control_wire.h"
#include "backend/host/peer_monitor.h"
#include "backend/host/transport.h"
#include "bagua/base/crypto.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/core/job_key.h"
#include "bagua/core/params.h"
#include "bagua/core/process_group.h"
#include "bagua/core/store.h"
#include "multi_rank.h"
#include "store_wire.h"

namespace bagua::core::cptest {

using namespace std::chrono_literals;

using Clock = std::chrono::steady_clock;

inline const std::string kSecret = "control-plane-test-key-0123456789abcdef";
inline const std::string kOtherSecret = "another-job-entirely-0123456789abcdef";

inline JobKey keyOf(const std::string& secret) {
  return *JobKey::fromSecret(secret);
}

// ---- sockets and processes -------------------------------------------------------------------

inline int connectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (fd >= 0) {
      ::close(fd);
    }
    return -1;
  }
  return fd;
}

inline int portOf(const std::string& hostPort) {
  return std::atoi(hostPort.substr(hostPort.rfind(':') + 1).c_str());
}

inline void sendBytes(int fd, const void* data, size_t len) {
  (void)::send(fd, data, len, MSG_NOSIGNAL);
}

// Waits (bounded) until the peer closes `fd`; adds what arrived before to *received.
inline bool closedWithin(int fd, std::chrono::milliseconds bound, size_t* received = nullptr) {
  const auto until = Clock::now() + bound;
  char buf[4096];
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) {
      continue;
    }
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      return true;
    }
    if (n > 0 && received != nullptr) {
      *received += static_cast<size_t>(n);
    }
  }
  return false;
}

// Reads the store's challenge frame (4-byte length + body) off a fresh connection.
inline bool readChallenge(int fd) {
  uint8_t buf[4 + storewire::kChallengeBytes];
  size_t got = 0;
  const auto until = Clock::now() + 10s;
  while (got < sizeof(buf) && Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) {
      continue;
    }
    ssize_t n = ::recv(fd, buf + got, sizeof(buf) - got, 0);
    if (n <= 0) {
      return false;
    }
    got += static_cast<size_t>(n);
  }
  return got == sizeof(buf) && buf[0] == storewire::kChallengeBytes;
}

// control_worker serve-store in a child process; its stderr collected by a thread.
class StoreProcess {
 public:
  StoreProcess(const std::string& secret, long nofile = 0) {
    const std::string bin = processEnv("CONTROL_WORKER_BIN").value_or("");
    int in[2];
    int out[2];
    int err[2];
    EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      std::string n = std::to_string(nofile);
      ::execl(bin.c_str(), bin.c_str(), "serve-store", secret.c_str(), n.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    stdin_ = in[1];
    errReader_ = std::thread([this, fd = err[0]] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        err_.append(buf, static_cast<size_t>(n));
      }
      ::close(fd);
    });
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') {
      line += c;
    }
    ::close(out[0]);
    if (line.rfind("port ", 0) == 0) {
      port_ = std::atoi(line.c_str() + 5);
    }
  }
  ~StoreProcess() {
    ::close(stdin_);
    int st = 0;
    const auto until = Clock::now() + 10s;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (Clock::now() > until) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    errReader_.join();
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string err() {
    std::lock_guard<std::mutex> lock(mu_);
    return err_;
  }
  // Resident memory in KiB (VmRSS).
  long rssKib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) {
        return std::atol(line.c_str() + 6);
      }
    }
    return -1;
  }
  bool waitForErr(const std::string& text, std::chrono::milliseconds bound) {
    const auto until = Clock::now() + bound;
    while (Clock::now() < until) {
      if (err().find(text) != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int stdin_ = -1;
  std::thread errReader_;
  std::mutex mu_;
  std::string err_;
};

inline size_t countOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) {
    ++n;
  }
  return n;
}

inline Result<std::unique_ptr<TcpStore>> client(int port, std::optional<JobKey> key,
                                                Millis timeout = 10000ms) {
  TcpStoreOptions o;
  o.port = port;
  o.connectTimeout = timeout;
  o.key = std::move(key);
  return TcpStore::connect(o);
}

// Collects the log lines of one test.
class LogCapture {
 public:
  LogCapture() {
    setLogSink([this](LogLevel, const LogCategory&, const char*, int, const std::string& m) {
      std::lock_guard<std::mutex> lock(mu_);
      text_ += m + "\n";
    });
  }
  ~LogCapture() { setLogSink(nullptr); }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

}  // namespace bagua::core::cptest
