// The NCCL backend on real GPUs: ranks as threads, one device each. Skipped (with the reason)
// where no GPU is visible; the lead runs it on the GPU machine. Also the reducer on device
// tensors (device buckets, copies on the trainer's stream, the rebuild's broadcast staged through
// the device), which runs on one GPU as well.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"
#include "multi_rank.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

template <typename F>
std::string withGroup(std::shared_ptr<Store> store, int r, int world, F&& body,
                      std::chrono::milliseconds collectiveTimeout = 60000ms) {
  ProcessGroupOptions o;
  o.rank = r;
  o.worldSize = world;
  o.backend = Backend::kNccl;
  o.hierarchical = false;
  o.rendezvousTimeout = 60000ms;
  o.collectiveTimeout = collectiveTimeout;
  auto pg = ProcessGroup::create(store, o);
  if (!pg.isOk()) {
    return pg.status().toString();
  }
  cudaSetDevice(r);
  return body((*pg)->global());
}

TEST(Nccl, AllReduceAllGatherBroadcastMatchClosedForm) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend runs on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  const size_t n = (1 << 20) + 7;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withGroup(store, r, world, [&](Communicator& c) -> std::string {
          std::vector<float> h(n);
          for (size_t i = 0; i < n; ++i) {
            h[i] = static_cast<float>((i * 7 + r * 13) % 17);
          }
          float* d = nullptr;
          float* g = nullptr;
          if (cudaMalloc(&d, n * 4) != cudaSuccess ||
              cudaMalloc(&g, n * 4 * world) != cudaSuccess) {
            return std::string("cudaMalloc failed");
          }
          cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice);
          Status s = c.allGather(d, g, n, DataType::kF32)->wait(60000ms);
          if (s.isOk()) {
            s = c.allReduce(d, d, n, DataType::kF32, ReduceOp::kSum)->wait(60000ms);
          }
          if (!s.isOk()) {
            return s.toString();
          }
          std::vector<float> out(n), gathered(n * world);
          cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost);
          cudaMemcpy(gathered.data(), g, n * 4 * world, cudaMemcpyDeviceToHost);
          cudaFree(d);
          cudaFree(g);
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int k = 0; k < world; ++k) {
              want += static_cast<float>((i * 7 + k * 13) % 17);
            }
            if (out[i] != want) {
              return strPrintf("allReduce element %zu: %g != %g", i, out[i], want);
            }
          }
          for (size_t i = 0; i < n * world; ++i) {
            float want = static_cast<float>(((i % n) * 7 + (i / n) * 13) % 17);
            if (gathered[i] != want) {
              return strPrintf("allGather element %zu: %g != %g", i, gathered[i], want);
            }
          }
          return std::string();
        });
      },
      180s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// Device buffer of n floats, freed at scope exit.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) {
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) {
      p = nullptr;
    }
  }
  ~DeviceFloats() { cudaFree(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* p = nullptr;
};

// The pooled completion events are reused every 1024 operations: more small calls than that in
// a row, issued without waiting (then the last waited) and one by one, must all be correct, and
// every Work of the batch must report done once the last one is.
TEST(Nccl, ManySmallCallsInARowAreAllCorrect) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend runs on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withGroup(store, r, world, [&](Communicator& c) -> std::string {
          constexpr size_t kOps = 2500;  // > 2 rings of events
          constexpr size_t kLen = 67;    // odd: segments do not line up with anything
          const float ranks = static_cast<float>(world * (world + 1) / 2);
          auto value = [](int rank, size_t k, size_t i) {
            return static_cast<float>((rank + 1) * static_cast<int>(k % 5 + 1)) +
                   static_cast<float>(i % 13);
          };
          std::vector<float> h(kOps * kLen);
          for (size_t k = 0; k < kOps; ++k) {
            for (size_t i = 0; i < kLen; ++i) {
              h[k * kLen + i] = value(r, k, i);
            }
          }
          DeviceFloats batch(kOps * kLen), single(kOps * kLen);
          if (batch.p == nullptr || single.p == nullptr) {
            return std::string("cudaMalloc failed");
          }
          cudaMemcpy(batch.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(single.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
          cudaDeviceSynchronize();  // pageable copies may return before the data lands
          // Batch: every call issued before any is waited; the last one waited.
          std::vector<WorkPtr> works;
          works.reserve(kOps);
          for (size_t k = 0; k < kOps; ++k) {
            works.push_back(c.allReduce(batch.p + k * kLen, batch.p + k * kLen, kLen,
                                        DataType::kF32, ReduceOp::kSum));
          }
          Status s = works.back()->wait(60000ms);
          if (!s.isOk()) {
            return "batch: " + s.toString();
          }
          for (size_t k = 0; k < kOps; ++k) {
            if (!works[k]->test() || !works[k]->status().isOk()) {
              return strPrintf("batch: work %zu not done/ok after the last one: %s", k,
                               works[k]->status().toString().c_str());
            }
          }
          // One by one, each waited; every 100th also through a barrier, and one waited from
          // another thread while this one polls test().
          for (size_t k = 0; k < kOps; ++k) {
            WorkPtr w = c.allReduce(single.p + k * kLen, single.p + k * kLen, kLen, DataType::kF32,
                                    ReduceOp::kSum);
            if (k == kOps / 2) {
              Status other;
              std::thread t([&] { other = w->wait(60000ms); });
              while (!w->test()) {
              }
              t.join();
              s = other.isOk() ? w->status() : other;
            } else {
              s = w->wait(60000ms);
            }
            if (s.isOk() && k % 100 == 0) {
              s = c.barrier()->wait(60000ms);
            }
            if (!s.isOk()) {
              return strPrintf("single %zu: %s", k, s.toString().c_str());
            }
          }
          std::vector<float> outBatch(h.size()), outSingle(h.size());
          cudaMemcpy(outBatch.data(), batch.p, h.size() * 4, cudaMemcpyDeviceToHost);
          cudaMemcpy(outSingle.data(), single.p, h.size() * 4, cudaMemcpyDeviceToHost);
          for (size_t k = 0; k < kOps; ++k) {
            for (size_t i = 0; i < kLen; ++i) {
              const float want = ranks * static_cast<float>(k % 5 + 1) +
                                 static_cast<float>(world) * static_cast<float>(i % 13);
              if (outBatch[k * kLen + i] != want || outSingle[k * kLen + i] != want) {
                return strPrintf("op %zu element %zu: batch %g, single %g, expected %g", k, i,
                                 outBatch[k * kLen + i], outSingle[k * kLen + i], want);
              }
            }
          }
          return std::string();
        });
      },
      240s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// Broadcast, reduce-scatter, send/recv around the ring and all-to-all (NCCL groups) against
// closed forms with rank- and index-dependent values.
TEST(Nccl, BroadcastReduceScatterSendRecvAllToAllMatchClosedForm) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend runs on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withGroup(store, r, world, [&](Communicator& c) -> std::string {
          const size_t n = 1000 + 3;
          const size_t all = n * static_cast<size_t>(world);
          auto v = [](int rank, size_t i) { return static_cast<float>((i * 5 + rank * 11) % 23); };
          std::vector<float> h(all);
          for (size_t i = 0; i < all; ++i) {
            h[i] = v(r, i);
          }
          DeviceFloats bc(n), rsIn(all), rsOut(n), sr(n), srOut(n), a2aIn(all), a2aOut(all);
          for (float* p : {bc.p, rsIn.p, rsOut.p, sr.p, srOut.p, a2aIn.p, a2aOut.p}) {
            if (p == nullptr) {
              return std::string("cudaMalloc failed");
            }
          }
          cudaMemcpy(bc.p, h.data(), n * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(rsIn.p, h.data(), all * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(sr.p, h.data(), n * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(a2aIn.p, h.data(), all * 4, cudaMemcpyHostToDevice);
          cudaDeviceSynchronize();
          const int root = world - 1;
          const int next = (r + 1) % world;
          const int prev = (r + world - 1) % world;
          std::vector<WorkPtr> ws = {
              c.broadcast(bc.p, n, DataType::kF32, root),
              c.reduceScatter(rsIn.p, rsOut.p, n, DataType::kF32, ReduceOp::kSum),
              c.sendRecv(sr.p, n, next, srOut.p, n, prev, DataType::kF32),
              c.allToAll(a2aIn.p, a2aOut.p, n, DataType::kF32),
          };
          for (WorkPtr& w : ws) {
            Status s = w->wait(60000ms);
            if (!s.isOk()) {
              return s.toString();
            }
          }
          std::vector<float> o(all);
          cudaMemcpy(o.data(), bc.p, n * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n; ++i) {
            if (o[i] != v(root, i)) {
              return strPrintf("broadcast element %zu: %g != %g", i, o[i], v(root, i));
            }
          }
          cudaMemcpy(o.data(), rsOut.p, n * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int k = 0; k < world; ++k) {
              want += v(k, static_cast<size_t>(r) * n + i);
            }
            if (o[i] != want) {
              return strPrintf("reduceScatter element %zu: %g != %g", i, o[i], want);
            }
          }
          cudaMemcpy(o.data(), srOut.p, n * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n; ++i) {
            if (o[i] != v(prev, i)) {
              return strPrintf("sendRecv element %zu: %g != %g", i, o[i], v(prev, i));
            }
          }
          cudaMemcpy(o.data(), a2aOut.p, all * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < all; ++i) {
            // Block j of my output is block r of rank j's input.
            const int from = static_cast<int>(i / n);
            const float want = v(from, static_cast<size_t>(r) * n + i % n);
            if (o[i] != want) {
              return strPrintf("allToAll element %zu: %g != %g", i, o[i], want);
            }
          }
          return std::string();
        });
      },
      180s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// A peer that never issues its part: the waiter gets an error in bounded time (the watchdog
// aborts after the collective timeout even though the wait allows much longer), a short wait
// before that is DeadlineExceeded without breaking anything, and later calls fail at once.
TEST(Nccl, PeerThatNeverIssuesFailsWithinTheCollectiveTimeout) {
  const int world = std::min(gpuCount(), 8);
  if (world < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (" << world << " visible)";
  }
  auto store = std::make_shared<InMemoryStore>();
  std::atomic<bool> rank0Done{false};
  const auto timeout = 2000ms;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) {
        return withGroup(
            store, r, world,
            [&](Communicator& c) -> std::string {
              const size_t n = 4096;
              DeviceFloats d(n);
              if (d.p == nullptr) {
                return std::string("cudaMalloc failed");
              }
              cudaMemset(d.p, 0, n * 4);
              cudaDeviceSynchronize();
              // Both ranks: one all-reduce, so connections exist before the hang.
              Status s = c.allReduce(d.p, d.p, n, DataType::kF32, ReduceOp::kSum)->wait(60000ms);
              if (!s.isOk()) {
                return "warm-up: " + s.toString();
              }
              if (r != 0) {
                // Never issues the second all-reduce; waits (bounded) for rank 0's verdict.
                const auto until = std::chrono::steady_clock::now() + 60s;
                while (!rank0Done.load(std::memory_order_acquire) &&
                       std::chrono::steady_clock::now() < until) {
                  std::this_thread::sleep_for(10ms);
                }
                c.abort("test: the peer has given up");
                // Aborted here, or already by this rank's watchdog on NCCL's error report.
                Status after = c.barrier()->wait(1000ms);
                if (after.isOk()) {
                  return std::string("a barrier after abort succeeded");
                }
                return std::string();
              }
              const auto t0 = std::chrono::steady_clock::now();
              WorkPtr w = c.allReduce(d.p, d.p, n, DataType::kF32, ReduceOp::kSum);
              Status early = w->wait(100ms);
              std::string out;
              if (early.code() != StatusCode::kDeadlineExceeded || w->test()) {
                out = "short wait: " + early.toString();
              }
              s = w->wait(60000ms);
              const double secs =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              if (out.empty() && s.code() != StatusCode::kDeadlineExceeded) {
                out = "expected DeadlineExceeded from the watchdog, got " + s.toString();
              }
              if (out.empty() && (secs < 1.5 || secs > 20)) {
                out = strPrintf("failed after %.2f s; the collective timeout is 2 s", secs);
              }
              const auto t1 = std::chrono::steady_clock::now();
              Status next = c.allReduce(d.p, d.p, n, DataType::kF32, ReduceOp::kSum)->wait(1000ms);
              if (out.empty() && (next.isOk() || std::chrono::steady_clock::now() - t1 > 500ms)) {
                out = "a call after the abort should fail at once: " + next.toString();
              }
              rank0Done.store(true, std::memory_order_release);
              return out;
            },
            timeout);
      },
      120s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

// GradientAllReduce's average, then +1 on every element (through the host, on the bucket
// thread): the trainer must read average + 1, so gradients that were not copied in before the
// bucket ran, or whose result did not come back, fail even on one GPU (where the average of one
// rank is its own gradient).
class AveragePlusOne final : public Algorithm {
 public:
  std::string name() const override { return "average_plus_one"; }
  Result<std::unique_ptr<AlgorithmImpl>> reify(ProcessGroup& /*group*/) override {
    return std::unique_ptr<AlgorithmImpl>(new Impl());
  }

 private:
  class Impl final : public AlgorithmImpl {
   public:
    Status runBucket(Bucket& b, ProcessGroup& g) override {
      BAGUA_RETURN_IF_ERROR(allReduceBucket(b, g, /*hierarchical=*/false, /*average=*/true));
      std::vector<float> h(b.numel);
      if (cudaMemcpy(h.data(), b.flat, b.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) {
        return BAGUA_ERROR(kCudaError, "bucket %d: copy to the host failed", b.index);
      }
      for (float& x : h) {
        x += 1.0f;
      }
      if (cudaMemcpy(b.flat, h.data(), b.bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
        return BAGUA_ERROR(kCudaError, "bucket %d: copy to the device failed", b.index);
      }
      return Status::ok();
    }
  };
};

// The reducer's device path: gradients written on the trainer's own stream, copied into device
// buckets on that stream, reduced over NCCL and copied back (or, as bucket views,
// written in place), read back on the trainer's stream right after finishBackward() without a
// device-wide synchronisation. Small buckets force several of them; the marking order differs
// from the registration order, so the rebuild after the first iteration (rank 0's order
// broadcast through device staging) changes the layout. Every element of every iteration is
// checked against the average of every rank's pattern, plus one (AveragePlusOne: runBucket, so
// the bucket thread waits on the host for each bucket's copies), or plus zero with
// GradientAllReduce (deviceOrder: launchBucket, every bucket ordered on the device, so the
// bucket thread never waits for copies on the host and finishBackward does not wait for the
// collectives: the trainer's stream does).
// Homes (Parameter::gradHome, do_flatten's layout): one device buffer with the parameters back
// to back in the marking order, so the rebuilt buckets line up with it and run in place there,
// with the gradients written at their homes (kAtHomes) or in their own memory (kElsewhere: copied
// in, and the reduced values copied back to them).
enum class DeviceHomes { kNone, kAtHomes, kElsewhere };

// Stepping inside the backward pass on a device (BucketStepper): for each bucket, brings the
// reduced gradients back on a stream of its own (copyBucketOutOn: ordered after the reduction,
// no host wait) and copies them there into snapshots, which is what an optimizer stepping
// there reads; the trainer's stream waits for that stream at endBackwardStep.
class SnapshotStepper final : public Optimizer, public BucketStepper {
 public:
  SnapshotStepper(std::vector<Parameter>& params, std::vector<float*> snapshots,
                  cudaStream_t stream)
      : params_(params), snapshots_(std::move(snapshots)), stream_(stream) {}
  Status step() override { return Status::ok(); }
  void zeroGrad() override {}
  bool beginBackwardStep(DistributedDataParallel&, std::string*) override {
    stepped.clear();
    return true;
  }
  Status stepBucket(DistributedDataParallel& ddp, int bucket) override {
    BAGUA_RETURN_IF_ERROR(ddp.copyBucketOutOn(bucket, stream_));
    for (int t : ddp.buckets()[static_cast<size_t>(bucket)].tensors) {
      const auto pi = static_cast<size_t>(ddp.tensors()[static_cast<size_t>(t)].paramIndex);
      if (cudaMemcpyAsync(snapshots_[pi], params_[pi].grad, params_[pi].bytes(),
                          cudaMemcpyDeviceToDevice, stream_) != cudaSuccess) {
        return BAGUA_ERROR(kInternal, "snapshot copy failed");
      }
    }
    stepped.push_back(bucket);
    return Status::ok();
  }
  Status endBackwardStep(DistributedDataParallel& ddp) override {
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(e, stream_) != cudaSuccess ||
        cudaStreamWaitEvent(ddp.options().cudaStream, e, 0) != cudaSuccess) {
      return BAGUA_ERROR(kInternal, "ordering the trainer's stream failed");
    }
    cudaEventDestroy(e);
    return Status::ok();
  }
  std::vector<int> stepped;

 private:
  std::vector<Parameter>& params_;
  std::vector<float*> snapshots_;
  cudaStream_t stream_;
};

void reducerOnDeviceTensors(bool gradientAsBucketView, bool deviceOrder = false,
                            DeviceHomes homes = DeviceHomes::kNone, bool stepper = false) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: device buckets run on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  const std::vector<size_t> sizes = {1000, 3, 70000, 257, 4096, 1};
  auto pattern = [](int rank, int iter, size_t param, size_t i) {
    return static_cast<float>((i * 7 + param * 31 + iter * 5 + rank * 13) % 23);
  };
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = world;
        o.backend = Backend::kNccl;
        o.hierarchical = false;
        o.rendezvousTimeout = 60000ms;
        o.collectiveTimeout = 60000ms;
        auto pg = ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        cudaSetDevice(r);
        cudaStream_t trainer = nullptr;
        if (cudaStreamCreateWithFlags(&trainer, cudaStreamNonBlocking) != cudaSuccess) {
          return std::string("cudaStreamCreate failed");
        }
        std::vector<std::unique_ptr<DeviceFloats>> data, grads;
        std::vector<Parameter> params(sizes.size());
        for (size_t k = 0; k < sizes.size(); ++k) {
          data.push_back(std::make_unique<DeviceFloats>(sizes[k]));
          grads.push_back(std::make_unique<DeviceFloats>(sizes[k]));
          if (data.back()->p == nullptr || grads.back()->p == nullptr) {
            return std::string("cudaMalloc failed");
          }
          cudaMemset(data.back()->p, 0, sizes[k] * sizeof(float));
          Parameter& p = params[k];
          p.name = "layer" + std::to_string(k) + ".weight";
          p.data = data.back()->p;
          p.grad = grads.back()->p;
          p.numel = sizes[k];
          p.device = {DeviceType::kCuda, r};
          if (homes == DeviceHomes::kNone) {
            p.setGrad = [&params, k](void* g) { params[k].grad = g; };
          }
        }
        const std::vector<int> markOrder = {2, 0, 5, 3, 1, 4};
        size_t total = 0;
        for (size_t n : sizes) {
          total += n;
        }
        DeviceFloats home(homes == DeviceHomes::kNone ? 1 : total);
        if (home.p == nullptr) {
          return std::string("cudaMalloc failed");
        }
        if (homes != DeviceHomes::kNone) {
          size_t off = 0;
          for (int k : markOrder) {
            params[k].gradHome = home.p + off;
            if (homes == DeviceHomes::kAtHomes) {
              params[k].grad = home.p + off;
            }
            off += sizes[k];
          }
        }
        std::vector<Parameter> buffers;
        DdpOptions d;
        d.bucketCapMb = 64.0 / 1024;  // 64 KiB
        d.firstBucketBytes = 4096;
        d.gradientAsBucketView = gradientAsBucketView;
        d.cudaStream = trainer;  // a cudaStream_t as it is
        std::shared_ptr<Algorithm> algorithm = std::make_shared<AveragePlusOne>();
        if (deviceOrder) {
          algorithm = std::make_shared<GradientAllReduce>();
        }
        const double plus = deviceOrder ? 0.0 : 1.0;
        std::vector<std::unique_ptr<DeviceFloats>> snaps;
        std::vector<float*> snapPtrs;
        cudaStream_t stepStream = nullptr;
        std::unique_ptr<SnapshotStepper> snapshotter;
        std::vector<Optimizer*> optimizers;
        if (stepper) {
          if (cudaStreamCreateWithFlags(&stepStream, cudaStreamNonBlocking) != cudaSuccess) {
            return std::string("cudaStreamCreate failed");
          }
          for (size_t k = 0; k < sizes.size(); ++k) {
            snaps.push_back(std::make_unique<DeviceFloats>(sizes[k]));
            snapPtrs.push_back(snaps.back()->p);
          }
          snapshotter = std::make_unique<SnapshotStepper>(params, snapPtrs, stepStream);
          optimizers.push_back(snapshotter.get());
        }
        auto ddp = withBagua(params, buffers, optimizers, algorithm, **pg, d);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        std::string out;
        for (int iter = 0; iter < 4 && out.empty(); ++iter) {
          Status s = (*ddp)->prepareForward();
          if (iter >= 1 && s.isOk() && !(*ddp)->bucketsRebuilt()) {
            out = "buckets not rebuilt after the first iteration";
          }
          std::vector<std::vector<float>> host(sizes.size());
          for (int k : markOrder) {
            if (!s.isOk()) {
              break;
            }
            host[k].resize(sizes[k]);
            for (size_t i = 0; i < sizes[k]; ++i) {
              host[k][i] = pattern(r, iter, k, i);
            }
            // The trainer's stream produces the gradient (pageable source: returns once staged).
            cudaMemcpyAsync(params[k].grad, host[k].data(), sizes[k] * sizeof(float),
                            cudaMemcpyHostToDevice, trainer);
            s = (*ddp)->markGradReady(k);
          }
          if (s.isOk()) {
            s = (*ddp)->finishBackward();
          }
          if (!s.isOk()) {
            return strPrintf("iteration %d: %s", iter, s.toString().c_str());
          }
          if (stepper) {
            std::vector<int> all = snapshotter->stepped;
            std::sort(all.begin(), all.end());
            for (size_t b = 0; b < all.size() || b < (*ddp)->buckets().size(); ++b) {
              if (b >= all.size() || all[b] != static_cast<int>(b) ||
                  all.size() != (*ddp)->buckets().size()) {
                return strPrintf("iteration %d: %zu of %zu buckets stepped inside backward", iter,
                                 all.size(), (*ddp)->buckets().size());
              }
            }
          }
          for (size_t k = 0; k < sizes.size() && out.empty(); ++k) {
            std::vector<float> got(sizes[k]);
            // With the stepper: what its stream read inside backward (the trainer's stream waits
            // for it); else the gradient.
            cudaMemcpyAsync(got.data(), stepper ? snapPtrs[k] : params[k].grad,
                            sizes[k] * sizeof(float), cudaMemcpyDeviceToHost, trainer);
            cudaStreamSynchronize(trainer);
            for (size_t i = 0; i < sizes[k]; ++i) {
              double want = 0;
              for (int q = 0; q < world; ++q) {
                want += pattern(q, iter, k, i);
              }
              want = want / world + plus;
              if (std::abs(got[i] - want) > 1e-5 * std::max(1.0, std::abs(want))) {
                out = strPrintf("iteration %d, %s element %zu: %g, expected %g", iter,
                                params[k].name.c_str(), i, got[i], want);
                break;
              }
            }
          }
        }
        const DdpStats st = (*ddp)->stats();
        if (out.empty() && homes != DeviceHomes::kNone) {
          for (const Bucket& b : (*ddp)->buckets()) {
            const auto* f = static_cast<const float*>(b.flat);
            if (!b.inPlace || f < home.p || f + b.numel > home.p + total) {
              out = strPrintf("bucket %d of %zu is not in place at the gradients' homes", b.index,
                              (*ddp)->buckets().size());
            }
          }
        }
        if (out.empty() && deviceOrder && st.bucketWaitNs != 0) {
          out = strPrintf("device order: the bucket thread waited %lld ns for copies on the host",
                          static_cast<long long>(st.bucketWaitNs));
        }
        if (out.empty() && !deviceOrder && st.bucketWaitNs == 0) {
          out = "runBucket path: no host wait for the copies was measured";
        }
        ddp->reset();
        cudaStreamDestroy(trainer);
        if (stepStream != nullptr) {
          cudaStreamDestroy(stepStream);
        }
        return out;
      },
      180s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

TEST(Nccl, StepInsideBackwardReadsTheReducedGradientsOfCopiedBuckets) {
  reducerOnDeviceTensors(false, /*deviceOrder=*/true, DeviceHomes::kNone, /*stepper=*/true);
}

TEST(Nccl, StepInsideBackwardReadsTheReducedGradientsAtTheirHomes) {
  reducerOnDeviceTensors(false, /*deviceOrder=*/true, DeviceHomes::kAtHomes, /*stepper=*/true);
}

TEST(Nccl, StepInsideBackwardReadsTheReducedGradientsWithGradientsElsewhere) {
  reducerOnDeviceTensors(false, /*deviceOrder=*/true, DeviceHomes::kElsewhere, /*stepper=*/true);
}

TEST(Nccl, ReducerOnDeviceTensorsCopiesInAndOut) {
  reducerOnDeviceTensors(false);
}

TEST(Nccl, ReducerOnDeviceTensorsAsBucketViews) {
  reducerOnDeviceTensors(true);
}

TEST(Nccl, ReducerInDeviceOrderCopiesInAndOut) {
  reducerOnDeviceTensors(false, /*deviceOrder=*/true);
}

TEST(Nccl, ReducerInDeviceOrderAsBucketViews) {
  reducerOnDeviceTensors(true, /*deviceOrder=*/true);
}

TEST(Nccl, ReducerInDeviceOrderInPlaceAtTheGradientsHomes) {
  reducerOnDeviceTensors(false, /*deviceOrder=*/true, DeviceHomes::kAtHomes);
}

TEST(Nccl, ReducerInDeviceOrderInPlaceWithGradientsElsewhere) {
  reducerOnDeviceTensors(false, /*deviceOrder=*/true, DeviceHomes::kElsewhere);
}

// A host callback holds the trainer's stream (as a long backward kernel would) while the
// gradients are marked: in device order, markGradReady and finishBackward must return while it
// still holds (nothing waits for the stream on the host), and once released, the gradients read
// on the trainer's stream are the reduced ones. Host order (an algorithm without launchBucket,
// each bucket waited for on the host and run through runBucket) cannot return before the
// release: that is checked too, so the test tells the two apart.
void holdCallback(void* arg) {
  auto* held = static_cast<std::atomic<bool>*>(arg);
  while (held->load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Gradient all-reduce through runBucket only: the reducer waits for each bucket's copies on the
// host before running it.
class HostOrderedAllReduce final : public Algorithm {
 public:
  std::string name() const override { return "host_ordered_allreduce"; }
  Result<std::unique_ptr<AlgorithmImpl>> reify(ProcessGroup& /*group*/) override {
    struct Impl final : AlgorithmImpl {
      Status runBucket(Bucket& b, ProcessGroup& g) override {
        return allReduceBucket(b, g, /*hierarchical=*/false, /*average=*/true);
      }
    };
    return std::unique_ptr<AlgorithmImpl>(new Impl);
  }
};

void finishWhileStreamHeld(bool launched) {
  const int world = std::min(gpuCount(), 8);
  if (world == 0) {
    GTEST_SKIP() << "no CUDA device visible: device buckets run on the GPU machine only";
  }
  auto store = std::make_shared<InMemoryStore>();
  const size_t n = 1 << 16;
  auto res = bagua::testing::runRanks(
      world,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = world;
        o.backend = Backend::kNccl;
        o.hierarchical = false;
        o.rendezvousTimeout = 60000ms;
        o.collectiveTimeout = 60000ms;
        auto pg = ProcessGroup::create(store, o);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
        cudaSetDevice(r);
        cudaStream_t trainer = nullptr;
        if (cudaStreamCreateWithFlags(&trainer, cudaStreamNonBlocking) != cudaSuccess) {
          return std::string("cudaStreamCreate failed");
        }
        DeviceFloats data(2 * n), grad(2 * n);
        if (data.p == nullptr || grad.p == nullptr) {
          return std::string("cudaMalloc failed");
        }
        std::vector<Parameter> params(2);
        for (size_t k = 0; k < 2; ++k) {
          Parameter& p = params[k];
          p.name = "layer" + std::to_string(k) + ".weight";
          p.data = data.p + k * n;
          p.grad = grad.p + k * n;
          p.numel = n;
          p.device = {DeviceType::kCuda, r};
          p.setGrad = [&params, k](void* g) { params[k].grad = g; };
        }
        std::vector<Parameter> buffers;
        DdpOptions d;
        d.bucketCapMb = 0.25;  // one bucket per parameter
        d.firstBucketBytes = 1024;
        d.rebuildBuckets = false;
        d.cudaStream = trainer;
        std::shared_ptr<Algorithm> algo = std::make_shared<HostOrderedAllReduce>();
        if (launched) {
          algo = std::make_shared<GradientAllReduce>();
        }
        auto ddp = withBagua(params, buffers, {}, algo, **pg, d);
        if (!ddp.isOk()) {
          return ddp.status().toString();
        }
        // Pinned, so that the upload is asynchronous even behind the held stream.
        float* host = nullptr;
        if (cudaMallocHost(&host, 2 * n * sizeof(float)) != cudaSuccess) {
          return std::string("cudaMallocHost failed");
        }
        std::unique_ptr<float, cudaError_t (*)(void*)> hostOwner(host, cudaFreeHost);
        for (size_t i = 0; i < 2 * n; ++i) {
          host[i] = static_cast<float>((i % 17) + r);
        }
        Status s = (*ddp)->prepareForward();
        std::atomic<bool> held{true};
        if (cudaLaunchHostFunc(trainer, holdCallback, &held) != cudaSuccess) {
          return std::string("cudaLaunchHostFunc failed");
        }
        // Released by this thread after 3 s at the latest, so the old order ends too.
        std::jthread releaser([&held](std::stop_token st) {
          const auto until = std::chrono::steady_clock::now() + 3s;
          while (!st.stop_requested() && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(5ms);
          }
          held.store(false, std::memory_order_release);
        });
        const auto t0 = std::chrono::steady_clock::now();
        cudaMemcpyAsync(grad.p, host, 2 * n * sizeof(float), cudaMemcpyHostToDevice, trainer);
        for (int k = 1; k >= 0 && s.isOk(); --k) {
          s = (*ddp)->markGradReady(k);
        }
        if (s.isOk()) {
          s = (*ddp)->finishBackward();
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const bool stillHeld = held.load(std::memory_order_acquire);
        releaser.request_stop();
        releaser.join();
        if (!s.isOk()) {
          return s.toString();
        }
        std::string out;
        if (launched && (!stillHeld || secs > 1.0)) {
          out = strPrintf("device order: finishBackward returned after %.2f s, stream %s", secs,
                          stillHeld ? "still held" : "released");
        }
        if (!launched && stillHeld) {
          out = "host order: finishBackward returned while the trainer's stream was held";
        }
        std::vector<float> got(2 * n);
        cudaMemcpyAsync(got.data(), grad.p, got.size() * sizeof(float), cudaMemcpyDeviceToHost,
                        trainer);
        cudaStreamSynchronize(trainer);
        for (size_t i = 0; i < got.size() && out.empty(); ++i) {
          double want = 0;
          for (int q = 0; q < world; ++q) {
            want += static_cast<double>((i % 17) + q);
          }
          want /= world;
          if (std::abs(got[i] - want) > 1e-5 * std::max(1.0, want)) {
            out = strPrintf("element %zu: %g, expected %g", i, got[i], want);
          }
        }
        ddp->reset();
        cudaStreamDestroy(trainer);
        return out;
      },
      120s);
  EXPECT_EQ(bagua::testing::joinFailures(res), "");
}

TEST(Nccl, DeviceOrderFinishesBackwardWhileTheTrainerStreamIsHeld) {
  finishWhileStreamHeld(true);
}

TEST(Nccl, HostOrderWaitsForTheTrainerStream) {
  finishWhileStreamHeld(false);
}

// Two ranks of one host on one GPU (a wrong LOCAL_RANK, or simulated nodes without an
// NCCL_HOSTID each): NCCL refuses with "invalid usage", and only NCCL_DEBUG=WARN used to say
// why. The error carries NCCL's own reason and what to change.
TEST(Nccl, TwoRanksOnOneGpuOfOneHostFailSayingWhy) {
  if (gpuCount() < 1) {
    GTEST_SKIP() << "needs a CUDA device (0 visible)";
  }
  auto store = std::make_shared<InMemoryStore>();
  auto res = bagua::testing::runRanks(
      2,
      [&](int r) -> std::string {
        ProcessGroupOptions o;
        o.rank = r;
        o.worldSize = 2;
        o.backend = Backend::kNccl;
        o.hierarchical = false;
        o.cudaDevice = 0;  // both
        o.rendezvousTimeout = 60000ms;
        auto pg = ProcessGroup::create(store, o);
        return pg.isOk() ? std::string("created") : pg.status().toString();
      },
      120s);
  for (const std::string& e : res) {
    EXPECT_NE(e.find("invalid usage"), std::string::npos) << e;
    EXPECT_NE(e.find("Duplicate GPU"), std::string::npos) << e;  // NCCL's last WARN
    EXPECT_NE(e.find("NCCL_HOSTID"), std::string::npos) << e;
  }
}

TEST(Nccl, ReportsMissingDeviceClearly) {
  if (gpuCount() > 0) {
    GTEST_SKIP() << "a GPU is visible: this test checks the error without one";
  }
  auto store = std::make_shared<InMemoryStore>();
  ProcessGroupOptions o;
  o.backend = Backend::kNccl;
  o.hierarchical = false;
  auto pg = ProcessGroup::create(store, o);
  ASSERT_FALSE(pg.isOk());
  EXPECT_NE(pg.status().message().find("device"), std::string::npos) << pg.status().toString();
}

}  // namespace
}  // namespace bagua::core
