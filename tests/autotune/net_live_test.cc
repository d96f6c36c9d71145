// NetPluginLive against the real libnccl-net.so: not found before the module is loaded, found
// (without loading anything itself) once it is, and its settings reach the plugin's own copy of
// the engine (read back through the plugin's exported getter, looked up independently).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "bagua/autotune/transport_knobs.h"
#include "bagua/base/params.h"
#include "bagua/net/live_abi.h"

namespace bagua::autotune {
namespace {

TEST(NetPluginLive, FindsTheLoadedBaguaNetPluginAndSetsIt) {
  const std::string pathText = bagua::processEnv("BAGUA_NET_PLUGIN_PATH").value_or("");
  const char* path = pathText.c_str();
  if (pathText.empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set (run through meson test)";
  }
  Result<std::unique_ptr<NetPluginLive>> none = NetPluginLive::find();
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("not the loaded NCCL net plugin"), std::string::npos)
      << none.status().toString();

  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // what NCCL does
  ASSERT_NE(h, nullptr) << dlerror();
  auto get = reinterpret_cast<baguaNetGetLive_v1_t>(dlsym(h, BAGUA_NET_LIVE_GET_SYMBOL));
  ASSERT_NE(get, nullptr);
  {
    Result<std::unique_ptr<NetPluginLive>> live = NetPluginLive::find();
    ASSERT_TRUE(live.isOk()) << live.status().toString();
    EXPECT_NE((*live)->path().find("libnccl-net"), std::string::npos);
    ASSERT_TRUE((*live)->set({3, 32 << 10, 256 << 10}).isOk());
    int a = 0;
    uint64_t lo = 0, hi = 0;
    ASSERT_EQ(get(&a, &lo, &hi), 0);
    EXPECT_EQ(a, 3);
    EXPECT_EQ(lo, 32u << 10);
    EXPECT_EQ(hi, 256u << 10);
    Result<NetPluginLive::Values> back = (*live)->get();
    ASSERT_TRUE(back.isOk());
    EXPECT_EQ(back->activeStreams, 3);
    // The plugin validates: min above max, too many streams.
    Status bad = (*live)->set({3, 1 << 20, 64 << 10});
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.toString();
    EXPECT_FALSE((*live)->set({65, 0, 0}).isOk());
    ASSERT_EQ(get(&a, &lo, &hi), 0);
    EXPECT_EQ(a, 3) << "a refused setting must leave the old one";
    ASSERT_TRUE((*live)->set({}).isOk());
    ASSERT_EQ(get(&a, &lo, &hi), 0);
    EXPECT_EQ(a, 0);
  }
  // The helper's handle is gone; NCCL's (ours here) still holds the module.
  EXPECT_NE(dlopen(path, RTLD_NOLOAD | RTLD_LAZY), nullptr);
  dlclose(h);  // the NOLOAD reference above
  dlclose(h);
}

}  // namespace
}  // namespace bagua::autotune
