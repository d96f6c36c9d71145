// Shared set-up for tests on the NCCL backend (ranks as threads, one GPU each): how many devices
// are visible, a device buffer freed at scope exit, and a rank's process group (NCCL, or the host
// backend for the reference run the device run is compared with).
// Header only: included by the CUDA test executables, built where CUDA and NCCL are found.
//
// Thread safety: call rankGroup/ncclGroup/withNcclGroup from the rank's own thread
// (testing::runRanks); it selects the rank's device for that thread.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>

#include "bagua/core/process_group.h"
#include "bagua/core/store.h"

namespace bagua::testing {

// CUDA devices visible to this process (0 when CUDA cannot be initialised).
inline int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// Device buffer of n floats (p is null when cudaMalloc failed), freed at scope exit.
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

// Rank `rank` of a `world`-rank group on `store` (60 s to rendezvous, `collectiveTimeout` per
// collective): over NCCL on device `rank`, selected for the calling thread too (device), else
// on the host backend; `hierarchical` adds the intra-/inter-node sub-groups.
inline Result<std::unique_ptr<core::ProcessGroup>> rankGroup(
    std::shared_ptr<core::Store> store, int rank, int world, bool device, bool hierarchical = false,
    std::chrono::milliseconds collectiveTimeout = std::chrono::milliseconds(60000)) {
  core::ProcessGroupOptions o;
  o.rank = rank;
  o.worldSize = world;
  o.backend = device ? core::Backend::kNccl : core::Backend::kHost;
  o.hierarchical = hierarchical;
  o.cudaDevice = device ? rank : -1;
  o.rendezvousTimeout = std::chrono::milliseconds(60000);
  o.collectiveTimeout = collectiveTimeout;
  auto pg = core::ProcessGroup::create(std::move(store), o);
  if (pg.isOk() && device) {
    cudaSetDevice(rank);
  }
  return pg;
}

// Rank `rank` of a flat NCCL group (rankGroup on the device).
inline Result<std::unique_ptr<core::ProcessGroup>> ncclGroup(
    std::shared_ptr<core::Store> store, int rank, int world,
    std::chrono::milliseconds collectiveTimeout = std::chrono::milliseconds(60000)) {
  return rankGroup(std::move(store), rank, world, /*device=*/true, /*hierarchical=*/false,
                   collectiveTimeout);
}

// body(global communicator) on rank `rank`'s ncclGroup; the group's error text when it cannot
// be made, else what body returns ("" = passed).
template <typename F>
std::string withNcclGroup(
    std::shared_ptr<core::Store> store, int rank, int world, F&& body,
    std::chrono::milliseconds collectiveTimeout = std::chrono::milliseconds(60000)) {
  auto pg = ncclGroup(std::move(store), rank, world, collectiveTimeout);
  if (!pg.isOk()) {
    return pg.status().toString();
  }
  return body((*pg)->global());
}

}  // namespace bagua::testing
