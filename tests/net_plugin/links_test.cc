// Bagua-Net across links with a line rate: two network namespaces joined by htb-shaped veth pairs
// (tools/net_bench/shaped_links.sh), one endpoint process in each (bagua-net-bench --netns, which
// loads the built plugin in both, as two hosts would). Skips, saying why, where namespaces cannot
// be made (not root).
//
// Margins. The targets (bench/RESULTS.md has the figures) are goodput >= 0.95 R on one
// link for messages >= 8 MiB, >= 0.85 R under per-flow caps of R/8, >= 1.8 R over two links of R
// as one device and >= 1.125 R over links of R and R/4 (the test asserts 1.6 R, and 1.0 R: more
// than the 0.956 R one link can carry). A shaper caps from above; a loaded machine can only pull a
// figure down (the sender or receiver does not get the CPU to fill the link). On the 2-core VM with
// five builds running (load average 10-17) Bagua-Net measured 0.88-0.94 R on one link of 4 Gbit/s
// (MTU 1500) and 0.93-0.94 R under per-flow caps, but 0.48 R at load average 20: the test's links
// are 1 Gbit/s (see kR), it asserts 0.80 R and 0.75 R, and takes the best of up to three runs of a
// case. The per-flow cap on one socket is asserted tightly (R/8 + 5%): no load can lift a figure
// above a shaper. Sanitizer builds (BAGUA_TEST_SANITIZED=1) run every case but assert no rate
// floor: their instrumented copies cannot fill a link; the caps still hold and every transfer must
// finish.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bagua/base/params.h"

namespace {

// Line rate of the links, bits/s. The bench figures use 4 Gbit/s; the CI machine is a 2-core VM
// shared with other jobs, where 4 Gbit/s needs most of both cores (Bagua-Net measured 0.48 R
// there at load average 20), so the test's links are 1 Gbit/s.
constexpr double kR = 1e9;

std::string env(const char* key) {
  return bagua::processEnv(key).value_or("");
}

// Runs a shell command, capturing its output; returns the exit status.
int run(const std::string& cmd, std::string* output) {
  std::string file = "/tmp/bagua-links-test-" + std::to_string(getpid()) + ".out";
  int rc = std::system((cmd + " > " + file + " 2>&1").c_str());
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  *output = ss.str();
  std::remove(file.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// Two namespaces bl<pid>-a and bl<pid>-b for the life of the object.
class ShapedLinks {
 public:
  explicit ShapedLinks(const std::string& links) : name_("bl" + std::to_string(getpid())) {
    std::string out;
    run(script() + " sweep", &out);  // namespaces left by killed runs of this test
    run(script() + " down " + name_, &out);
    int rc = run(script() + " up " + name_ + " " + links, &out);
    ok_ = rc == 0;
    if (!ok_) {
      ADD_FAILURE() << "shaped_links.sh up " << links << " failed:\n" << out;
    }
  }
  ~ShapedLinks() {
    std::string out;
    run(script() + " down " + name_, &out);
  }
  ShapedLinks(const ShapedLinks&) = delete;
  ShapedLinks& operator=(const ShapedLinks&) = delete;

  bool ok() const { return ok_; }
  std::string netns() const { return name_ + "-a," + name_ + "-b"; }
  static std::string script() { return env("BAGUA_SHAPED_LINKS"); }

 private:
  std::string name_;
  bool ok_ = false;
};

struct Row {
  std::string kase;
  uint64_t size = 0;
  double gbps = 0;
  std::map<std::string, uint64_t> linkBytes;
};

// One bench run; the rows of its JSON file (one result per line).
std::vector<Row> bench(const ShapedLinks& links, const std::string& cases, const std::string& sizes,
                       const std::string& envPrefix = "") {
  std::string json = "/tmp/bagua-links-test-" + std::to_string(getpid()) + ".json";
  std::string cmd = envPrefix + " " + env("BAGUA_NET_BENCH") + " --netns " + links.netns() +
                    " --cases " + cases + " --sizes " + sizes +
                    " --seconds 1 --line-rate 1gbit --json " + json;
  std::string out;
  int rc = run(cmd, &out);
  std::printf("%s\n%s", cmd.c_str(), out.c_str());
  EXPECT_EQ(rc, 0) << out;
  std::vector<Row> rows;
  std::ifstream f(json);
  std::string line;
  while (std::getline(f, line)) {
    Row r;
    char kase[64] = {};
    unsigned long long size = 0;
    if (std::sscanf(line.c_str(), " {\"case\": \"%63[^\"]\", \"size\": %llu, \"gbps\": %lf", kase,
                    &size, &r.gbps) != 3) {
      continue;
    }
    r.kase = kase;
    r.size = size;
    size_t lb = line.find("\"link_bytes\": {");
    if (lb != std::string::npos) {
      std::istringstream in(line.substr(lb + 15));
      std::string item;
      while (std::getline(in, item, ',')) {
        char name[32] = {};
        unsigned long long bytes = 0;
        if (std::sscanf(item.c_str(), " \"%31[^\"]\": %llu", name, &bytes) == 2) {
          r.linkBytes[name] = bytes;
        }
      }
    }
    rows.push_back(r);
  }
  std::remove(json.c_str());
  return rows;
}

// Floors are asserted only in uninstrumented builds (see the top of the file).
double floorOrZero(double floor) {
  static const bool sanitized = env("BAGUA_TEST_SANITIZED") == "1";
  if (sanitized) {
    std::printf("sanitizer build: rate floor %.2f R not asserted (instrumented code)\n", floor);
    return 0.0;
  }
  return floor;
}

// Goodput (fraction of R) of `kase` at `size`, the best of up to `attempts` runs, stopping once
// it reaches `enough`.
double bestOf(const ShapedLinks& links, const std::string& kase, const std::string& size,
              double enough, const std::string& envPrefix = "", int attempts = 3) {
  double best = 0;
  for (int i = 0; i < attempts && (i == 0 || best < enough); ++i) {
    for (const Row& r : bench(links, kase, size, envPrefix)) {
      best = std::max(best, r.gbps * 1e9 / kR);
    }
  }
  return best;
}

class Links : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ShapedLinks::script().empty() || env("BAGUA_NET_BENCH").empty()) {
      GTEST_SKIP() << "run under meson test (BAGUA_SHAPED_LINKS and BAGUA_NET_BENCH unset)";
    }
    std::string out;
    if (run(ShapedLinks::script() + " check", &out) != 0) {
      std::printf("SKIP: network namespaces unavailable here: %s\n", out.c_str());
      GTEST_SKIP() << "network namespaces unavailable here: " << out;
    }
  }
};

// One link of R: Bagua-Net fills it from 8 MiB messages up; one NCCL-style socket beside it.
TEST_F(Links, SingleLinkLineRate) {
  ShapedLinks links("1gbit");
  ASSERT_TRUE(links.ok());
  std::vector<Row> rows = bench(links, "socket", "8M");
  ASSERT_EQ(rows.size(), 1u);
  double socket = rows[0].gbps * 1e9 / kR;
  double floor = floorOrZero(0.80);
  double bagua = bestOf(links, "bagua:8", "8M", floor);
  std::printf("one link of R: 8 MiB messages: Bagua-Net %.3f R, one socket %.3f R\n", bagua,
              socket);
  EXPECT_GT(bagua, 0.0);
  EXPECT_GE(bagua, floor);
}

// Per-flow caps of R/8 (every TCP flow by its source port) under a total of R: one socket gets
// R/8 at most, Bagua-Net's 8 streams get most of R.
TEST_F(Links, PerFlowCaps) {
  ShapedLinks links("1gbit/8");
  ASSERT_TRUE(links.ok());
  std::vector<Row> rows = bench(links, "socket", "8M");
  ASSERT_EQ(rows.size(), 1u);
  double socket = rows[0].gbps * 1e9 / kR;
  double floor = floorOrZero(0.75);
  double bagua = bestOf(links, "bagua:8", "8M", floor);
  std::printf("per-flow caps of R/8: Bagua-Net %.3f R, one socket %.3f R (%.1fx)\n", bagua, socket,
              bagua / socket);
  EXPECT_LE(socket, 0.125 * 1.05) << "one flow got more than its cap: the shaper is not per flow";
  EXPECT_GE(socket, floorOrZero(0.125 * 0.5)) << "one flow got far less than its cap";
  EXPECT_GT(bagua, 0.0);
  EXPECT_GE(bagua, floor);
}

// bagua-net-bench --ring (4 processes in a ring over loopback, the GPU step's CPU-only part): every
// case completes and reports a rate and CPU per GB. Loopback only: runs without namespaces.
TEST(BenchRing, FourRanksCompleteEveryCase) {
  if (env("BAGUA_NET_BENCH").empty()) {
    GTEST_SKIP() << "run under meson test (BAGUA_NET_BENCH unset)";
  }
  std::string json = "/tmp/bagua-ring-test-" + std::to_string(getpid()) + ".json";
  std::string out;
  int rc = run(env("BAGUA_NET_BENCH") + " --ring 4 --channels 2 --sizes 256K,1M" +
                   " --cases socket,bagua:4,rr:2 --bytes 8M --json " + json,
               &out);
  std::printf("%s", out.c_str());
  ASSERT_EQ(rc, 0) << out;
  std::ifstream f(json);
  int rows = 0;
  std::string line;
  while (std::getline(f, line)) {
    double gbps = 0;
    double cpu = 0;
    const char* p = std::strstr(line.c_str(), "\"GBps\": ");
    const char* q = std::strstr(line.c_str(), "\"cpu_s_per_GB\": ");
    if (p != nullptr && q != nullptr && std::sscanf(p + 8, "%lf", &gbps) == 1 &&
        std::sscanf(q + 16, "%lf", &cpu) == 1) {
      EXPECT_GT(gbps, 0.0) << line;
      EXPECT_GT(cpu, 0.0) << line;
      ++rows;
    }
  }
  std::remove(json.c_str());
  EXPECT_EQ(rows, 6) << "2 sizes x 3 cases";
}

// The plugin's device spanning both links (BAGUA_NET_DEVICES=fused over bn0 and bn1).
constexpr const char* kFused = "NCCL_SOCKET_IFNAME==bn0,bn1 BAGUA_NET_DEVICES=fused";

double share(const Row& r, const std::string& ifname) {
  uint64_t total = 0;
  for (auto& [name, bytes] : r.linkBytes) {
    total += bytes;
  }
  auto it = r.linkBytes.find(ifname);
  return total == 0 || it == r.linkBytes.end()
             ? 0.0
             : static_cast<double>(it->second) / static_cast<double>(total);
}

// Two links of R as one device: both carry half, together close to 2 R (target 1.8 R).
TEST_F(Links, TwoLinksAsOneDevice) {
  ShapedLinks links("1gbit 1gbit");
  ASSERT_TRUE(links.ok());
  double floor = floorOrZero(1.6);
  Row best;
  for (int i = 0; i < 3 && (i == 0 || best.gbps < floor); ++i) {
    for (const Row& r : bench(links, "bagua:8", "8M", kFused)) {
      if (r.gbps >= best.gbps) {
        best = r;
      }
    }
  }
  std::printf("two links of R as one device: %.3f R, bn0 %.0f%%, bn1 %.0f%%\n", best.gbps,
              100 * share(best, "bn0"), 100 * share(best, "bn1"));
  EXPECT_GE(best.gbps * 1e9 / kR, floor);
  EXPECT_GT(share(best, "bn0"), 0.35);
  EXPECT_GT(share(best, "bn1"), 0.35);
}

// Links of R and R/4 as one device: the slow one carries its fifth, not half (target 0.9 x
// 1.25 R; the equal split gets 2 x R/4 = 0.5 R here).
TEST_F(Links, UnevenLinksAsOneDevice) {
  ShapedLinks links("1gbit 250mbit");
  ASSERT_TRUE(links.ok());
  double floor = floorOrZero(1.0);
  Row best;
  for (int i = 0; i < 3 && (i == 0 || best.gbps < floor); ++i) {
    for (const Row& r : bench(links, "bagua:8", "8M", kFused)) {
      if (r.gbps >= best.gbps) {
        best = r;
      }
    }
  }
  std::printf("links of R and R/4 as one device: %.3f R, bn0 %.0f%%, bn1 %.0f%%\n", best.gbps,
              100 * share(best, "bn0"), 100 * share(best, "bn1"));
  EXPECT_GE(best.gbps * 1e9 / kR, floor) << "more than one link of R carries: both are used";
  EXPECT_GT(share(best, "bn1"), 0.05) << "the slow link carries its part";
  EXPECT_LT(share(best, "bn1"), 0.35) << "the slow link carries less than the equal split's half";
}

}  // namespace
