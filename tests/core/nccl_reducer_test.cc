// The reducer on device tensors over NCCL (device buckets, copies on the trainer's stream, the
// rebuild's broadcast staged through the device, stepping inside backward, device order against
// a held trainer stream); runs on one GPU as well. Skipped (with the reason) where no GPU is
// visible; the lead runs it on the GPU machine.
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
#include "nccl_ranks.h"

namespace bagua::core {
namespace {

using namespace std::chrono_literals;
using bagua::testing::DeviceFloats;
using bagua::testing::gpuCount;
using bagua::testing::ncclGroup;

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
        auto pg = ncclGroup(store, r, world);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
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
        auto pg = ncclGroup(store, r, world);
        if (!pg.isOk()) {
          return pg.status().toString();
        }
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

}  // namespace
}  // namespace bagua::core
