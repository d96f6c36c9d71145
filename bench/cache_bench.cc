// Dataset cache benchmarks.
//
//   BM_Epoch/<backend>/<transform us>   epoch 1 (transform + write-back) and epoch 2 (served from
//                                       the cache) over 1000 samples of 1 KiB whose preprocessing
//                                       costs <transform us>; backend 0 uncached, 1 embedded,
//                                       2 Redis (read), 3 Redis (getMany, batches of 32).
//                                       Counters: epoch1_ms, epoch2_ms, speedup.
//   BM_EmbeddedGet / BM_CachedDatasetHit   1 KiB gets from the embedded store (64 Ki keys), bare
//                                       and through CachedDataset; peer BM_PeerMemcpy1K copies
//                                       1 KiB from a random slot of an equally large array (the
//                                       memory-speed bound).
//   BM_RedisGet / BM_RedisGetMany       1 KiB gets from a local redis-server, one per round trip
//                                       and 16 per MGET; peer BM_RedisBenchmarkPeer runs
//                                       redis-benchmark (-c 1, -P 1 and -P 16) against the same
//                                       server.
// After the run, main() prints the ratios against the peers measured in the same run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bagua/dataset_cache/cache.h"
#include "bagua/dataset_cache/local_redis_server.h"

namespace {

using namespace bagua::cache;
using Clock = std::chrono::steady_clock;

constexpr size_t kValueBytes = 1024;
constexpr size_t kEpochSamples = 1000;
constexpr size_t kGetKeys = 64 * 1024;

LocalRedisServer* gRedis = nullptr;  // started by main(); null when unavailable
double gRoundsPerUs = 0;             // calibrated transform speed

uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  x ^= x >> 33;
  return x;
}

// The "expensive preprocessing": `rounds` dependent mixing steps, then 1 KiB of output.
void transform(size_t index, uint64_t rounds, std::string& out) {
  uint64_t h = index + 1;
  for (uint64_t r = 0; r < rounds; ++r) {
    h = mix(h + r);
  }
  out.resize(kValueBytes);
  for (size_t j = 0; j < kValueBytes; j += 8) {
    h = mix(h + j);
    std::memcpy(out.data() + j, &h, 8);
  }
}

void calibrate() {
  std::string out;
  const uint64_t rounds = 4'000'000;
  auto t0 = Clock::now();
  transform(1, rounds, out);
  benchmark::DoNotOptimize(out.data());
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  gRoundsPerUs = static_cast<double>(rounds) / us;
}

class TransformDataset : public Dataset {
 public:
  TransformDataset(size_t n, double transformUs)
      : n_(n), rounds_(static_cast<uint64_t>(transformUs * gRoundsPerUs)) {}
  size_t size() const override { return n_; }
  bagua::Status get(size_t index, Sample& sample) const override {
    transform(index, rounds_, sample);
    return bagua::Status::ok();
  }

 private:
  size_t n_;
  uint64_t rounds_;
};

std::shared_ptr<CacheBackend> makeBackend(int kind) {
  if (kind == 1) {
    EmbeddedOptions o;
    o.capacityBytes = uint64_t{512} << 20;
    auto r = EmbeddedStore::create(o);
    if (!r.isOk()) {
      return nullptr;
    }
    return std::shared_ptr<CacheBackend>(std::move(r).value());
  }
  if (kind >= 2 && gRedis != nullptr) {
    RedisOptions o;
    o.hosts = {{"127.0.0.1", gRedis->port()}};
    auto r = RedisStore::create(o);
    if (!r.isOk()) {
      return nullptr;
    }
    (*r)->clear().ignore();
    return std::shared_ptr<CacheBackend>(std::move(r).value());
  }
  return nullptr;
}

constexpr size_t kBatch = 32;

double runEpochBatched(CachedDataset& ds, bool& ok) {
  std::vector<size_t> indices;
  std::vector<std::string> samples;
  auto t0 = Clock::now();
  for (size_t b = 0; b < ds.size(); b += kBatch) {
    indices.clear();
    for (size_t i = b; i < std::min(ds.size(), b + kBatch); ++i) {
      indices.push_back(i);
    }
    ok = ok && ds.getMany(indices, samples).isOk();
    benchmark::DoNotOptimize(samples.data());
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double runEpoch(Dataset& ds, std::string& sample, bool& ok) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < ds.size(); ++i) {
    ok = ok && ds.get(i, sample).isOk();
    benchmark::DoNotOptimize(sample.data());
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void BM_Epoch(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const double transformUs = static_cast<double>(state.range(1));
  TransformDataset source(kEpochSamples, transformUs);
  double e1 = 0;
  double e2 = 0;
  bool ok = true;
  std::string sample;
  for (auto _ : state) {
    if (kind == 0) {
      e1 += runEpoch(source, sample, ok);
      e2 += runEpoch(source, sample, ok);
      continue;
    }
    state.PauseTiming();
    std::shared_ptr<CacheBackend> backend = makeBackend(kind);
    if (backend == nullptr) {
      state.SkipWithError(kind >= 2 ? "no redis-server" : "backend creation failed");
      break;
    }
    auto ds = std::make_unique<CachedDataset>(source, backend, "epoch", 20);
    state.ResumeTiming();
    e1 += kind == 3 ? runEpochBatched(*ds, ok) : runEpoch(*ds, sample, ok);
    ok = ok && ds->flush().isOk();
    e2 += kind == 3 ? runEpochBatched(*ds, ok) : runEpoch(*ds, sample, ok);
    if (ds->stats().hits != kEpochSamples) {
      state.SkipWithError("second epoch did not hit every sample");
    }
  }
  if (!ok) {
    state.SkipWithError("a read failed");
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["epoch1_ms"] = e1 / n;
  state.counters["epoch2_ms"] = e2 / n;
  state.counters["speedup"] = e2 > 0 ? e1 / e2 : 0;
}
BENCHMARK(BM_Epoch)
    ->ArgNames({"backend", "transform_us"})
    ->ArgsProduct({{0, 1, 2, 3}, {100, 1000}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

std::string keyOf(size_t i) {
  return "bench_" + std::to_string(i);
}

std::shared_ptr<CacheBackend> gEmbedded;
std::vector<std::string> gKeys;

void setUpEmbedded() {
  if (gEmbedded != nullptr) {
    return;
  }
  gEmbedded = makeBackend(1);
  std::vector<KeyValue> batch;
  std::string v;
  for (size_t i = 0; i < kGetKeys; ++i) {
    gKeys.push_back(keyOf(i));
    transform(i, 0, v);
    batch.push_back({gKeys.back(), v});
    if (batch.size() == 1024) {
      gEmbedded->putMany(batch).ignore();
      batch.clear();
    }
  }
}

// Keys visited in a scrambled order so that consecutive gets touch unrelated memory.
size_t scramble(size_t i) {
  return (i * 40503u + 12345u) % kGetKeys;
}

void BM_EmbeddedGet(benchmark::State& state) {
  if (state.thread_index() == 0) {
    setUpEmbedded();
  }
  std::string value;
  size_t i = static_cast<size_t>(state.thread_index()) * 7919;
  uint64_t misses = 0;
  for (auto _ : state) {
    auto hit = gEmbedded->get(gKeys[scramble(i++)], value);
    misses += hit.isOk() && *hit ? 0 : 1;
    benchmark::DoNotOptimize(value.data());
  }
  if (misses > 0) {
    state.SkipWithError("embedded get missed");
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kValueBytes));
}
BENCHMARK(BM_EmbeddedGet)->Threads(1)->Threads(2)->UseRealTime();

// A dataset that must never be read: every sample is already in the cache.
class NoSource : public Dataset {
 public:
  size_t size() const override { return kGetKeys; }
  bagua::Status get(size_t index, Sample& sample) const override {
    transform(index, 0, sample);
    return bagua::Status::ok();
  }
};

void BM_CachedDatasetHit(benchmark::State& state) {
  setUpEmbedded();
  NoSource source;
  CachedDataset ds(source, gEmbedded, "bench", 20);
  std::string sample;
  size_t i = 0;
  for (auto _ : state) {
    ds.get(scramble(i++), sample).ignore();
    benchmark::DoNotOptimize(sample.data());
  }
  if (ds.stats().misses > 0) {
    state.SkipWithError("cached dataset missed");
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CachedDatasetHit)->UseRealTime();

void BM_PeerMemcpy1K(benchmark::State& state) {
  // As large as the embedded store's values, copied from scrambled slots into a reused string.
  static std::vector<char> arena(kGetKeys * kValueBytes, 'm');
  std::string value;
  size_t i = static_cast<size_t>(state.thread_index()) * 7919;
  for (auto _ : state) {
    value.assign(arena.data() + scramble(i++) * kValueBytes, kValueBytes);
    benchmark::DoNotOptimize(value.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kValueBytes));
}
BENCHMARK(BM_PeerMemcpy1K)->Threads(1)->Threads(2)->UseRealTime();

std::unique_ptr<RedisStore> gRedisStore;
std::vector<std::string> gRedisKeys;

bool setUpRedis() {
  if (gRedisStore != nullptr) {
    return true;
  }
  if (gRedis == nullptr) {
    return false;
  }
  RedisOptions o;
  o.hosts = {{"127.0.0.1", gRedis->port()}};
  auto r = RedisStore::create(o);
  if (!r.isOk()) {
    return false;
  }
  gRedisStore = std::move(r).value();
  std::vector<KeyValue> batch;
  std::string v;
  for (size_t i = 0; i < 4096; ++i) {
    transform(i, 0, v);
    gRedisKeys.push_back(keyOf(i));
    batch.push_back({keyOf(i), v});
  }
  return gRedisStore->putMany(batch).isOk();
}

void BM_RedisGet(benchmark::State& state) {
  if (!setUpRedis()) {
    state.SkipWithError("no redis-server");
    return;
  }
  std::string value;
  size_t i = 0;
  uint64_t misses = 0;
  for (auto _ : state) {
    auto hit = gRedisStore->get(gRedisKeys[i++ % 4096], value);
    misses += hit.isOk() && *hit ? 0 : 1;
  }
  if (misses > 0) {
    state.SkipWithError("redis get missed");
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RedisGet)->UseRealTime();

void BM_RedisGetMany(benchmark::State& state) {
  if (!setUpRedis()) {
    state.SkipWithError("no redis-server");
    return;
  }
  const size_t batch = static_cast<size_t>(state.range(0));
  std::vector<std::string_view> keys(batch);
  std::vector<std::optional<std::string>> values;
  size_t i = 0;
  for (auto _ : state) {
    for (auto& k : keys) {
      k = gRedisKeys[i++ % 4096];
    }
    if (!gRedisStore->getMany(keys, values).isOk() || !values.back().has_value()) {
      state.SkipWithError("redis getMany failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(batch));
}
BENCHMARK(BM_RedisGetMany)->Arg(16)->ArgName("batch")->UseRealTime();

// redis-benchmark against the same server: 1 client, SET then GET of 1 KiB values, with
// `pipeline` requests in flight. Reports its GET rate as the counter get_per_s.
void BM_RedisBenchmarkPeer(benchmark::State& state) {
  if (gRedis == nullptr) {
    state.SkipWithError("no redis-server");
    return;
  }
  const int pipeline = static_cast<int>(state.range(0));
  double rate = 0;
  for (auto _ : state) {
    std::string cmd = "redis-benchmark -h 127.0.0.1 -p " + std::to_string(gRedis->port()) +
                      " -t set,get -d 1024 -n " + (pipeline == 1 ? "50000" : "200000") +
                      " -c 1 -P " + std::to_string(pipeline) + " -q 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) {
      state.SkipWithError("cannot run redis-benchmark");
      return;
    }
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) {
      out += buf;
    }
    pclose(p);
    // redis-benchmark -q rewrites its progress line with \r; the last "GET: N" is the result.
    size_t at = out.rfind("GET: ");
    if (at == std::string::npos) {
      state.SkipWithError(("redis-benchmark printed no GET rate: " + out).c_str());
      return;
    }
    rate = std::strtod(out.c_str() + at + 5, nullptr);
  }
  state.counters["get_per_s"] = rate;
}
BENCHMARK(BM_RedisBenchmarkPeer)
    ->Arg(1)
    ->Arg(16)
    ->ArgName("pipeline")
    ->Iterations(1)
    ->UseRealTime();

// Google Benchmark 1.7 (Debian 12) flags failed runs with error_occurred; 1.8 replaced it with
// `skipped`.
template <typename Run>
bool runFailed(const Run& r) {
  if constexpr (requires { r.error_occurred; }) {
    return r.error_occurred;
  } else {
    return static_cast<int>(r.skipped) != 0;
  }
}

// Keeps each run's counters so main() can print the ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (runFailed(r)) {
        continue;
      }
      std::map<std::string, double> c;
      for (const auto& [name, counter] : r.counters) {
        c[name] = counter.value;
      }
      results[r.benchmark_name()] = c;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, std::map<std::string, double>> results;
};

void printRatio(RatioReporter& rep, const char* what, const std::string& ours,
                const std::string& ourCounter, const std::string& peer,
                const std::string& peerCounter) {
  auto a = rep.results.find(ours);
  auto b = rep.results.find(peer);
  if (a == rep.results.end() || b == rep.results.end() || b->second[peerCounter] == 0) {
    std::printf("  %-58s n/a (%s or %s missing)\n", what, ours.c_str(), peer.c_str());
    return;
  }
  double x = a->second[ourCounter];
  double y = b->second[peerCounter];
  std::printf("  %-58s %12.4g / %12.4g = %.2fx\n", what, x, y, x / y);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  calibrate();
  LocalRedisServer redis;
  if (redisAvailable()) {
    LocalRedisOptions o;
    o.maxMemoryBytes = uint64_t{1} << 30;
    bagua::Status s = redis.start(o);
    if (s.isOk()) {
      gRedis = &redis;
    } else {
      std::fprintf(stderr, "cache_bench: Redis benchmarks skipped: %s\n", s.message().c_str());
    }
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\nRatios (ours / peer, measured in this run):\n");
  for (const char* t : {"100", "1000"}) {
    for (auto [kind, name] : {std::pair{"1", "embedded"}, std::pair{"2", "redis"},
                              std::pair{"3", "redis getMany(32)"}}) {
      std::string bench = std::string("BM_Epoch/backend:") + kind + "/transform_us:" + t +
                          "/iterations:2/real_time";
      std::string base =
          std::string("BM_Epoch/backend:0/transform_us:") + t + "/iterations:2/real_time";
      printRatio(reporter,
                 (std::string("epoch 1 / epoch 2, ") + name + ", transform " + t + " us").c_str(),
                 bench, "epoch1_ms", bench, "epoch2_ms");
      printRatio(
          reporter,
          (std::string("uncached epoch / cached epoch 2, ") + name + ", " + t + " us").c_str(),
          base, "epoch2_ms", bench, "epoch2_ms");
    }
  }
  printRatio(reporter, "embedded get 1 KiB / memcpy 1 KiB (1 thread)",
             "BM_EmbeddedGet/real_time/threads:1", "items_per_second",
             "BM_PeerMemcpy1K/real_time/threads:1", "items_per_second");
  printRatio(reporter, "embedded get 1 KiB / memcpy 1 KiB (2 threads)",
             "BM_EmbeddedGet/real_time/threads:2", "items_per_second",
             "BM_PeerMemcpy1K/real_time/threads:2", "items_per_second");
  printRatio(reporter, "CachedDataset hit / memcpy 1 KiB (1 thread)",
             "BM_CachedDatasetHit/real_time", "items_per_second",
             "BM_PeerMemcpy1K/real_time/threads:1", "items_per_second");
  printRatio(reporter, "RedisStore get / redis-benchmark GET -P 1", "BM_RedisGet/real_time",
             "items_per_second", "BM_RedisBenchmarkPeer/pipeline:1/iterations:1/real_time",
             "get_per_s");
  printRatio(reporter, "RedisStore getMany(16) / redis-benchmark GET -P 16",
             "BM_RedisGetMany/batch:16/real_time", "items_per_second",
             "BM_RedisBenchmarkPeer/pipeline:16/iterations:1/real_time", "get_per_s");
  printRatio(reporter, "embedded get / RedisStore get (1 thread)",
             "BM_EmbeddedGet/real_time/threads:1", "items_per_second", "BM_RedisGet/real_time",
             "items_per_second");
  benchmark::Shutdown();
  redis.stop();
  return 0;
}
