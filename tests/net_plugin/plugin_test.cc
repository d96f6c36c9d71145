// Functional tests of the built libnccl-net.so, loaded the way NCCL loads it: dlopen, dlsym of
// ncclNetPlugin_v12 ... _v6, then listen/connect/accept/isend/irecv/test/close between threads
// (and a forked process) over loopback, every byte checked. The module's path comes from meson in
// BAGUA_NET_PLUGIN_PATH.
#include <dlfcn.h>
#include <elf.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"
#include "bagua/net/live_abi.h"
#include "bagua_config.h"  // BAGUA_VERSION: the init line names the build
#include "nccl_net_abi.h"
#include "net_test_util.h"
#include "plugin_api.h"

namespace {

using namespace bagua::net::plugintest;

class Plugin : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (pluginPath().empty()) {
      GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set (run through meson test)";
    }
  }
};

TEST_P(Plugin, InitPropertiesAndTransfers) {
  Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"},
             {"BAGUA_NET_NSTREAMS", "4"},
             {"BAGUA_NET_TUNER_MIN_CHANNELS", "3"}});
  ASSERT_NE(so.lib(), nullptr) << dlerror();
  std::unique_ptr<Api> api = makeApi(so.lib(), GetParam());
  ASSERT_NE(api, nullptr);
  EXPECT_STREQ(api->name, "Bagua");
  ASSERT_EQ(api->init(), ncclSuccess);
  int ndev = 0;
  ASSERT_EQ(api->devices(&ndev), ncclSuccess);
  ASSERT_EQ(ndev, 1);
  int ptr = 0, maxRecvs = 0, speed = 0;
  std::string name;
  ASSERT_EQ(api->props(0, &ptr, &maxRecvs, &speed, &name), ncclSuccess);
  EXPECT_EQ(ptr, NCCL_PTR_HOST);
  EXPECT_EQ(maxRecvs, 1);
  EXPECT_GT(speed, 0);
  EXPECT_EQ(name, "lo");
  EXPECT_NE(api->props(5, &ptr, &maxRecvs, &speed, &name), ncclSuccess) << "bad device";
  EXPECT_TRUE(logContains("NET/Bagua")) << "no log line through NCCL's logger";
  EXPECT_TRUE(logContains("Bagua-Net " BAGUA_VERSION)) << "init does not log the version";
  EXPECT_TRUE(logContains("BAGUA_NET_NSTREAMS=4(environment)"));
  // The init line lists the tuner's catalogue too.
  EXPECT_TRUE(logContains("BAGUA_NET_TUNER_MIN_CHANNELS=3(environment)"));
  EXPECT_TRUE(logContains("BAGUA_NET_TUNER=auto(default)"));

  Conn c = connectPair(*api);
  ASSERT_TRUE(c.send && c.recv);
  std::vector<size_t> sizes = {0,
                               1,
                               1023,
                               1024,
                               1025,
                               4096,
                               65535,
                               65536,
                               65537,
                               (128 << 10) - 1,
                               128 << 10,
                               (128 << 10) + 1,
                               (512 << 10) + 3,
                               1 << 20,
                               (1 << 20) + 1,
                               4 << 20,
                               0,
                               7};
  transfer(*api, c, sizes, 8);
  closePair(*api, c);
  if (api->finalize) {
    EXPECT_EQ(api->finalize(), ncclSuccess);
  }
}

TEST_P(Plugin, ThirtyTwoOutstandingAndNullRequestWhenFull) {
  Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"}});
  ASSERT_NE(so.lib(), nullptr) << dlerror();
  std::unique_ptr<Api> api = makeApi(so.lib(), GetParam());
  ASSERT_EQ(api->init(), ncclSuccess);
  Conn c = connectPair(*api);
  ASSERT_TRUE(c.send && c.recv);
  std::vector<size_t> sizes;
  for (int i = 0; i < 100; ++i) {
    sizes.push_back(static_cast<size_t>((i * 7919) % 150000));
  }
  transfer(*api, c, sizes, NCCL_NET_MAX_REQUESTS);
  // Fill every receive slot: the next irecv returns a NULL request (retry), not an error.
  std::vector<uint8_t> buf(64);
  int posted = 0;
  for (; posted < 1000; ++posted) {
    void* data = buf.data();
    size_t cap = buf.size();
    void* req = nullptr;
    ASSERT_EQ(api->irecv(c.recv, 1, &data, &cap, nullptr, &req), ncclSuccess);
    if (req == nullptr) {
      break;
    }
  }
  EXPECT_GE(posted, NCCL_NET_MAX_REQUESTS);
  EXPECT_LT(posted, 1000);
  closePair(*api, c);  // with all those receives in flight
  if (api->finalize) {
    EXPECT_EQ(api->finalize(), ncclSuccess);
  }
}

TEST_P(Plugin, MisuseAndFaultsAreErrorsNotCrashes) {
  Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_NSTREAMS", "2"}});
  ASSERT_NE(so.lib(), nullptr) << dlerror();
  std::unique_ptr<Api> api = makeApi(so.lib(), GetParam());
  ASSERT_EQ(api->init(), ncclSuccess);
  Conn c = connectPair(*api);
  ASSERT_TRUE(c.send && c.recv);
  void* mh = nullptr;
  EXPECT_EQ(api->regMr(c.send, nullptr, 0, NCCL_PTR_CUDA, &mh), ncclInternalError);
  // Grouped receive beyond maxRecvs = 1.
  std::vector<uint8_t> a(16), b(16);
  void* datas[2] = {a.data(), b.data()};
  size_t caps[2] = {a.size(), b.size()};
  void* req = nullptr;
  EXPECT_EQ(api->irecv(c.recv, 2, datas, caps, nullptr, &req), ncclInternalError);
  EXPECT_EQ(req, nullptr);
  // A receive smaller than the message: clear error (ncclInvalidUsage), nothing overwritten.
  std::vector<uint8_t> big(300000, 7), small(1000, 0);
  void* sreq = postSend(*api, c.send, big.data(), big.size(), nullptr);
  ASSERT_NE(sreq, nullptr);
  void* data = small.data();
  size_t cap = small.size();
  ASSERT_EQ(api->irecv(c.recv, 1, &data, &cap, nullptr, &req), ncclSuccess);
  ASSERT_NE(req, nullptr);
  int size = 0;
  EXPECT_EQ(waitTest(*api, req, &size, 10), ncclInvalidUsage);
  EXPECT_TRUE(logContains("message truncated"));
  closePair(*api, c);

  // A handle from another version / plugin.
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  ASSERT_EQ(api->listen(0, handle, &listenComm), ncclSuccess);
  char bad[NCCL_NET_HANDLE_MAXSIZE];
  std::memcpy(bad, handle, sizeof(bad));
  bad[4] = 42;  // wire version
  void* sendComm = nullptr;
  EXPECT_EQ(api->connect(0, bad, &sendComm), ncclInvalidUsage);
  EXPECT_EQ(sendComm, nullptr);
  EXPECT_TRUE(logContains("version 42"));
  // Garbage on the listening port is dropped; a real connection still goes through.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    uint16_t port = static_cast<uint16_t>(static_cast<uint8_t>(handle[8]) |
                                          (static_cast<uint8_t>(handle[9]) << 8));
    sa.sin_port = htons(port);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    std::vector<char> junk(500, 'x');
    ASSERT_GT(::send(fd, junk.data(), junk.size(), 0), 0);
    void* rc = nullptr;
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(api->accept(listenComm, &rc), ncclSuccess);
      EXPECT_EQ(rc, nullptr);
    }
    ::close(fd);
  }
  Conn c2;
  ASSERT_TRUE(pollFor(10, [&] {
    if (c2.send == nullptr) {
      EXPECT_EQ(api->connect(0, handle, &c2.send), ncclSuccess);
    }
    if (c2.recv == nullptr) {
      EXPECT_EQ(api->accept(listenComm, &c2.recv), ncclSuccess);
    }
    return c2.send != nullptr && c2.recv != nullptr;
  }));
  EXPECT_EQ(api->closeListen(listenComm), ncclSuccess);
  transfer(*api, c2, {3, 300000}, 2);
  // The sender goes away while a receive is pending: ncclRemoteError, bounded time.
  std::vector<uint8_t> rbuf(1 << 20);
  data = rbuf.data();
  cap = rbuf.size();
  ASSERT_EQ(api->irecv(c2.recv, 1, &data, &cap, nullptr, &req), ncclSuccess);
  ASSERT_EQ(api->closeSend(c2.send), ncclSuccess);
  c2.send = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(waitTest(*api, req, &size, 10), ncclRemoteError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  closePair(*api, c2);
  if (api->finalize) {
    EXPECT_EQ(api->finalize(), ncclSuccess);
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, Plugin, ::testing::Values(12, 11, 10, 9, 8, 7, 6),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "v" + std::to_string(i.param);
                         });

class PluginStreams : public ::testing::TestWithParam<int> {};

TEST_P(PluginStreams, LargeMessagesOverNStreams) {
  if (pluginPath().empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"},
             {"BAGUA_NET_NSTREAMS", std::to_string(GetParam())},
             {"BAGUA_NET_MIN_CHUNKSIZE", "64K"}});
  ASSERT_NE(so.lib(), nullptr) << dlerror();
  std::unique_ptr<Api> api = makeApi(so.lib(), 11);
  ASSERT_EQ(api->init(), ncclSuccess);
  EXPECT_TRUE(logContains("BAGUA_NET_NSTREAMS=" + std::to_string(GetParam())));
  Conn c = connectPair(*api);
  ASSERT_TRUE(c.send && c.recv);
  transfer(*api, c, {(64u << 20) + 5, 1 << 20, (3 << 20) + 1}, 2);
  closePair(*api, c);
  EXPECT_EQ(api->finalize(), ncclSuccess);
}

INSTANTIATE_TEST_SUITE_P(Streams, PluginStreams, ::testing::Values(1, 2, 8));

TEST(PluginMany, ManyCommsAtOnceAndPerCommInit) {
  if (pluginPath().empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_NSTREAMS", "2"}});
  ASSERT_NE(so.lib(), nullptr);
  // Two "communicators" (v11 init is per communicator), each with its own ctx.
  std::unique_ptr<Api> a1 = makeApi(so.lib(), 11);
  std::unique_ptr<Api> a2 = makeApi(so.lib(), 11);
  ASSERT_EQ(a1->init(), ncclSuccess);
  ASSERT_EQ(a2->init(), ncclSuccess);
  constexpr int kComms = 10;
  std::vector<Conn> conns;
  for (int i = 0; i < kComms; ++i) {
    conns.push_back(connectPair(i % 2 == 0 ? *a1 : *a2));
    ASSERT_TRUE(conns.back().send && conns.back().recv);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kComms; ++i) {
    threads.emplace_back([&, i] {
      std::vector<size_t> sizes;
      for (int k = 0; k < 12; ++k) {
        sizes.push_back(static_cast<size_t>((k * 104729 + i) % 400000));
      }
      transfer(*a1, conns[static_cast<size_t>(i)], sizes, 8);
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(a1->finalize(), ncclSuccess);  // a2's comm still alive: plugin stays usable
  transfer(*a2, conns[0], {100, 200000}, 2);
  for (Conn& c : conns) {
    closePair(*a2, c);
  }
  EXPECT_EQ(a2->finalize(), ncclSuccess);
}

TEST(PluginFault, PeerProcessKilledMidTransferFailsInBoundedTime) {
  if (pluginPath().empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_NSTREAMS", "4"}});
  ASSERT_NE(so.lib(), nullptr);
  std::unique_ptr<Api> api = makeApi(so.lib(), 11);
  ASSERT_EQ(api->init(), ncclSuccess);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  ASSERT_EQ(api->listen(0, handle, &listenComm), ncclSuccess);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: connect, start a big send, die abruptly mid-transfer.
    void* s = nullptr;
    for (int i = 0; i < 100000 && s == nullptr; ++i) {
      if (api->connect(0, handle, &s) != ncclSuccess) {
        _exit(2);
      }
      usleep(100);
    }
    static std::vector<uint8_t> big(256u << 20, 9);
    void* req = nullptr;
    while (req == nullptr) {
      if (api->isend(s, big.data(), big.size(), nullptr, &req) != ncclSuccess) {
        _exit(3);
      }
    }
    usleep(20000);
    raise(SIGKILL);
    _exit(4);
  }
  void* recvComm = nullptr;
  ASSERT_TRUE(pollFor(10, [&] {
    EXPECT_EQ(api->accept(listenComm, &recvComm), ncclSuccess);
    return recvComm != nullptr;
  }));
  EXPECT_EQ(api->closeListen(listenComm), ncclSuccess);
  // The receive is posted only once the child is dead: until then nothing drains the streams,
  // so the 256 MiB send cannot finish however fast the machine is (on a 32-core host it did,
  // within the child's 20 ms, when the receive was posted first).
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "child did not die as planned, status " << status;
  std::vector<uint8_t> rbuf(256u << 20);
  void* data = rbuf.data();
  size_t cap = rbuf.size();
  void* req = nullptr;
  ASSERT_EQ(api->irecv(recvComm, 1, &data, &cap, nullptr, &req), ncclSuccess);
  auto t0 = std::chrono::steady_clock::now();
  int size = 0;
  ncclResult_t r = waitTest(*api, req, &size, 20);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r == ncclRemoteError || r == ncclSystemError) << "got " << r;
  EXPECT_LT(secs, 10.0);
  EXPECT_EQ(api->closeRecv(recvComm), ncclSuccess);
  EXPECT_EQ(api->finalize(), ncclSuccess);
}

TEST(PluginReload, UnloadsCleanlyAndReloads) {
  if (pluginPath().empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  for (int round = 0; round < 3; ++round) {
    Loaded so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_NSTREAMS", std::to_string(round + 1)}});
    ASSERT_NE(so.lib(), nullptr);
    std::unique_ptr<Api> api = makeApi(so.lib(), 11);
    ASSERT_EQ(api->init(), ncclSuccess);
    Conn c = connectPair(*api);
    ASSERT_TRUE(c.send && c.recv);
    transfer(*api, c, {10, 500000}, 2);
    closePair(*api, c);
    EXPECT_EQ(api->finalize(), ncclSuccess);
  }
  // After the last dlclose the module is really gone (no thread or unique symbol pins it).
  EXPECT_EQ(dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr);
}

}  // namespace
