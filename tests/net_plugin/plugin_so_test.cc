// The built libnccl-net.so as a shared object: it exports only NCCL's net and tuner plugin
// symbols, NCCL_NET_PLUGIN=bagua finds it under its alias, its live-settings entry point and the
// benchmark's schedule entry (plugin_api.h loads it the way NCCL does; the path comes from meson
// in BAGUA_NET_PLUGIN_PATH).
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
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"
#include "bagua/net/live_abi.h"
#include "bagua_config.h"  // BAGUA_VERSION: the init line names the build
#include "bench_abi.h"
#include "nccl_net_abi.h"
#include "net_test_util.h"
#include "plugin_api.h"

namespace {

using namespace bagua::net::plugintest;

TEST(PluginSo, ExportsOnlyNcclNetAndTunerPluginSymbols) {
  std::string path = pluginPath();
  if (path.empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set (run through meson test)";
  }
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), sizeof(Elf64_Ehdr));
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof(eh));
  ASSERT_EQ(std::memcmp(eh.e_ident, ELFMAG, SELFMAG), 0);
  ASSERT_EQ(eh.e_ident[EI_CLASS], ELFCLASS64);
  ASSERT_LE(eh.e_shoff + eh.e_shnum * sizeof(Elf64_Shdr), bytes.size());
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, bytes.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
    return sh;
  };
  std::vector<std::string> exported;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_DYNSYM) {
      continue;
    }
    Elf64_Shdr strtab = section(sh.sh_link);
    for (size_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym;
      std::memcpy(&sym, bytes.data() + sh.sh_offset + k * sizeof(Elf64_Sym), sizeof(sym));
      int bind = ELF64_ST_BIND(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF ||
          (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE)) {
        continue;
      }
      exported.emplace_back(bytes.data() + strtab.sh_offset + sym.st_name);
    }
  }
  std::sort(exported.begin(), exported.end());
  std::vector<std::string> want;
  for (int v = 6; v <= 12; ++v) {
    want.push_back("ncclNetPlugin_v" + std::to_string(v));
  }
  for (int v = 3; v <= 6; ++v) {
    want.push_back("ncclTunerPlugin_v" + std::to_string(v));
  }
  want.push_back("baguaNetGetLive_v1");  // the live-settings entry (bagua/net/live_abi.h)
  want.push_back("baguaNetSetLive_v1");
  want.push_back("baguaNetBenchSchedule_v1");  // the benchmark's schedule entry (bench_abi.h)
  std::sort(want.begin(), want.end());
  EXPECT_EQ(exported, want);
}

TEST(PluginSo, AliasForNcclNetPluginBagua) {
  std::string path = pluginPath();
  if (path.empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  std::string alias = path.substr(0, path.rfind('/') + 1) + "libnccl-net-bagua.so";
  void* lib = dlopen(alias.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  EXPECT_NE(dlsym(lib, "ncclNetPlugin_v11"), nullptr);
  dlclose(lib);
}

// Drives the live-settings entry of a freshly loaded module and returns what it answered.
std::string liveEntryTrace(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return std::string("dlopen: ") + dlerror();
  }
  auto set = reinterpret_cast<baguaNetSetLive_v1_t>(dlsym(lib, BAGUA_NET_LIVE_SET_SYMBOL));
  auto get = reinterpret_cast<baguaNetGetLive_v1_t>(dlsym(lib, BAGUA_NET_LIVE_GET_SYMBOL));
  if (set == nullptr || get == nullptr) {
    return "live-settings symbols missing";
  }
  int active = -1;
  uint64_t lo = 1, hi = 1;
  auto read = [&] {
    int rc = get(&active, &lo, &hi);
    return std::to_string(rc) + " " + std::to_string(active) + " " + std::to_string(lo) + " " +
           std::to_string(hi);
  };
  std::string t = "set " + std::to_string(set(5, 8 << 10, 512 << 10));
  t += " | get " + read();
  t += " | refused";
  // Too many streams, negative, min above max, a bound above 1 GiB, null pointers.
  for (int rc :
       {set(65, 0, 0), set(-1, 0, 0), set(2, 1 << 20, 64 << 10), set(2, 0, (uint64_t{1} << 30) + 1),
        get(nullptr, &lo, &hi), get(&active, &lo, nullptr)}) {
    t += " " + std::to_string(rc);
  }
  t += " | kept " + read();
  t += " | cleared " + std::to_string(set(0, 0, 0));
  t += " " + read();
  dlclose(lib);
  return t;
}

// Runs `trace` in a child process and returns what it wrote. A refused call logs a warning before
// init, and the first line the log formats on a thread pins the module to that thread (the
// thread's name is cached thread_local), which would keep PluginReload from seeing it unload.
std::string inChild(const std::function<std::string()>& trace) {
  int fds[2];
  if (pipe(fds) != 0) {
    return "pipe failed";
  }
  pid_t pid = fork();
  if (pid < 0) {
    return "fork failed";
  }
  if (pid == 0) {
    close(fds[0]);
    std::string t = trace();
    ssize_t w = write(fds[1], t.data(), t.size());
    _exit(w == static_cast<ssize_t>(t.size()) ? 0 : 3);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    out += " (child status " + std::to_string(status) + ")";
  }
  return out;
}

// The live-settings entry through the ABI layer: values round-trip, refused values return
// ncclInvalidUsage (5) and leave the old setting (in a child process: a refusal logs a warning).
TEST(PluginSo, LiveSettingsEntry) {
  std::string path = pluginPath();
  if (path.empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  EXPECT_EQ(inChild([&] { return liveEntryTrace(path); }),
            "set 0 | get 0 5 8192 524288 | refused 5 5 5 5 5 5 | kept 0 5 8192 524288 | "
            "cleared 0 0 0 0 0");
}

// The benchmark's schedule entry (bench_abi.h): a bad value refused; round-robin accepted before
// init, logged by the init it applies to, refused while initialised; a round-robin module moves
// every byte; accepted again after the last finalize.
TEST(PluginSo, BenchScheduleEntry) {
  const std::string path = pluginPath();
  if (path.empty()) {
    GTEST_SKIP() << "BAGUA_NET_PLUGIN_PATH not set";
  }
  const std::string out = inChild([&]() -> std::string {
    setenv("NCCL_SOCKET_IFNAME", "=lo", 1);
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return std::string("dlopen: ") + dlerror();
    }
    auto set =
        reinterpret_cast<baguaNetBenchSchedule_v1_t>(dlsym(lib, BAGUA_NET_BENCH_SCHEDULE_SYMBOL));
    std::unique_ptr<Api> api = makeApi(lib, 11);
    if (set == nullptr || api == nullptr) {
      return "entry or table missing";
    }
    std::string t = "bad " + std::to_string(set(2));
    t += " | rr " + std::to_string(set(1));
    t += " | init " + std::to_string(api->init());
    t += std::string(" | ") + (logContains("chunk schedule: round-robin") ? "logged" : "silent");
    t += " | initialised " + std::to_string(set(0));
    Conn c = connectPair(*api);
    if (c.send != nullptr && c.recv != nullptr) {
      transfer(*api, c, {10, 500000, 3 << 20}, 2);
      closePair(*api, c);
    }
    t += ::testing::Test::HasFailure() ? " | transfer failed" : " | moved";
    t += " | finalize " + std::to_string(api->finalize());
    t += " | after " + std::to_string(set(0));
    return t;
  });
  EXPECT_EQ(out, "bad 5 | rr 0 | init 0 | logged | initialised 5 | moved | finalize 0 | after 0");
}

}  // namespace
