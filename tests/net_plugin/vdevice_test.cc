// Devices spanning several interfaces through the built plugin: NCCL's NIC fusion (makeVDevice in
// the v9..v12 tables) and the BAGUA_NET_DEVICES knob. Loopback only here (the fused device over
// lo twice: two rails, two listening ports); links_test.cc runs fused devices over real veth
// links.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "nccl_net_abi.h"
#include "net_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define BAGUA_VDEV_TEST_WITH_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BAGUA_VDEV_TEST_WITH_LSAN 1
#endif
#endif
#ifdef BAGUA_VDEV_TEST_WITH_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace {

using bagua::net::testing::fillPattern;
using bagua::net::testing::firstMismatch;
using bagua::net::testing::pluginPath;
using bagua::net::testing::pollFor;

// The plugin loaded with `env` set, initialised through its v11 table.
class V11 {
 public:
  explicit V11(std::vector<std::pair<std::string, std::string>> env) : env_(std::move(env)) {
    for (auto& [k, v] : env_) {
      setenv(k.c_str(), v.c_str(), 1);
    }
    lib_ = dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ != nullptr) {
      net_ = static_cast<ncclNet_v11_t*>(dlsym(lib_, "ncclNetPlugin_v11"));
    }
  }
  ~V11() {
    if (initOk_) {
      net_->finalize(ctx_);
    }
    if (lib_ != nullptr) {
      dlclose(lib_);
    }
    for (auto& [k, v] : env_) {
      unsetenv(k.c_str());
    }
  }
  V11(const V11&) = delete;
  V11& operator=(const V11&) = delete;

  ncclResult_t init() {
#ifdef BAGUA_VDEV_TEST_WITH_LSAN
    __lsan::ScopedDisabler noLeakCheck;  // base's singletons outlive each load (README)
#endif
    // NCCL's logger, as NCCL hands it: warnings then never reach base's stderr sink, which would
    // pin the module in this process (and every later test would get its frozen parameters).
    ncclResult_t r = net_->init(&ctx_, 7, nullptr, bagua::net::testing::captureLogger, nullptr);
    initOk_ = r == ncclSuccess;
    return r;
  }
  ncclNet_v11_t* net() const {
    return net_;
  }
  void* lib() const {
    return lib_;
  }
  void* ctx() const {
    return ctx_;
  }

 private:
  std::vector<std::pair<std::string, std::string>> env_;
  void* lib_ = nullptr;
  ncclNet_v11_t* net_ = nullptr;
  void* ctx_ = nullptr;
  bool initOk_ = false;
};

class VDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (pluginPath().empty()) {
      GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set (run through meson test)";
    }
  }
  // Each test leaves the module unloaded, so that the next load reads its environment afresh.
  void TearDown() override {
    if (!pluginPath().empty()) {
      EXPECT_EQ(dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr)
          << "the plugin stayed loaded after the test";
    }
  }
};

// One message of `size` bytes over device `dev`, every byte checked (v11 or v12 table).
template <typename Net>
void sendOne(Net* net, void* ctx, int dev, size_t size) {
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  ASSERT_EQ(net->listen(ctx, dev, handle, &listenComm), ncclSuccess);
  void* send = nullptr;
  void* recv = nullptr;
  ASSERT_TRUE(pollFor(10, [&] {
    ncclNetDeviceHandle_v7_t* devComm = nullptr;
    if (send == nullptr) {
      EXPECT_EQ(net->connect(ctx, dev, handle, &send, &devComm), ncclSuccess);
    }
    if (recv == nullptr) {
      EXPECT_EQ(net->accept(listenComm, &recv, &devComm), ncclSuccess);
    }
    return send != nullptr && recv != nullptr;
  }));
  ASSERT_EQ(net->closeListen(listenComm), ncclSuccess);
  std::vector<uint8_t> sbuf(size), rbuf(size + 1, 0xee);
  fillPattern(sbuf, 3);
  void* sreq = nullptr;
  void* rreq = nullptr;
  ASSERT_EQ(net->isend(send, sbuf.data(), size, 0, nullptr, nullptr, &sreq), ncclSuccess);
  void* data = rbuf.data();
  size_t cap = rbuf.size();
  int tag = 0;
  ASSERT_EQ(net->irecv(recv, 1, &data, &cap, &tag, nullptr, nullptr, &rreq), ncclSuccess);
  ASSERT_TRUE(sreq != nullptr && rreq != nullptr);
  int sdone = 0;
  int rdone = 0;
  int got = 0;
  ASSERT_TRUE(pollFor(30, [&] {
    if (!sdone) {
      EXPECT_EQ(net->test(sreq, &sdone, nullptr), ncclSuccess);
    }
    if (!rdone) {
      EXPECT_EQ(net->test(rreq, &rdone, &got), ncclSuccess);
    }
    return (sdone && rdone) || ::testing::Test::HasFailure();
  }));
  EXPECT_EQ(static_cast<size_t>(got), size);
  EXPECT_EQ(firstMismatch(rbuf.data(), size, 3), -1);
  EXPECT_EQ(rbuf[size], 0xee);
  EXPECT_EQ(net->closeSend(send), ncclSuccess);
  EXPECT_EQ(net->closeRecv(recv), ncclSuccess);
}

// NCCL fuses devices 0 and 0 (lo twice): a new device whose properties list its parts, with twice
// the speed, that carries messages over its two rails.
TEST_F(VDevice, MakeVDeviceFusesDevicesAndCarriesMessages) {
  V11 so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_NSTREAMS", "4"}});
  ASSERT_NE(so.net(), nullptr) << dlerror();
  ASSERT_NE(so.net()->makeVDevice, nullptr);
  ASSERT_EQ(so.init(), ncclSuccess);
  ncclNet_v11_t* net = so.net();
  int ndev = 0;
  ASSERT_EQ(net->devices(&ndev), ncclSuccess);
  ASSERT_EQ(ndev, 1);
  ncclNetProperties_v11_t base{};
  ASSERT_EQ(net->getProperties(0, &base), ncclSuccess);
  EXPECT_EQ(base.vProps.ndevs, 1);
  EXPECT_EQ(base.vProps.devs[0], 0);

  ncclNetVDeviceProps_v9_t parts{};
  parts.ndevs = 2;
  parts.devs[0] = 0;
  parts.devs[1] = 0;
  int vdev = -1;
  ASSERT_EQ(net->makeVDevice(&vdev, &parts), ncclSuccess);
  EXPECT_EQ(vdev, 1);
  ASSERT_EQ(net->devices(&ndev), ncclSuccess);
  EXPECT_EQ(ndev, 2);
  ncclNetProperties_v11_t v{};
  ASSERT_EQ(net->getProperties(vdev, &v), ncclSuccess);
  EXPECT_STREQ(v.name, "lo+lo");
  EXPECT_EQ(v.speed, 2 * base.speed);
  EXPECT_EQ(v.vProps.ndevs, 2);
  EXPECT_EQ(v.vProps.devs[0], 0);
  EXPECT_EQ(v.vProps.devs[1], 0);
  sendOne(net, so.ctx(), vdev, (3 << 20) + 5);
  sendOne(net, so.ctx(), 0, 1 << 20);  // the plain device still works

  parts.ndevs = 0;
  EXPECT_NE(net->makeVDevice(&vdev, &parts), ncclSuccess) << "no devices";
  parts.ndevs = NCCL_NET_MAX_DEVS_PER_NIC + 1;
  EXPECT_NE(net->makeVDevice(&vdev, &parts), ncclSuccess) << "too many devices";
  parts.ndevs = 1;
  parts.devs[0] = 9;
  EXPECT_NE(net->makeVDevice(&vdev, &parts), ncclSuccess) << "device out of range";
  parts.devs[0] = 1;
  EXPECT_NE(net->makeVDevice(&vdev, &parts), ncclSuccess) << "a virtual device as a part";
}

// NCCL 2.30's table: a virtual NIC of 8 devices (v12's limit; v9..v11 take 4), rail and plane ids
// left undefined, messages over its 8 rails.
TEST_F(VDevice, V12VirtualNicOfEightDevices) {
  setenv("NCCL_SOCKET_IFNAME", "=lo", 1);
  setenv("BAGUA_NET_NSTREAMS", "8", 1);
  void* lib = dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto* net = static_cast<ncclNet_v12_t*>(dlsym(lib, "ncclNetPlugin_v12"));
  ASSERT_NE(net, nullptr);
  void* ctx = nullptr;
  {
#ifdef BAGUA_VDEV_TEST_WITH_LSAN
    __lsan::ScopedDisabler noLeakCheck;
#endif
    ASSERT_EQ(net->init(&ctx, 9, nullptr, bagua::net::testing::captureLogger, nullptr),
              ncclSuccess);
  }
  ncclNetProperties_v12_t p{};
  ASSERT_EQ(net->getProperties(0, &p), ncclSuccess);
  EXPECT_EQ(p.railId, NCCL_NET_ID_UNDEF);
  EXPECT_EQ(p.planeId, NCCL_NET_ID_UNDEF);
  EXPECT_EQ(p.vProps.ndevs, 1);
  EXPECT_EQ(p.maxMultiRequestSize, 1);
  ncclNetVDeviceProps_v12_t parts{};
  parts.ndevs = NCCL_NET_MAX_DEVS_PER_NIC_V12;
  int vdev = -1;
  ASSERT_EQ(net->makeVDevice(&vdev, &parts), ncclSuccess);
  ncclNetProperties_v12_t v{};
  ASSERT_EQ(net->getProperties(vdev, &v), ncclSuccess);
  EXPECT_EQ(v.vProps.ndevs, 8);
  EXPECT_EQ(v.speed, 8 * p.speed);
  EXPECT_EQ(v.railId, NCCL_NET_ID_UNDEF);
  sendOne(net, ctx, vdev, (5 << 20) + 11);
  parts.ndevs = NCCL_NET_MAX_DEVS_PER_NIC_V12 + 1;
  EXPECT_NE(net->makeVDevice(&vdev, &parts), ncclSuccess);
  EXPECT_EQ(net->finalize(ctx), ncclSuccess);
  dlclose(lib);
  unsetenv("NCCL_SOCKET_IFNAME");
  unsetenv("BAGUA_NET_NSTREAMS");
}

// Every table that has makeVDevice (v9..v12) exports it.
TEST_F(VDevice, EveryTableWithTheMemberExportsIt) {
  void* lib = dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto* v9 = static_cast<ncclNet_v9_t*>(dlsym(lib, "ncclNetPlugin_v9"));
  auto* v10 = static_cast<ncclNet_v10_t*>(dlsym(lib, "ncclNetPlugin_v10"));
  auto* v11 = static_cast<ncclNet_v11_t*>(dlsym(lib, "ncclNetPlugin_v11"));
  auto* v12 = static_cast<ncclNet_v12_t*>(dlsym(lib, "ncclNetPlugin_v12"));
  ASSERT_TRUE(v9 != nullptr && v10 != nullptr && v11 != nullptr && v12 != nullptr);
  EXPECT_NE(v12->makeVDevice, nullptr);
  EXPECT_NE(v9->makeVDevice, nullptr);
  EXPECT_NE(v10->makeVDevice, nullptr);
  EXPECT_NE(v11->makeVDevice, nullptr);
  EXPECT_EQ(v9->makeVDevice, v11->makeVDevice) << "one adapter behind every version";
  dlclose(lib);
}

// BAGUA_NET_DEVICES: a single interface stays one plain device; a bad value fails init.
TEST_F(VDevice, DevicesKnob) {
  {
    V11 so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_DEVICES", "fused"}});
    ASSERT_NE(so.net(), nullptr) << dlerror();
    ASSERT_EQ(so.init(), ncclSuccess);
    int ndev = 0;
    ASSERT_EQ(so.net()->devices(&ndev), ncclSuccess);
    EXPECT_EQ(ndev, 1);
    ncclNetProperties_v11_t p{};
    ASSERT_EQ(so.net()->getProperties(0, &p), ncclSuccess);
    EXPECT_STREQ(p.name, "lo");
  }
  // In a child process, so that a failed init leaves nothing behind here.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    V11 so({{"NCCL_SOCKET_IFNAME", "=lo"}, {"BAGUA_NET_DEVICES", "both"}});
    _exit(so.net() == nullptr ? 2 : so.init() == ncclSuccess ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "an unknown BAGUA_NET_DEVICES value must fail init (1: it "
                                       "succeeded, 2: the plugin did not load)";
}

}  // namespace
