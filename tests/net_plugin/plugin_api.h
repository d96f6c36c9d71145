// The built libnccl-net.so driven as NCCL drives it, for the plugin's functional tests: one
// version's function table behind a version-neutral interface (Api, makeApi for v6 to v12), the
// library loaded with its environment set (Loaded), and connected send/receive comm pairs with
// checked transfers between threads. Header only, for tests/net_plugin/plugin_*_test.cc.
//
// Thread safety: an Api is used as NCCL uses it: one comm from one thread at a time.
#pragma once

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
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"
#include "bagua/net/live_abi.h"
#include "bagua_config.h"  // BAGUA_VERSION: the init line names the build
#include "nccl_net_abi.h"
#include "net_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define BAGUA_TEST_WITH_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BAGUA_TEST_WITH_LSAN 1
#endif
#endif
#ifdef BAGUA_TEST_WITH_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace bagua::net::plugintest {

using bagua::net::testing::fillPattern;
using bagua::net::testing::firstMismatch;
using bagua::net::testing::logContains;
using bagua::net::testing::pluginPath;
using bagua::net::testing::pollFor;

// One version's table behind a version-neutral interface.
struct Api {
  int version = 0;
  const char* name = nullptr;
  std::function<ncclResult_t()> init;
  std::function<ncclResult_t()> finalize;  // empty before v11
  std::function<ncclResult_t(int*)> devices;
  std::function<ncclResult_t(int, int*, int*, int*, std::string*)>
      props;  // ptrSupport, maxRecvs, speed, name
  std::function<ncclResult_t(int, void*, void**)> listen;
  std::function<ncclResult_t(int, void*, void**)> connect;
  std::function<ncclResult_t(void*, void**)> accept;
  std::function<ncclResult_t(void*, void*, size_t, int, void**)> regMr;
  std::function<ncclResult_t(void*, void*)> deregMr;
  std::function<ncclResult_t(void*, void*, size_t, void*, void**)> isend;
  std::function<ncclResult_t(void*, int, void**, size_t*, void**, void**)> irecv;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> closeSend, closeRecv, closeListen;
  void* ctx = nullptr;
};

template <typename T>
void fillCommon(Api& a, T* t) {
  a.name = t->name;
  a.devices = t->devices;
  a.accept = [t](void* l, void** r) {
    if constexpr (std::is_same_v<T, ncclNet_v6_t>) {
      return t->accept(l, r);
    } else {
      ncclNetDeviceHandle_v7_t* dev = nullptr;
      return t->accept(l, r, &dev);
    }
  };
  a.deregMr = t->deregMr;
  a.test = t->test;
  a.closeSend = t->closeSend;
  a.closeRecv = t->closeRecv;
  a.closeListen = t->closeListen;
  a.props = [t](int dev, int* ptr, int* maxRecvs, int* speed, std::string* name) {
    decltype(std::declval<T>().getProperties) fn = t->getProperties;
    // Call through the right properties struct type.
    return [&]<typename Props>(ncclResult_t (*f)(int, Props*)) {
      Props p{};
      ncclResult_t r = f(dev, &p);
      *ptr = p.ptrSupport;
      *maxRecvs = p.maxRecvs;
      *speed = p.speed;
      *name = p.name != nullptr ? p.name : "";
      return r;
    }(fn);
  };
}

template <typename T>
void intSizes(Api& a, T* t) {
  a.regMr = [t](void* c, void* d, size_t s, int type, void** m) {
    if constexpr (std::is_same_v<T, ncclNet_v8_t>) {
      return t->regMr(c, d, s, type, m);
    } else {
      return t->regMr(c, d, static_cast<int>(s), type, m);
    }
  };
  a.isend = [t](void* c, void* d, size_t s, void* m, void** r) {
    return t->isend(c, d, static_cast<int>(s), 0, m, r);
  };
  a.irecv = [t](void* c, int n, void** d, size_t* s, void** m, void** r) {
    std::vector<int> is(static_cast<size_t>(n));
    std::vector<int> tags(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) {
      is[static_cast<size_t>(i)] = static_cast<int>(s[i]);
    }
    return t->irecv(c, n, d, is.data(), tags.data(), m, r);
  };
}

inline std::unique_ptr<Api> makeApi(void* lib, int version) {
  std::string sym = "ncclNetPlugin_v" + std::to_string(version);
  void* p = dlsym(lib, sym.c_str());
  if (p == nullptr) {
    return nullptr;
  }
  auto a = std::make_unique<Api>();
  a->version = version;
  Api* ap = a.get();
  switch (version) {
  case 12:
  case 11: {
    // v12 is v11 with wider properties; the same calls through either table.
    auto setup = [&](auto* t) {
      fillCommon(*a, t);
      a->init = [t, ap] {
        return t->init(&ap->ctx, 1234, nullptr, bagua::net::testing::captureLogger, nullptr);
      };
      a->finalize = [t, ap] { return t->finalize(ap->ctx); };
      a->listen = [t, ap](int d, void* h, void** l) { return t->listen(ap->ctx, d, h, l); };
      a->connect = [t, ap](int d, void* h, void** s) {
        ncclNetDeviceHandle_v7_t* dev = nullptr;
        return t->connect(ap->ctx, d, h, s, &dev);
      };
      a->regMr = t->regMr;
      a->isend = [t](void* c, void* d, size_t s, void* m, void** r) {
        return t->isend(c, d, s, 0, m, nullptr, r);
      };
      a->irecv = [t](void* c, int n, void** d, size_t* s, void** m, void** r) {
        std::vector<int> tags(static_cast<size_t>(n), 0);
        *r = reinterpret_cast<void*>(0x1);  // NCCL's optional-completion marker
        return t->irecv(c, n, d, s, tags.data(), m, nullptr, r);
      };
    };
    if (version == 12) {
      setup(static_cast<ncclNet_v12_t*>(p));
    } else {
      setup(static_cast<ncclNet_v11_t*>(p));
    }
    break;
  }
  case 10: {
    auto* t = static_cast<ncclNet_v10_t*>(p);
    fillCommon(*a, t);
    a->init = [t] { return t->init(bagua::net::testing::captureLogger, nullptr); };
    a->listen = t->listen;
    a->connect = [t](int d, void* h, void** s) {
      ncclNetDeviceHandle_v7_t* dev = nullptr;
      ncclNetCommConfig_v10_t cfg{-1};
      return t->connect(d, &cfg, h, s, &dev);
    };
    a->regMr = t->regMr;
    a->isend = [t](void* c, void* d, size_t s, void* m, void** r) {
      return t->isend(c, d, s, 0, m, nullptr, r);
    };
    a->irecv = [t](void* c, int n, void** d, size_t* s, void** m, void** r) {
      std::vector<int> tags(static_cast<size_t>(n), 0);
      return t->irecv(c, n, d, s, tags.data(), m, nullptr, r);
    };
    break;
  }
  case 9: {
    auto* t = static_cast<ncclNet_v9_t*>(p);
    fillCommon(*a, t);
    a->init = [t] { return t->init(bagua::net::testing::captureLogger); };
    a->listen = t->listen;
    a->connect = [t](int d, void* h, void** s) {
      ncclNetDeviceHandle_v7_t* dev = nullptr;
      return t->connect(d, h, s, &dev);
    };
    a->regMr = t->regMr;
    a->isend = [t](void* c, void* d, size_t s, void* m, void** r) {
      return t->isend(c, d, s, 0, m, r);
    };
    a->irecv = [t](void* c, int n, void** d, size_t* s, void** m, void** r) {
      std::vector<int> tags(static_cast<size_t>(n), 0);
      return t->irecv(c, n, d, s, tags.data(), m, r);
    };
    break;
  }
  case 8:
  case 7: {
    auto setup = [&](auto* t) {
      fillCommon(*a, t);
      a->init = [t] { return t->init(bagua::net::testing::captureLogger); };
      a->listen = t->listen;
      a->connect = [t](int d, void* h, void** s) {
        ncclNetDeviceHandle_v7_t* dev = nullptr;
        return t->connect(d, h, s, &dev);
      };
      intSizes(*a, t);
    };
    if (version == 8) {
      setup(static_cast<ncclNet_v8_t*>(p));
    } else {
      setup(static_cast<ncclNet_v7_t*>(p));
    }
    break;
  }
  case 6: {
    auto* t = static_cast<ncclNet_v6_t*>(p);
    fillCommon(*a, t);
    a->init = [t] { return t->init(bagua::net::testing::captureLogger); };
    a->listen = t->listen;
    a->connect = t->connect;
    intSizes(*a, t);
    break;
  }
  default:
    return nullptr;
  }
#ifdef BAGUA_TEST_WITH_LSAN
  // base keeps its logger state and base catalogue in intentionally leaked heap singletons;
  // each dlopen of the plugin creates fresh ones inside init() and dlclose drops the only
  // pointers to them (a few KiB per reload). That is base's design, not a plugin leak, so the
  // leak checker ignores allocations made during init().
  auto init = a->init;
  a->init = [init] {
    __lsan::ScopedDisabler noLeakCheck;
    return init();
  };
#endif
  return a;
}

// dlopen/dlclose around a test; environment set before loading (the plugin reads it at init).
class Loaded {
 public:
  explicit Loaded(std::initializer_list<std::pair<std::string, std::string>> env) {
    for (auto& [k, v] : env) {
      setenv(k.c_str(), v.c_str(), 1);
      keys_.push_back(k);
    }
    lib_ = dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  ~Loaded() {
    if (lib_ != nullptr) {
      dlclose(lib_);
    }
    for (const std::string& k : keys_) {
      unsetenv(k.c_str());
    }
  }
  Loaded(const Loaded&) = delete;
  Loaded& operator=(const Loaded&) = delete;
  void* lib() const { return lib_; }

 private:
  void* lib_ = nullptr;
  std::vector<std::string> keys_;
};

// A connected send/recv pair through the plugin API.
struct Conn {
  void* send = nullptr;
  void* recv = nullptr;
};

inline Conn connectPair(Api& api) {
  Conn c;
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listenComm = nullptr;
  EXPECT_EQ(api.listen(0, handle, &listenComm), ncclSuccess);
  if (listenComm == nullptr) {
    return c;
  }
  bool ok = pollFor(10, [&] {
    if (c.send == nullptr) {
      EXPECT_EQ(api.connect(0, handle, &c.send), ncclSuccess);
    }
    if (c.recv == nullptr) {
      EXPECT_EQ(api.accept(listenComm, &c.recv), ncclSuccess);
    }
    return (c.send != nullptr && c.recv != nullptr) || ::testing::Test::HasFailure();
  });
  EXPECT_TRUE(ok) << "connect/accept did not finish";
  EXPECT_EQ(api.closeListen(listenComm), ncclSuccess);  // NCCL closes it right after accept
  return c;
}

inline ncclResult_t waitTest(Api& api, void* req, int* size, double seconds = 30) {
  int done = 0;
  ncclResult_t r = ncclSuccess;
  bool finished = pollFor(seconds, [&] {
    r = api.test(req, &done, size);
    return done != 0 || r != ncclSuccess;
  });
  return finished ? r : ncclInProgress;
}

// NCCL-style: isend/irecv retried while they return a NULL request.
inline void* postSend(Api& api, void* comm, void* data, size_t size, void* mh) {
  void* req = nullptr;
  pollFor(10, [&] {
    EXPECT_EQ(api.isend(comm, data, size, mh, &req), ncclSuccess);
    return req != nullptr || ::testing::Test::HasFailure();
  });
  return req;
}

inline void transfer(Api& api, Conn& c, const std::vector<size_t>& sizes, size_t window) {
  std::vector<std::vector<uint8_t>> sbuf(sizes.size()), rbuf(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    sbuf[i].resize(sizes[i]);
    fillPattern(sbuf[i], i);
    rbuf[i].assign(sizes[i] + 8, 0xee);
  }
  void* smh = nullptr;
  void* rmh = nullptr;
  ASSERT_EQ(api.regMr(c.send, nullptr, 0, NCCL_PTR_HOST, &smh), ncclSuccess);
  ASSERT_EQ(api.regMr(c.recv, nullptr, 0, NCCL_PTR_HOST, &rmh), ncclSuccess);
  std::thread sender([&] {
    std::vector<void*> inflight;
    size_t next = 0;
    for (size_t done = 0; done < sizes.size();) {
      while (next < sizes.size() && inflight.size() < window) {
        void* req = nullptr;
        ASSERT_EQ(api.isend(c.send, sbuf[next].data(), sizes[next], smh, &req), ncclSuccess);
        if (req == nullptr) {
          break;
        }
        inflight.push_back(req);
        ++next;
      }
      int size = -1;
      ASSERT_EQ(waitTest(api, inflight.front(), &size), ncclSuccess);
      EXPECT_EQ(static_cast<size_t>(size), sizes[done]);
      inflight.erase(inflight.begin());
      ++done;
    }
  });
  std::vector<void*> inflight;
  size_t next = 0;
  for (size_t done = 0; done < sizes.size() && !::testing::Test::HasFatalFailure();) {
    while (next < sizes.size() && inflight.size() < window) {
      void* req = nullptr;
      void* data = rbuf[next].data();
      size_t cap = rbuf[next].size();
      ASSERT_EQ(api.irecv(c.recv, 1, &data, &cap, &rmh, &req), ncclSuccess);
      if (req == nullptr) {
        break;
      }
      inflight.push_back(req);
      ++next;
    }
    int size = -1;
    ncclResult_t r = done % 3 == 2 ? waitTest(api, inflight.front(), nullptr)
                                   : waitTest(api, inflight.front(), &size);
    ASSERT_EQ(r, ncclSuccess) << "message " << done;
    if (size >= 0) {
      EXPECT_EQ(static_cast<size_t>(size), sizes[done]);
    }
    EXPECT_EQ(firstMismatch(rbuf[done].data(), sizes[done], done), -1) << "message " << done;
    EXPECT_EQ(rbuf[done][sizes[done]], 0xee) << "wrote past the end of message " << done;
    inflight.erase(inflight.begin());
    ++done;
  }
  sender.join();
  EXPECT_EQ(api.deregMr(c.send, smh), ncclSuccess);
  EXPECT_EQ(api.deregMr(c.recv, rmh), ncclSuccess);
}

inline void closePair(Api& api, Conn& c) {
  if (c.send != nullptr) {
    EXPECT_EQ(api.closeSend(c.send), ncclSuccess);
  }
  if (c.recv != nullptr) {
    EXPECT_EQ(api.closeRecv(c.recv), ncclSuccess);
  }
  c = Conn();
}

}  // namespace bagua::net::plugintest
