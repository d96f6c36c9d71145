#include "bagua/loader/host_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "bagua/base/cuda_half.h"
#include "bagua/base/logging.h"
#include "bagua/loader/params.h"
#include "cuda_host.h"

namespace bagua::loader {

namespace detail {

namespace {

// Constant-initialised, so the CUDA half's static initializer may register before any of the
// loader's own run.
constinit CudaHalf<CudaHost> half;

const CudaHalfSpec kSpec{
    .what = "CUDA pinned batch memory",
    .soname = BAGUA_LOADER_CUDA_SONAME,
    .library = "libbagua_loader",
    .links = BAGUA_LOADER_CUDA_LINKS,
    .needs = BAGUA_LOADER_CUDA_NEEDS,
    .configure = "-Dcuda=enabled",
    .instead = "the loader pins with mlock instead",
    .anchor = reinterpret_cast<const void*>(&registerCudaHost),
};

}  // namespace

void registerCudaHost(CudaHost* host) {
  half.set(host);
}

Result<CudaHost*> cudaHost() {
  return half.get(kSpec);
}

}  // namespace detail

namespace {

constexpr size_t kAlign = 64;

class MallocAllocator final : public HostAllocator {
 public:
  Result<void*> allocate(size_t bytes) override {
    // aligned_alloc needs a multiple of the alignment; 0 bytes still gets a unique pointer.
    size_t rounded = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      return BAGUA_ERROR(kResourceExhausted, "out of host memory allocating %zu bytes", bytes);
    }
    return p;
  }
  void deallocate(void* p, size_t /*bytes*/) override { std::free(p); }
  bool pinned() const override { return false; }
  const char* name() const override { return "malloc"; }
};

size_t pageRound(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t b = bytes == 0 ? 1 : bytes;
  return (b + page - 1) / page * page;
}

class MlockAllocator final : public HostAllocator {
 public:
  Result<void*> allocate(size_t bytes) override {
    size_t len = pageRound(bytes);
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return BAGUA_ERRNO(errno, strPrintf("mmap of %zu bytes for a pinned batch buffer", len));
    }
    if (mlock(p, len) != 0) {
      int err = errno;
      munmap(p, len);
      return BAGUA_ERROR(kResourceExhausted,
                         "mlock of %zu bytes for a pinned batch buffer failed (%s): the "
                         "locked-memory limit is too small; raise it (ulimit -l, or "
                         "LimitMEMLOCK= in systemd) or set BAGUA_LOADER_PIN_MEMORY=0",
                         len, std::strerror(err));
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    size_t len = pageRound(bytes);
    munlock(p, len);
    munmap(p, len);
  }
  bool pinned() const override { return true; }
  const char* name() const override { return "mlock"; }
};

HostAllocator* choosePinned() {
  Result<detail::CudaHost*> cuda = detail::cudaHost();
  if (cuda.isOk()) {
    std::string why;
    if (HostAllocator* a = (*cuda)->pinnedAllocator(&why)) {
      BAGUA_LOG_INFO(kLogLoader, "pinned batch memory: cudaHostAlloc");
      return a;
    }
    BAGUA_LOG_INFO(kLogLoader, "pinned batch memory: mlock (no CUDA device: %s)", why.c_str());
  } else {
    BAGUA_LOG_INFO(kLogLoader, "pinned batch memory: mlock (%s)", cuda.status().message().c_str());
  }
  static MlockAllocator mlocked;
  return &mlocked;
}

}  // namespace

HostAllocator& defaultHostAllocator() {
  static MallocAllocator a;
  return a;
}

HostAllocator& pinnedHostAllocator() {
  static HostAllocator* a = choosePinned();
  return *a;
}

// --- CachingHostAllocator -------------------------------------------------------------------

CachingHostAllocator::~CachingHostAllocator() {
  for (auto& [bytes, p] : free_) {
    base_.deallocate(p, bytes);
  }
}

Result<void*> CachingHostAllocator::allocate(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      cached_ -= bytes;
      ++hits_;
      return p;
    }
  }
  return base_.allocate(bytes);
}

void CachingHostAllocator::deallocate(void* p, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + bytes <= maxCached_) {
      free_.emplace(bytes, p);
      cached_ += bytes;
      return;
    }
  }
  base_.deallocate(p, bytes);
}

size_t CachingHostAllocator::cachedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

uint64_t CachingHostAllocator::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

// --- HostBuffer ------------------------------------------------------------------------------

Result<HostBuffer> HostBuffer::allocate(HostAllocator& allocator, size_t bytes) {
  BAGUA_ASSIGN_OR_RETURN(void* p, allocator.allocate(bytes));
  HostBuffer b;
  b.allocator_ = &allocator;
  b.data_ = p;
  b.size_ = bytes;
  return b;
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : allocator_(std::exchange(o.allocator_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    allocator_ = std::exchange(o.allocator_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void HostBuffer::reset() {
  if (allocator_ != nullptr && data_ != nullptr) {
    allocator_->deallocate(data_, size_);
  }
  allocator_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace bagua::loader
