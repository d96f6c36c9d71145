// Host memory for batches: an allocator interface and an owning buffer.
//
// Batches are packed by the collate function into a HostBuffer taken from the loader's
// HostAllocator. Plain memory comes from defaultHostAllocator(). For GPU copies, page-locked
// ("pinned") memory lets cudaMemcpyAsync run as DMA and overlap with compute:
// pinnedHostAllocator() gives CUDA's pinned memory (cudaHostAlloc) when bagua was built with
// CUDA and a device is present, and otherwise page-locked memory from mmap + mlock (never
// swapped; a CUDA user can register it with cudaHostRegister). Pinned allocation is slow (a
// system call and page faults), so the loader wraps it in a CachingHostAllocator that reuses
// freed blocks.
//
// Thread safety: allocators are thread-safe; a HostBuffer is a value owned by one thread at a
// time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "bagua/base/status.h"

namespace bagua::loader {

class HostAllocator {
 public:
  HostAllocator() = default;
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;
  virtual ~HostAllocator() = default;

  // At least `bytes` bytes aligned to 64, or ResourceExhausted/SystemError. bytes may be 0.
  [[nodiscard]] virtual Result<void*> allocate(size_t bytes) = 0;
  // Returns memory from allocate(bytes) with the same `bytes`.
  virtual void deallocate(void* p, size_t bytes) = 0;
  // True when the memory is page-locked.
  virtual bool pinned() const = 0;
  virtual const char* name() const = 0;
};

// malloc-backed, 64-byte aligned. Lives for the process.
HostAllocator& defaultHostAllocator();
// Page-locked memory (see the file comment). The first call decides CUDA or mlock and logs which;
// allocate() fails with a message naming `ulimit -l` when the lock limit is too small.
HostAllocator& pinnedHostAllocator();

// Keeps up to `maxCachedBytes` of freed blocks (by exact size) for reuse. Wraps `base`, which
// must outlive it.
class CachingHostAllocator final : public HostAllocator {
 public:
  CachingHostAllocator(HostAllocator& base, size_t maxCachedBytes)
      : base_(base), maxCached_(maxCachedBytes) {}
  ~CachingHostAllocator() override;

  Result<void*> allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  bool pinned() const override { return base_.pinned(); }
  const char* name() const override { return base_.name(); }

  size_t cachedBytes() const;
  uint64_t hits() const;

 private:
  HostAllocator& base_;
  size_t maxCached_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // guarded by mu_
  size_t cached_ = 0;                  // guarded by mu_
  uint64_t hits_ = 0;                  // guarded by mu_
};

// An owning buffer from a HostAllocator (move-only). The allocator must outlive the buffer.
class HostBuffer {
 public:
  HostBuffer() = default;
  static Result<HostBuffer> allocate(HostAllocator& allocator, size_t bytes);
  ~HostBuffer() { reset(); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;

  uint8_t* data() { return static_cast<uint8_t*>(data_); }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }
  bool pinned() const { return allocator_ != nullptr && allocator_->pinned(); }
  void reset();

 private:
  HostAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace bagua::loader
