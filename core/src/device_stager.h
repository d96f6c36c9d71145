// The reducer's bucket storage and every copy into and out of it (core-private: ddp.cc only).
//
// Host buckets are plain host memory and memcpy. Device buckets (builds with NCCL and CUDA) are
// one cudaMalloc'd allocation each. An in-place bucket (Bucket::inPlace) is the trainer's own
// memory (Parameter::gradHome) and gets no storage here, only its event. Gradients are copied in
// and out with cudaMemcpyAsync on the trainer's stream, never through host memory: a copy-in is
// ordered after the kernel that wrote the gradient with no event or cross-stream wait (as torch
// DDP does; an earlier version used a copy stream and an event record + stream wait per
// gradient, four runtime calls instead of two). Each device bucket has a "gradients copied"
// event: markReady() records it on the trainer's stream once the bucket's last gradient was
// copied, and the bucket's collective waits for it (on the device, orderCommAfterCopies, or on
// the host, waitReady). The copy-backs are enqueued on the trainer's stream after it was made
// to wait for the collectives (or after the host saw them finish), so the trainer reads the
// reduced gradients in stream order. All the CUDA state lives here, so that bagua/core/ddp.h
// holds none of it.
//
// Layouts: allocate() gives a new bucket list its storage while the previous layout's storage
// stays valid (a rebuild copies gradients that are views into the old buckets); commit() then
// frees the previous layout. A failed allocate() leaves the current layout as it was.
//
// Thread model: the trainer's thread calls everything except waitReady(), which the reducer's
// bucket thread ("bagua-bucket") calls for the bucket it is about to run. The trainer records a
// bucket's event (markReady) before queueing the bucket and does not touch it again until the
// iteration's buckets are done, and the layout changes only between iterations, so no lock is
// needed. One process stages the tensors of one device.
//
// The CUDA runtime calls go through the CUDA half of core (cuda_backend.h), so that
// libbagua_core links no CUDA library: checkDevice() loads it (or says why it cannot) before a
// device tensor is accepted, and the device paths run only after that.
//
// Errors: CUDA failures are kCudaError naming the call and the bucket; waits on the device past
// their deadline are kDeadlineExceeded. Without the CUDA half (a build without CUDA/NCCL, or
// libbagua_core_cuda not installed), device tensors are refused by checkDevice().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"
#include "bagua/core/communicator.h"
#include "bagua/core/parameter.h"

// The CUDA runtime's handle types (cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*),
// declared so that this header needs no CUDA headers.
struct CUstream_st;
struct CUevent_st;

namespace bagua::core {

class DeviceStager {
 public:
  // `trainerStream`: the stream the trainer produces and reads gradients on
  // (DdpOptions::cudaStream; null: the legacy default stream). Borrowed.
  explicit DeviceStager(CUstream_st* trainerStream) : trainerStream_(trainerStream) {}
  // Frees both layouts and their events (cudaFree waits for the device's pending copies).
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  // Whether a tensor on `device` can be staged: device tensors need the NCCL backend
  // (`backend` is the process group's), the CUDA half of core, and the device of the others.
  Status checkDevice(const std::string& name, const Device& device,
                     const std::string& backend) const;

  // Gives every bucket zeroed storage (Bucket::flat); see "Layouts" above.
  Status allocate(std::vector<Bucket>& buckets);
  void commit();

  // ---- Hot path, trainer thread -------------------------------------------------------------
  // A gradient into its bucket slot. Device: asynchronous on the trainer's stream (after
  // everything it enqueued so far).
  Status copyIn(const Bucket& bucket, void* slot, const void* grad, size_t bytes) {
    if (bucket.device.type == DeviceType::kCpu) {
      hostCopy(slot, grad, bytes);
      return Status::ok();
    }
    return deviceCopy(bucket, slot, grad, bytes, trainerStream_);
  }
  // A reduced bucket slot back into the gradient (same ordering as copyIn).
  Status copyOut(const Bucket& bucket, void* grad, const void* slot, size_t bytes) {
    if (bucket.device.type == DeviceType::kCpu) {
      hostCopy(grad, slot, bytes);
      return Status::ok();
    }
    return deviceCopy(bucket, grad, slot, bytes, trainerStream_);
  }
  // A reduced device bucket slot back into the gradient on `stream` instead of the trainer's
  // (stepping inside the backward pass: the caller ordered `stream` after the reduction).
  Status copyOutOn(const Bucket& bucket, void* grad, const void* slot, size_t bytes,
                   CUstream_st* stream) {
    return deviceCopy(bucket, grad, slot, bytes, stream);
  }
  // A device gradient that is a bucket view: the trainer wrote it into the bucket on its
  // stream, so only the order is needed (the bucket's event comes after the trainer's work).
  Status orderAfterTrainer(const Bucket& bucket) {
    if (bucket.device.type == DeviceType::kCpu) {
      return Status::ok();
    }
    return deviceCopy(bucket, nullptr, nullptr, 0, trainerStream_);
  }
  Status zero(const Bucket& bucket, void* dst, size_t bytes) {
    if (bucket.device.type == DeviceType::kCpu) {
      std::memset(dst, 0, bytes);
      return Status::ok();
    }
    return deviceZero(bucket, dst, bytes);
  }
  // Every gradient of the bucket has been copied in (device: records the bucket's event).
  Status markReady(const Bucket& bucket) {
    return bucket.device.type == DeviceType::kCpu ? Status::ok() : deviceMarkReady(bucket);
  }
  // After the iteration's copy-backs (kept as the hand-over point; the copies are on the
  // trainer's stream, so there is nothing left to order).
  Status releaseToTrainer();

  // Device order instead of host waits (buckets launched as one collective): `comm`'s next
  // collectives start after the bucket's copies (bucket thread), and the trainer's stream runs
  // its later work after every collective `comm` has issued (trainer thread, finishBackward).
  Status orderCommAfterCopies(const Bucket& bucket, Communicator& comm) {
    return comm.afterEvent(current_.copied[static_cast<size_t>(bucket.index)]);
  }
  Status orderTrainerAfter(Communicator& comm) { return comm.orderStream(trainerStream_); }

  // ---- Bucket thread -------------------------------------------------------------------------
  // Waits (polling, until `deadline`) until the bucket's copies are done, and makes the calling
  // thread current on the bucket's device (the algorithm issues device work from it).
  Status waitReady(const Bucket& bucket, std::chrono::steady_clock::time_point deadline) {
    return bucket.device.type == DeviceType::kCpu ? Status::ok()
                                                  : deviceWaitReady(bucket, deadline);
  }

  // ---- Set-up paths, trainer thread ----------------------------------------------------------
  // Device parameters or buffers: waits (bounded) until the trainer's stream has written them,
  // before a collective on another stream reads them. No-op for host tensors.
  Status waitForTrainerStream(const std::vector<const Parameter*>& tensors,
                              std::chrono::milliseconds timeout);
  // Broadcasts host int64 values from rank 0 of `comm`. NCCL reads device memory only, so over
  // NCCL they are staged through `device` (a temporary allocation).
  Status broadcastHostI64(Communicator& comm, int device, int64_t* data, size_t count,
                          std::chrono::milliseconds timeout);

 private:
  // One layout's storage, by bucket index.
  struct Layout {
    std::vector<std::vector<uint8_t>> host;  // empty for device buckets
    std::vector<void*> device;               // cudaMalloc'd; null for host buckets
    std::vector<CUevent_st*> copied;         // "gradients copied"; null for host buckets
    bool anyDevice = false;
  };

  static void hostCopy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) {
      std::memcpy(dst, src, bytes);
    }
  }
  Status allocateDevice(Bucket& bucket, Layout& layout);
  void release(Layout& layout);
  Status deviceCopy(const Bucket& bucket, void* dst, const void* src, size_t bytes,
                    CUstream_st* stream);
  Status deviceZero(const Bucket& bucket, void* dst, size_t bytes);
  Status deviceMarkReady(const Bucket& bucket);
  Status deviceWaitReady(const Bucket& bucket, std::chrono::steady_clock::time_point deadline);

  CUstream_st* const trainerStream_;
  // The device of the first device bucket; one device per process.
  int copyDevice_ = -1;
  Layout current_;
  Layout next_;  // allocated, not yet committed
};

}  // namespace bagua::core
