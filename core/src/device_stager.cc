#include "device_stager.h"

#include <thread>

#include "cuda_backend.h"

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

// ---- Device paths: CUDA runtime calls through the CUDA half (cuda_backend.h) -----------------

namespace {

// The CUDA half. Device buckets exist only after checkDevice() accepted a tensor on an NCCL
// process group, whose communicator came from the registered CUDA half.
Result<CudaBackend*> cuda() {
  if (CudaBackend* b = registeredCudaBackend()) {
    return b;
  }
  return BAGUA_ERROR(kInternal, "a device bucket without the CUDA half of core loaded");
}

// Returns a failed Status of a CUDA call from the enclosing function, with printf-style context.
#define BAGUA_STAGER_CHECK(expr, ...)                     \
  do {                                                    \
    ::bagua::Status stager_status_ = (expr);              \
    if (!stager_status_.isOk()) {                         \
      stager_status_.withContext(strPrintf(__VA_ARGS__)); \
      return stager_status_;                              \
    }                                                     \
  } while (0)

// Polls an event until it completed or the deadline passed (never an unbounded wait). The first
// 200 us spin (a yield between queries): a bucket's event usually fires within a few kernels of
// the query, and every microsecond here delays the bucket's collective; then 20 us sleeps.
Status pollEvent(CudaBackend& rt, CUevent_st* ev, Clock::time_point deadline, const char* what) {
  const Clock::time_point spinUntil = Clock::now() + std::chrono::microseconds(200);
  while (true) {
    Result<bool> done = rt.queryEvent(ev);
    if (!done.isOk()) {
      Status s = done.status();
      s.withContext(what);
      return s;
    }
    if (*done) {
      return Status::ok();
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
  CudaBackend* rt = registeredCudaBackend();
  if (rt == nullptr) {
    return;  // no device bucket was ever made
  }
  if (copyDevice_ >= 0) {
    (void)rt->setDevice(copyDevice_);
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
  Result<CudaBackend*> rt = cudaBackend();
  if (!rt.isOk()) {
    Status s = rt.status();
    s.withContext(strPrintf("%s lives on cuda:%d", name.c_str(), device.index));
    return s;
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
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  const int bi = b.index;
  BAGUA_STAGER_CHECK(rt->setDevice(b.device.index), "bucket %d", bi);
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
  Result<CUevent_st*> ev = rt->createEvent();
  BAGUA_STAGER_CHECK(ev.status(), "bucket %d", bi);
  layout.copied[bi] = *ev;
  if (b.inPlace) {
    return Status::ok();  // the trainer's memory (Parameter::gradHome): neither ours nor zeroed
  }
  Result<void*> mem = rt->malloc(b.bytes() + 64);
  BAGUA_STAGER_CHECK(mem.status(), "bucket %d: %zu bytes on cuda:%d", bi, b.bytes() + 64,
                     b.device.index);
  layout.device[bi] = *mem;
  b.flat = layout.device[bi];
  return deviceZero(b, b.flat, b.bytes());
}

void DeviceStager::release(Layout& layout) {
  CudaBackend* rt = registeredCudaBackend();
  if (rt != nullptr) {
    for (CUevent_st* ev : layout.copied) {
      rt->destroyEvent(ev);
    }
    for (void* m : layout.device) {
      rt->free(m);
    }
  }
  layout = Layout{};
}

Status DeviceStager::deviceCopy(const Bucket& bucket, void* dst, const void* src, size_t bytes,
                                CUstream_st* stream) {
  // On the trainer's stream: after the kernel that wrote the gradient, with no event and no
  // cross-stream wait (two runtime calls per gradient; torch DDP copies on it too).
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  BAGUA_STAGER_CHECK(rt->setDevice(bucket.device.index), "bucket %d", bucket.index);
  if (bytes > 0) {
    BAGUA_STAGER_CHECK(rt->copyAsync(dst, src, bytes, stream), "bucket %d, %zu bytes", bucket.index,
                       bytes);
  }
  return Status::ok();
}

Status DeviceStager::deviceZero(const Bucket& bucket, void* dst, size_t bytes) {
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  BAGUA_STAGER_CHECK(rt->setDevice(bucket.device.index), "bucket %d", bucket.index);
  BAGUA_STAGER_CHECK(rt->zeroAsync(dst, bytes, trainerStream_), "bucket %d, %zu bytes",
                     bucket.index, bytes);
  return Status::ok();
}

Status DeviceStager::deviceMarkReady(const Bucket& bucket) {
  // After the bucket's copies (and, for bucket views, the kernels that wrote the gradients).
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  BAGUA_STAGER_CHECK(rt->setDevice(bucket.device.index), "bucket %d", bucket.index);
  BAGUA_STAGER_CHECK(rt->recordEvent(current_.copied[bucket.index], trainerStream_), "bucket %d",
                     bucket.index);
  return Status::ok();
}

Status DeviceStager::deviceWaitReady(const Bucket& bucket, Clock::time_point deadline) {
  // The bucket thread issues the algorithm's device work: it must run on the bucket's device.
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  BAGUA_STAGER_CHECK(rt->setDevice(bucket.device.index), "bucket %d", bucket.index);
  return pollEvent(*rt, current_.copied[bucket.index], deadline,
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
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  BAGUA_STAGER_CHECK(rt->setDevice(device), "waiting for the trainer's stream");
  Result<CUevent_st*> ev = rt->createEvent();
  BAGUA_STAGER_CHECK(ev.status(), "trainer stream");
  Status s = rt->recordEvent(*ev, trainerStream_);
  if (!s.isOk()) {
    s.withContext("recording an event on the trainer's stream");
  } else {
    s = pollEvent(*rt, *ev, Clock::now() + timeout, "waiting for the trainer's stream");
  }
  rt->destroyEvent(*ev);
  return s;
}

Status DeviceStager::broadcastHostI64(Communicator& comm, int device, int64_t* data, size_t count,
                                      std::chrono::milliseconds timeout) {
  if (comm.backendName() != "nccl") {
    return comm.broadcast(data, count, DataType::kI64, 0)->wait(timeout);
  }
  // NCCL reads device memory only: stage through the communicator's device.
  BAGUA_ASSIGN_OR_RETURN(CudaBackend * rt, cuda());
  const size_t bytes = count * sizeof(int64_t);
  BAGUA_STAGER_CHECK(rt->setDevice(device), "broadcast staging");
  Result<void*> staging = rt->malloc(bytes > 0 ? bytes : 8);
  BAGUA_STAGER_CHECK(staging.status(), "broadcast staging: %zu bytes", bytes);
  Status s = rt->copyToDevice(*staging, data, bytes);
  if (s.isOk()) {
    s = rt->synchronizeDefaultStream();
  }
  if (!s.isOk()) {
    s.withContext(strPrintf("broadcast staging to cuda:%d", device));
  }
  if (s.isOk()) {
    s = comm.broadcast(*staging, count, DataType::kI64, 0)->wait(timeout);
  }
  if (s.isOk()) {
    s = rt->copyToHost(data, *staging, bytes);
    if (!s.isOk()) {
      s.withContext(strPrintf("broadcast staging from cuda:%d", device));
    }
  }
  rt->free(*staging);
  return s;
}

#undef BAGUA_STAGER_CHECK

}  // namespace bagua::core
