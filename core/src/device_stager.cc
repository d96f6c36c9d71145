#include "device_stager.h"

#include <thread>

#if BAGUA_CORE_WITH_NCCL
#include <cuda_runtime.h>

#include "bagua/base/cuda_check.h"
#endif

namespace bagua::core {

using Clock = std::chrono::steady_clock;

// ---- Host and shared paths ---------------------------------------------------------------------

Status DeviceStager::allocate(std::vector<Bucket>& buckets) {
  release(next_);  // a layout allocated by a failed rebuild and never committed
  next_.host.resize(buckets.size());
  next_.device.assign(buckets.size(), nullptr);
  next_.copied.assign(buckets.size(), nullptr);
  for (Bucket& b : buckets) {
    if (b.device.type == DeviceType::kCpu) {
      if (b.inPlace) {
        continue;  // the trainer's memory (Parameter::gradHome)
      }
      next_.host[b.index].assign(b.bytes() + 64, 0);
      b.flat = next_.host[b.index].data();
      continue;
    }
    Status s = allocateDevice(b, next_);
    if (!s.isOk()) {
      release(next_);
      return s;
    }
  }
  return Status::ok();
}

void DeviceStager::commit() {
  release(current_);
  current_ = std::move(next_);
  next_ = Layout{};
}

#if BAGUA_CORE_WITH_NCCL

// ---- Device paths ------------------------------------------------------------------------------

namespace {

// Polls an event until it completed or the deadline passed (never an unbounded wait). The first
// 200 us spin (a yield between queries): a bucket's event usually fires within a few kernels of
// the query, and every microsecond here delays the bucket's collective; then 20 us sleeps.
Status pollEvent(cudaEvent_t ev, Clock::time_point deadline, const char* what) {
  const Clock::time_point spinUntil = Clock::now() + std::chrono::microseconds(200);
  while (true) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) {
      return Status::ok();
    }
    if (e != cudaErrorNotReady) {
      return cudaStatus(e, what, __FILE__, __LINE__);
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      return BAGUA_ERROR(kDeadlineExceeded, "%s: the device did not get there in time", what);
    }
    if (now < spinUntil) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace

DeviceStager::~DeviceStager() {
  if (copyDevice_ >= 0) {
    cudaSetDevice(copyDevice_);
  }
  // cudaFree waits for the device's outstanding work (copies into the buckets included).
  release(next_);
  release(current_);
}

Status DeviceStager::checkDevice(const std::string& name, const Device& device,
                                 const std::string& backend) const {
  if (backend != "nccl") {
    return BAGUA_ERROR(kInvalidArgument,
                       "%s lives on cuda:%d but the process group's backend is %s: device "
                       "tensors need the NCCL backend (ProcessGroupOptions::backend = kNccl)",
                       name.c_str(), device.index, backend.c_str());
  }
  if (copyDevice_ >= 0 && device.index != copyDevice_) {
    return BAGUA_ERROR(kInvalidArgument,
                       "%s lives on cuda:%d, other tensors on cuda:%d: one process reduces the "
                       "tensors of one device",
                       name.c_str(), device.index, copyDevice_);
  }
  return Status::ok();
}

Status DeviceStager::allocateDevice(Bucket& b, Layout& layout) {
  const int bi = b.index;
  BAGUA_CHECK_CUDA(cudaSetDevice(b.device.index), "bucket %d", bi);
  if (copyDevice_ < 0) {
    copyDevice_ = b.device.index;
  }
  if (b.device.index != copyDevice_) {
    return BAGUA_ERROR(kInvalidArgument,
                       "bucket %d is on cuda:%d, others on cuda:%d: one process reduces the "
                       "tensors of one device",
                       bi, b.device.index, copyDevice_);
  }
  layout.anyDevice = true;
  BAGUA_CHECK_CUDA(cudaEventCreateWithFlags(&layout.copied[bi], cudaEventDisableTiming),
                   "bucket %d", bi);
  if (b.inPlace) {
    return Status::ok();  // the trainer's memory (Parameter::gradHome): neither ours nor zeroed
  }
  BAGUA_CHECK_CUDA(cudaMalloc(&layout.device[bi], b.bytes() + 64),
                   "bucket %d: %zu bytes on cuda:%d", bi, b.bytes() + 64, b.device.index);
  b.flat = layout.device[bi];
  return deviceZero(b, b.flat, b.bytes());
}

void DeviceStager::release(Layout& layout) {
  for (CUevent_st* ev : layout.copied) {
    if (ev != nullptr) {
      cudaEventDestroy(ev);
    }
  }
  for (void* m : layout.device) {
    if (m != nullptr) {
      cudaFree(m);
    }
  }
  layout = Layout{};
}

Status DeviceStager::deviceCopy(const Bucket& bucket, void* dst, const void* src, size_t bytes,
                                CUstream_st* stream) {
  // On the trainer's stream: after the kernel that wrote the gradient, with no event and no
  // cross-stream wait (two runtime calls per gradient; torch DDP copies on it too).
  BAGUA_CHECK_CUDA(cudaSetDevice(bucket.device.index), "bucket %d", bucket.index);
  if (bytes > 0) {
    BAGUA_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                     "bucket %d, %zu bytes", bucket.index, bytes);
  }
  return Status::ok();
}

Status DeviceStager::deviceZero(const Bucket& bucket, void* dst, size_t bytes) {
  BAGUA_CHECK_CUDA(cudaSetDevice(bucket.device.index), "bucket %d", bucket.index);
  BAGUA_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, trainerStream_), "bucket %d, %zu bytes",
                   bucket.index, bytes);
  return Status::ok();
}

Status DeviceStager::deviceMarkReady(const Bucket& bucket) {
  // After the bucket's copies (and, for bucket views, the kernels that wrote the gradients).
  BAGUA_CHECK_CUDA(cudaSetDevice(bucket.device.index), "bucket %d", bucket.index);
  BAGUA_CHECK_CUDA(cudaEventRecord(current_.copied[bucket.index], trainerStream_), "bucket %d",
                   bucket.index);
  return Status::ok();
}

Status DeviceStager::deviceWaitReady(const Bucket& bucket, Clock::time_point deadline) {
  // The bucket thread issues the algorithm's device work: it must run on the bucket's device.
  BAGUA_CHECK_CUDA(cudaSetDevice(bucket.device.index), "bucket %d", bucket.index);
  return pollEvent(current_.copied[bucket.index], deadline,
                   "waiting for the gradients copied into a device bucket");
}

Status DeviceStager::releaseToTrainer() {
  // The copy-backs are on the trainer's stream already, and the host saw every collective
  // finish before issuing them: nothing to order.
  return Status::ok();
}

Status DeviceStager::waitForTrainerStream(const std::vector<const Parameter*>& tensors,
                                          std::chrono::milliseconds timeout) {
  int device = -1;
  for (const Parameter* p : tensors) {
    if (p->device.type != DeviceType::kCpu) {
      device = p->device.index;
      break;
    }
  }
  if (device < 0) {
    return Status::ok();
  }
  BAGUA_CHECK_CUDA(cudaSetDevice(device), "waiting for the trainer's stream");
  cudaEvent_t ev = nullptr;
  BAGUA_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "trainer stream");
  Status s;
  if (cudaEventRecord(ev, trainerStream_) != cudaSuccess) {
    (void)cudaGetLastError();
    s = BAGUA_ERROR(kCudaError, "recording an event on the trainer's stream failed");
  } else {
    s = pollEvent(ev, Clock::now() + timeout, "waiting for the trainer's stream");
  }
  cudaEventDestroy(ev);
  return s;
}

Status DeviceStager::broadcastHostI64(Communicator& comm, int device, int64_t* data, size_t count,
                                      std::chrono::milliseconds timeout) {
  if (comm.backendName() != "nccl") {
    return comm.broadcast(data, count, DataType::kI64, 0)->wait(timeout);
  }
  // NCCL reads device memory only: stage through the communicator's device.
  const size_t bytes = count * sizeof(int64_t);
  BAGUA_CHECK_CUDA(cudaSetDevice(device), "broadcast staging");
  void* staging = nullptr;
  BAGUA_CHECK_CUDA(cudaMalloc(&staging, bytes > 0 ? bytes : 8), "%zu bytes", bytes);
  Status s;
  if (cudaMemcpy(staging, data, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    (void)cudaGetLastError();
    s = BAGUA_ERROR(kCudaError, "broadcast staging: copy to cuda:%d failed", device);
  }
  if (s.isOk() && cudaStreamSynchronize(nullptr) != cudaSuccess) {
    (void)cudaGetLastError();
    s = BAGUA_ERROR(kCudaError, "broadcast staging: synchronising cuda:%d failed", device);
  }
  if (s.isOk()) {
    s = comm.broadcast(staging, count, DataType::kI64, 0)->wait(timeout);
  }
  if (s.isOk() && cudaMemcpy(data, staging, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    (void)cudaGetLastError();
    s = BAGUA_ERROR(kCudaError, "broadcast staging: copy from cuda:%d failed", device);
  }
  cudaFree(staging);
  return s;
}

#else  // host-only build: no device tensor gets past checkDevice(), so no device bucket exists

namespace {

Status noDevice() {
  return BAGUA_ERROR(kInternal, "a device bucket in a build without CUDA");
}

}  // namespace

DeviceStager::~DeviceStager() = default;

Status DeviceStager::checkDevice(const std::string& name, const Device& device,
                                 const std::string& /*backend*/) const {
  return BAGUA_ERROR(kFailedPrecondition,
                     "%s lives on cuda:%d but bagua was built without NCCL/CUDA, so the reducer "
                     "flattens host buckets only (configure with -Dcuda=enabled -Dnccl=enabled)",
                     name.c_str(), device.index);
}
Status DeviceStager::allocateDevice(Bucket& /*bucket*/, Layout& /*layout*/) {
  return noDevice();
}
void DeviceStager::release(Layout& layout) {
  layout = Layout{};
}
Status DeviceStager::deviceCopy(const Bucket& /*bucket*/, void* /*dst*/, const void* /*src*/,
                                size_t /*bytes*/, CUstream_st* /*stream*/) {
  return noDevice();
}
Status DeviceStager::deviceZero(const Bucket& /*bucket*/, void* /*dst*/, size_t /*bytes*/) {
  return noDevice();
}
Status DeviceStager::deviceMarkReady(const Bucket& /*bucket*/) {
  return noDevice();
}
Status DeviceStager::deviceWaitReady(const Bucket& /*bucket*/, Clock::time_point /*deadline*/) {
  return noDevice();
}
Status DeviceStager::releaseToTrainer() {
  return Status::ok();
}
Status DeviceStager::waitForTrainerStream(const std::vector<const Parameter*>& /*tensors*/,
                                          std::chrono::milliseconds /*timeout*/) {
  return Status::ok();
}

Status DeviceStager::broadcastHostI64(Communicator& comm, int /*device*/, int64_t* data,
                                      size_t count, std::chrono::milliseconds timeout) {
  return comm.broadcast(data, count, DataType::kI64, 0)->wait(timeout);
}

#endif

}  // namespace bagua::core
