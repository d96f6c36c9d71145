// A host that vanishes without a FIN or RST: each "host" is a network namespace on a
// bridge (198.18.0.0/15, made and removed here), and `ip link set ... down` on one namespace's
// link cuts it off mid-all-reduce. Every other rank must fail within BAGUA_PEER_TIMEOUT_MS (plus
// one heartbeat interval and scheduling slack) naming the lost rank and its address, exit with
// the worker's error code (no crash), and nothing may hang. Likewise a TCP store client blocked
// in a get on a server whose host vanished fails within the bound naming the server.
//
// The workers are tests/core/peer_worker (PEER_WORKER_BIN), started with `ip netns exec`.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/params.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kPeerTimeoutMs = 3000;
constexpr int kIntervalMs = 300;
// Detection itself takes the timeout plus at most one interval. What the tests assert is that a
// rank fails after the cut, not before the peer could have been missed (half the timeout: the
// peer was heard from until the cut, though a loaded host may have delayed its last heartbeats),
// and not never: the upper bound is one against a hang (4x the timeout), not a speed claim.
constexpr int kNotBeforeMs = kPeerTimeoutMs / 2;
constexpr int kHangMs = 4 * kPeerTimeoutMs;

int sh(const std::string& cmd) {
  int st = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Namespaces b20n<tag>x<i> with veths on bridge b20b<tag> (tag: pid and instance), addresses
// 198.18.<subnet>.<i+1>/24.
class Hosts {
 public:
  explicit Hosts(int n) : n_(n) {
    // Per instance: a namespace's veth pair can outlive `ip netns del` for a moment.
    static int instances = 0;
    const int id = instances++;
    tag_ = std::to_string(::getpid() % 1000000) + "i" + std::to_string(id);
    subnet_ = static_cast<int>((::getpid() + id) % 200) + 20;
  }
  ~Hosts() { remove(); }

  // Empty on success, else why the machine refused.
  std::string create() {
    if (::geteuid() != 0) {
      return "not root: network namespaces need CAP_NET_ADMIN";
    }
    if (sh("ip netns list") != 0) {
      return "`ip netns` does not work here";
    }
    if (sh("ip link add " + bridge() + " type bridge") != 0 ||
        sh("ip link set " + bridge() + " up") != 0) {
      return "cannot make a bridge (ip link add type bridge refused)";
    }
    made_ = true;
    for (int i = 0; i < n_; ++i) {
      const std::string ns = name(i);
      const std::string h = "b20h" + tag_ + "x" + std::to_string(i);
      const std::string v = veth(i);
      if (sh("ip netns add " + ns) != 0) {
        return "ip netns add refused";
      }
      ++created_;
      if (sh("ip link add " + h + " type veth peer name " + v) != 0 ||
          sh("ip link set " + v + " netns " + ns) != 0 ||
          sh("ip link set " + h + " master " + bridge() + " up") != 0 ||
          sh("ip -n " + ns + " link set lo up") != 0 ||
          sh("ip -n " + ns + " addr add " + address(i) + "/24 dev " + v) != 0 ||
          sh("ip -n " + ns + " link set " + v + " up") != 0) {
        return "cannot wire namespace " + ns + " to the bridge (veth refused)";
      }
    }
    return "";
  }

  void remove() {
    for (int i = 0; i < created_; ++i) {
      sh("ip netns del " + name(i));  // takes its veth pair along
    }
    created_ = 0;
    if (made_) {
      sh("ip link del " + bridge());
      made_ = false;
    }
  }

  std::string name(int i) const { return "b20n" + tag_ + "x" + std::to_string(i); }
  std::string veth(int i) const { return "b20v" + tag_ + "x" + std::to_string(i); }
  std::string address(int i) const {
    return "198.18." + std::to_string(subnet_) + "." + std::to_string(i + 1);
  }
  std::string bridge() const { return "b20b" + tag_; }
  // Pulls the cable: no FIN, no RST reaches the others.
  bool cut(int i) const { return sh("ip -n " + name(i) + " link set " + veth(i) + " down") == 0; }

 private:
  int n_;
  std::string tag_;
  int subnet_ = 20;
  int created_ = 0;
  bool made_ = false;
};

struct Worker {
  pid_t pid = -1;
  std::string out;
  std::string err;
  int status = -1;
  Clock::time_point exited;
};

class VanishedHost : public ::testing::Test {
 protected:
  void TearDown() override {
    for (Worker& w : workers_) {
      if (w.pid > 0 && w.status == -1) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &w.status, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("bagua_vh_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    worker_ = bagua::processEnv("PEER_WORKER_BIN").value_or("");
    ASSERT_FALSE(worker_.empty()) << "PEER_WORKER_BIN is not set (meson sets it)";
  }

  // Starts `peer_worker mode` as `rank` inside namespace `ns`.
  void spawn(const std::string& ns, const std::string& mode, int rank, int world,
             const std::string& master) {
    Worker w;
    w.out = (dir_ / ("out" + std::to_string(workers_.size()))).string();
    w.err = (dir_ / ("err" + std::to_string(workers_.size()))).string();
    w.pid = ::fork();
    if (w.pid == 0) {
      int o = ::open(w.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(w.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", master.c_str(), 1);
      ::setenv("MASTER_PORT", "29511", 1);
      ::setenv("BAGUA_PEER_TIMEOUT_MS", std::to_string(kPeerTimeoutMs).c_str(), 1);
      ::setenv("BAGUA_HEARTBEAT_INTERVAL_MS", std::to_string(kIntervalMs).c_str(), 1);
      // Far above the bound: a pass shows the heartbeat, not the collective deadline, at work.
      ::setenv("BAGUA_COLLECTIVE_TIMEOUT_MS", "60000", 1);
      ::setenv("BAGUA_NET_TIMEOUT_MS", "60000", 1);
      // One job key across the "hosts": the store, the engine and the heartbeats authenticated
      // over a real network, as in a multi-node job.
      ::setenv("BAGUA_JOB_KEY", "vanished-host-test-key-0123456789abcdef", 1);
      ::execlp("ip", "ip", "netns", "exec", ns.c_str(), worker_.c_str(), mode.c_str(), nullptr);
      ::_exit(127);
    }
    workers_.push_back(w);
  }

  // Waits until every worker in `which` printed `lines` lines; false after `timeout`.
  bool waitForOutput(const std::vector<int>& which, int lines, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      bool all = true;
      for (int i : which) {
        const std::string o = slurp(workers_[i].out);
        if (std::count(o.begin(), o.end(), '\n') < lines) {
          all = false;
        }
      }
      if (all) {
        return true;
      }
      reap();
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  void reap() {
    for (Worker& w : workers_) {
      int st = 0;
      if (w.status == -1 && ::waitpid(w.pid, &st, WNOHANG) == w.pid) {
        w.status = st;
        w.exited = Clock::now();
      }
    }
  }

  // Waits until the workers in `which` exited, up to `timeout`.
  void waitExit(const std::vector<int>& which, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      reap();
      bool all = true;
      for (int i : which) {
        all = all && workers_[i].status != -1;
      }
      if (all) {
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
  }

  std::string logs() {
    std::string s;
    for (size_t i = 0; i < workers_.size(); ++i) {
      s += "--- worker " + std::to_string(i) + " stderr:\n" + slurp(workers_[i].err);
    }
    return s;
  }

  std::filesystem::path dir_;
  std::string worker_;
  std::vector<Worker> workers_;
};

TEST_F(VanishedHost, SurvivorsOfAnAllReduceFailInBoundNamingThePeer) {
  constexpr int kWorld = 3;
  Hosts hosts(kWorld);
  const std::string refused = hosts.create();
  if (!refused.empty()) {
    GTEST_SKIP() << "network namespaces unavailable: " << refused;
  }
  for (int r = 0; r < kWorld; ++r) {
    spawn(hosts.name(r), "allreduce", r, kWorld, hosts.address(0));
  }
  ASSERT_TRUE(waitForOutput({0, 1, 2}, 5, 60s)) << "the all-reduce loop did not start\n" << logs();
  const auto t0 = Clock::now();
  ASSERT_TRUE(hosts.cut(2));
  waitExit({0, 1, 2}, 30s);
  for (int r = 0; r < kWorld; ++r) {
    const Worker& w = workers_[r];
    ASSERT_NE(w.status, -1) << "rank " << r << " still running 30 s after the cut (hang)\n"
                            << logs();
    ASSERT_TRUE(WIFEXITED(w.status)) << "rank " << r << " died by signal "
                                     << (WIFSIGNALED(w.status) ? WTERMSIG(w.status) : 0) << "\n"
                                     << logs();
    EXPECT_EQ(WEXITSTATUS(w.status), 3) << "rank " << r << "\n" << logs();
  }
  const std::string lost = "rank 2 at " + hosts.address(2) + ":";
  for (int r = 0; r < 2; ++r) {
    const Worker& w = workers_[r];
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(w.exited - t0).count();
    EXPECT_LE(took, kHangMs) << "rank " << r << "\n" << logs();
    EXPECT_GE(took, kNotBeforeMs) << "rank " << r << "\n" << logs();
    const std::string err = slurp(w.err);
    const size_t at = err.find("FAILED");
    EXPECT_NE(at, std::string::npos) << err;
    EXPECT_NE(err.find(lost), std::string::npos)
        << "rank " << r << " does not name '" << lost << "':\n"
        << err;
  }
}

TEST_F(VanishedHost, StoreClientFailsInBoundNamingTheServer) {
  Hosts hosts(2);
  const std::string refused = hosts.create();
  if (!refused.empty()) {
    GTEST_SKIP() << "network namespaces unavailable: " << refused;
  }
  spawn(hosts.name(0), "store-server", 0, 2, hosts.address(0));
  ASSERT_TRUE(waitForOutput({0}, 1, 30s)) << logs();
  spawn(hosts.name(1), "store-get", 1, 2, hosts.address(0));
  ASSERT_TRUE(waitForOutput({1}, 1, 30s)) << logs();
  std::this_thread::sleep_for(300ms);  // the get is parked on the server
  const auto t0 = Clock::now();
  ASSERT_TRUE(hosts.cut(0));
  waitExit({1}, 30s);
  const Worker& w = workers_[1];
  ASSERT_NE(w.status, -1) << "the client still waits 30 s after the cut (hang)\n" << logs();
  ASSERT_TRUE(WIFEXITED(w.status)) << logs();
  EXPECT_EQ(WEXITSTATUS(w.status), 3) << logs();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(w.exited - t0).count();
  // TCP_USER_TIMEOUT with keepalive probes every max(1 s, timeout / 5): the first probe past it.
  EXPECT_LE(took, kHangMs) << logs();
  const std::string err = slurp(w.err);
  EXPECT_NE(err.find("TCP store " + hosts.address(0) + ":29511"), std::string::npos) << err;
}

}  // namespace
