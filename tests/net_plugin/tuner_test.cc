// The tuner exported from libnccl-net.so, driven the way NCCL drives it: dlopen, dlsym
// ncclTunerPlugin_vN, init, getCollInfo on a cost table, finalize. Each case runs in a fresh
// child process, because the plugin reads its environment once per load.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"
#include "nccl_tuner_abi.h"
#include "net_test_util.h"

namespace {

using bagua::net::testing::pluginPath;

constexpr int kAlgos = 7;
constexpr int kProtos = 3;
constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

// The plugin logs into the shared capture (net_test_util.h); each child has its own copy.
constexpr ncclDebugLogger_t logger = bagua::net::testing::captureLogger;

// What one getCollInfo call did.
struct Call {
  std::vector<float> table;
  int nChannels = 0;
  int rc = 0;
};

// A table where NCCL's model prefers LL (as it does on a 400 Gbps port): ring LL cheapest, then
// ring Simple, tree Simple; LL128 and the other algorithms unavailable.
std::vector<float> llFavouredTable() {
  std::vector<float> t(kAlgos * kProtos, NCCL_ALGO_PROTO_IGNORE);
  t[1 * kProtos + NCCL_PROTO_LL] = 10.0f;      // ring LL
  t[1 * kProtos + NCCL_PROTO_SIMPLE] = 20.0f;  // ring Simple
  t[0 * kProtos + NCCL_PROTO_LL] = 15.0f;      // tree LL
  t[0 * kProtos + NCCL_PROTO_SIMPLE] = 30.0f;  // tree Simple
  return t;
}

// Runs `body` in a child with `env` set and the plugin freshly loaded; returns what it printed
// (or "CHILD FAILED ..." when it crashed or reported an error).
std::string inChild(const std::vector<std::pair<std::string, std::string>>& env,
                    const std::function<std::string(void* lib)>& body) {
  int fds[2];
  if (pipe(fds) != 0) {
    return "CHILD FAILED: pipe";
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    // Only the case's own settings: nothing inherited from the caller's environment.
    for (const char* k :
         {"BAGUA_NET_TUNER", "BAGUA_NET_TUNER_LL_MAX", "BAGUA_NET_TUNER_CHANNEL_BYTES",
          "BAGUA_NET_TUNER_MIN_CHANNELS", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"}) {
      unsetenv(k);
    }
    for (const auto& [k, v] : env) {
      setenv(k.c_str(), v.c_str(), 1);
    }
    std::string out;
    void* lib = dlopen(pluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    out = lib == nullptr ? std::string("CHILD FAILED: dlopen: ") + dlerror() : body(lib);
    out += "\nLOG:\n" + bagua::net::testing::logText();
    ssize_t w = write(fds[1], out.data(), out.size());
    close(fds[1]);
    _exit(w == static_cast<ssize_t>(out.size()) ? 0 : 3);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "CHILD FAILED: status " + std::to_string(status) + "\n" + out;
  }
  return out;
}

std::string describe(const Call& c) {
  std::ostringstream s;
  s << "rc=" << c.rc << " ch=" << c.nChannels << " table=";
  for (float v : c.table) {
    s << v << ",";
  }
  return s.str();
}

// Initialises the v5 tuner for (nRanks, nNodes), runs each (collType, bytes, table) call and
// prints one describe() line per call; "INIT rc=N" when init fails.
std::string runV5(void* lib, size_t nRanks, size_t nNodes,
                  const std::vector<std::pair<int, size_t>>& calls,
                  std::vector<float> (*makeTable)() = llFavouredTable) {
  auto* t = static_cast<ncclTuner_v5_t*>(dlsym(lib, "ncclTunerPlugin_v5"));
  if (t == nullptr) {
    return "CHILD FAILED: no ncclTunerPlugin_v5";
  }
  void* ctx = nullptr;
  ncclTunerConstants_v5_t constants{};
  ncclNvlDomainInfo_v5_t nvl{1, 1, 1};
  ncclResult_t rc = t->init(&ctx, 42, nRanks, nNodes, logger, &nvl, &constants);
  if (rc != ncclSuccess) {
    return "INIT rc=" + std::to_string(rc);
  }
  std::string out = std::string("name=") + t->name + "\n";
  for (const auto& [coll, bytes] : calls) {
    Call c;
    c.table = makeTable();
    c.rc =
        t->getCollInfo(ctx, static_cast<ncclFunc_t>(coll), bytes, 1,
                       reinterpret_cast<float**>(c.table.data()), kAlgos, kProtos, 0, &c.nChannels);
    out += describe(c) + "\n";
  }
  if (t->finalize(ctx) != ncclSuccess) {
    out += "FINALIZE FAILED\n";
  }
  return out;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) {
    v.push_back(l);
  }
  return v;
}

std::string expected(const std::vector<float>& table, int nChannels) {
  Call c;
  c.table = table;
  c.nChannels = nChannels;
  return describe(c);
}

std::vector<float> withoutLl(std::vector<float> t) {
  for (int a = 0; a < kAlgos; ++a) {
    t[static_cast<size_t>(a * kProtos + NCCL_PROTO_LL)] = NCCL_ALGO_PROTO_IGNORE;
  }
  return t;
}

class Tuner : public ::testing::Test {
 protected:
  void SetUp() override {
    if (pluginPath().empty()) {
      GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set (run through meson test)";
    }
  }
};

TEST_F(Tuner, AcrossNodesLlOnlyForSmallAndChannelsCappedForMidSizes) {
  std::string out = inChild({}, [](void* lib) {
    return runV5(lib, 16, 2,
                 {{ncclFuncAllReduce, 64 * kKiB},
                  {ncclFuncAllReduce, 128 * kKiB},
                  {ncclFuncAllReduce, 128 * kKiB + 1},
                  {ncclFuncAllReduce, 1 * kMiB},
                  {ncclFuncAllGather, 5 * kMiB},
                  {ncclFuncAllReduce, 64 * kMiB},
                  {ncclFuncAllReduce, 1024 * kMiB},
                  {ncclFuncSendRecv, 1 * kMiB}});
  });
  std::vector<std::string> l = lines(out);
  ASSERT_GE(l.size(), 9u) << out;
  EXPECT_EQ(l[0], "name=Bagua");
  EXPECT_EQ(l[1], expected(llFavouredTable(), 0)) << "64 KiB: NCCL's choice stands";
  EXPECT_EQ(l[2], expected(llFavouredTable(), 0)) << "128 KiB is the LL limit, inclusive";
  EXPECT_EQ(l[3], expected(withoutLl(llFavouredTable()), 2));
  EXPECT_EQ(l[4], expected(withoutLl(llFavouredTable()), 2)) << "1 MiB: Simple, 2 channels";
  EXPECT_EQ(l[5], expected(withoutLl(llFavouredTable()), 3)) << "5 MiB: ceil(5/2) channels";
  EXPECT_EQ(l[6], expected(withoutLl(llFavouredTable()), 32));
  EXPECT_EQ(l[7], expected(withoutLl(llFavouredTable()), 0)) << "huge: NCCL's channel count";
  EXPECT_EQ(l[8], expected(llFavouredTable(), 0)) << "send/recv is left alone";
  EXPECT_NE(out.find("TUNER/Bagua active for 16 ranks on 2 nodes"), std::string::npos) << out;
}

TEST_F(Tuner, OneNodeIsLeftAloneUnlessNcclIsForcedOntoTheNetwork) {
  auto call = [](void* lib) { return runV5(lib, 2, 1, {{ncclFuncAllReduce, 1 * kMiB}}); };
  std::string plain = inChild({}, call);
  std::vector<std::string> l = lines(plain);
  ASSERT_GE(l.size(), 2u) << plain;
  EXPECT_EQ(l[1], expected(llFavouredTable(), 0));
  EXPECT_NE(plain.find("inactive for 2 ranks on 1 nodes"), std::string::npos) << plain;

  std::string onlyP2p = inChild({{"NCCL_P2P_DISABLE", "1"}}, call);
  l = lines(onlyP2p);
  ASSERT_GE(l.size(), 2u) << onlyP2p;
  EXPECT_EQ(l[1], expected(llFavouredTable(), 0)) << "SHM still carries the traffic";

  std::string forced = inChild({{"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"}}, call);
  l = lines(forced);
  ASSERT_GE(l.size(), 2u) << forced;
  EXPECT_EQ(l[1], expected(withoutLl(llFavouredTable()), 2));

  std::string zero = inChild({{"NCCL_P2P_DISABLE", "0"}, {"NCCL_SHM_DISABLE", "1"}}, call);
  l = lines(zero);
  ASSERT_GE(l.size(), 2u) << zero;
  EXPECT_EQ(l[1], expected(llFavouredTable(), 0)) << "0 means enabled, as NCCL reads it";
}

TEST_F(Tuner, KnobsChangeThePolicyAndOffDisablesIt) {
  auto call = [](void* lib) {
    return runV5(lib, 8, 4, {{ncclFuncAllReduce, 1 * kMiB}, {ncclFuncAllReduce, 16 * kMiB}});
  };
  std::string off = inChild({{"BAGUA_NET_TUNER", "off"}}, call);
  std::vector<std::string> l = lines(off);
  ASSERT_GE(l.size(), 3u) << off;
  EXPECT_EQ(l[1], expected(llFavouredTable(), 0));
  EXPECT_EQ(l[2], expected(llFavouredTable(), 0));

  std::string knobs = inChild({{"BAGUA_NET_TUNER_LL_MAX", "1M"},
                               {"BAGUA_NET_TUNER_CHANNEL_BYTES", "4M"},
                               {"BAGUA_NET_TUNER_MIN_CHANNELS", "1"}},
                              call);
  l = lines(knobs);
  ASSERT_GE(l.size(), 3u) << knobs;
  EXPECT_EQ(l[1], expected(llFavouredTable(), 0)) << "1 MiB is within the raised LL limit";
  EXPECT_EQ(l[2], expected(withoutLl(llFavouredTable()), 4)) << "16 MiB / 4 MiB";

  std::string noCap = inChild({{"BAGUA_NET_TUNER_CHANNEL_BYTES", "0"}}, call);
  l = lines(noCap);
  ASSERT_GE(l.size(), 3u) << noCap;
  EXPECT_EQ(l[1], expected(withoutLl(llFavouredTable()), 0));
}

TEST_F(Tuner, OnlyLlAllowedIsKept) {
  std::string out = inChild({}, [](void* lib) {
    return runV5(lib, 4, 2, {{ncclFuncAllReduce, 8 * kMiB}}, [] {
      std::vector<float> t(kAlgos * kProtos, NCCL_ALGO_PROTO_IGNORE);
      t[1 * kProtos + NCCL_PROTO_LL] = 10.0f;  // what NCCL_PROTO=LL leaves
      return t;
    });
  });
  std::vector<std::string> l = lines(out);
  ASSERT_GE(l.size(), 2u) << out;
  std::vector<float> want(kAlgos * kProtos, NCCL_ALGO_PROTO_IGNORE);
  want[1 * kProtos + NCCL_PROTO_LL] = 10.0f;
  EXPECT_EQ(l[1], expected(want, 4));
}

TEST_F(Tuner, BadValueFailsInitNamingTheKeyAndChoices) {
  std::string out = inChild({{"BAGUA_NET_TUNER", "sometimes"}}, [](void* lib) {
    return runV5(lib, 4, 2, {{ncclFuncAllReduce, 8 * kMiB}});
  });
  EXPECT_EQ(lines(out).at(0), "INIT rc=" + std::to_string(ncclInvalidUsage)) << out;
  EXPECT_NE(out.find("BAGUA_NET_TUNER"), std::string::npos) << out;
  EXPECT_NE(out.find("sometimes"), std::string::npos) << out;
  EXPECT_NE(out.find("auto"), std::string::npos) << out;
  EXPECT_NE(out.find("off"), std::string::npos) << out;
}

TEST_F(Tuner, OlderTablesV4AndV3ApplyTheSamePolicy) {
  std::string out = inChild({}, [](void* lib) {
    std::string r;
    auto* v4 = static_cast<ncclTuner_v4_t*>(dlsym(lib, "ncclTunerPlugin_v4"));
    auto* v3 = static_cast<ncclTuner_v3_t*>(dlsym(lib, "ncclTunerPlugin_v3"));
    if (v4 == nullptr || v3 == nullptr) {
      return std::string("CHILD FAILED: missing v4/v3");
    }
    void* ctx = nullptr;
    Call c;
    c.table = llFavouredTable();
    c.rc = v4->init(8, 2, logger, &ctx);
    if (c.rc == ncclSuccess) {
      c.rc = v4->getCollInfo(ctx, ncclFuncAllReduce, 1 * kMiB, 1,
                             reinterpret_cast<float**>(c.table.data()), kAlgos, kProtos, 0,
                             &c.nChannels);
      c.rc = c.rc != ncclSuccess ? c.rc : v4->destroy(ctx);
    }
    r += describe(c) + "\n";
    Call d;
    d.table = llFavouredTable();
    d.rc = v3->init(8, 2, logger, &ctx);
    if (d.rc == ncclSuccess) {
      d.rc =
          v3->getCollInfo(ctx, ncclFuncReduceScatter, 1 * kMiB, 1,
                          reinterpret_cast<float**>(d.table.data()), kAlgos, kProtos, &d.nChannels);
      d.rc = d.rc != ncclSuccess ? d.rc : v3->destroy(ctx);
    }
    r += describe(d) + "\n";
    return r;
  });
  std::vector<std::string> l = lines(out);
  ASSERT_GE(l.size(), 2u) << out;
  EXPECT_EQ(l[0], expected(withoutLl(llFavouredTable()), 2)) << out;
  EXPECT_EQ(l[1], expected(withoutLl(llFavouredTable()), 2)) << out;
}

// NCCL 2.30's table: v5's calls plus an optional getChunkSize, which we leave NULL (NCCL keeps
// its chunk size). Same policy as v5.
TEST_F(Tuner, V6TableAppliesThePolicyAndLeavesChunkSizeToNccl) {
  std::string out = inChild({}, [](void* lib) {
    auto* v6 = static_cast<ncclTuner_v6_t*>(dlsym(lib, "ncclTunerPlugin_v6"));
    auto* v5 = static_cast<ncclTuner_v5_t*>(dlsym(lib, "ncclTunerPlugin_v5"));
    if (v6 == nullptr || v5 == nullptr) {
      return std::string("CHILD FAILED: missing v6/v5");
    }
    std::string r = std::string("name=") + v6->name +
                    " chunk=" + (v6->getChunkSize == nullptr ? "null" : "set") + "\n";
    void* ctx = nullptr;
    ncclTunerConstants_v6_t constants{};
    ncclNvlDomainInfo_v6_t nvl{1, 1, 1};
    Call c;
    c.table = llFavouredTable();
    c.rc = v6->init(&ctx, 7, 8, 2, logger, &nvl, &constants);
    if (c.rc == ncclSuccess) {
      c.rc = v6->getCollInfo(ctx, ncclFuncAllReduce, 1 * kMiB, 1,
                             reinterpret_cast<float**>(c.table.data()), kAlgos, kProtos, 0,
                             &c.nChannels);
      c.rc = c.rc != ncclSuccess ? c.rc : v6->finalize(ctx);
    }
    r += describe(c) + "\n";
    r += runV5(lib, 8, 2, {{ncclFuncAllReduce, 1 * kMiB}});
    return r;
  });
  std::vector<std::string> l = lines(out);
  ASSERT_GE(l.size(), 4u) << out;
  EXPECT_EQ(l[0], "name=Bagua chunk=null") << out;
  EXPECT_EQ(l[1], expected(withoutLl(llFavouredTable()), 2)) << out;
  EXPECT_EQ(l[3], l[1]) << "v6 and v5 must decide alike:\n" << out;
}

}  // namespace
