#include "backend/host/shm_mesh.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "bagua/base/logging.h"
#include "bagua/core/params.h"

namespace bagua::core::host {

namespace {
constexpr size_t kLine = 64;

int msLeftShm(Deadline d) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(d - std::chrono::steady_clock::now())
          .count();
  return left <= 0 ? 1 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}
}  // namespace

struct ShmMesh::Ring {
  alignas(kLine) uint64_t head;  // written by the sender
  alignas(kLine) uint64_t tail;  // written by the receiver
  // ringBytes_ of data follow at offset 2 * kLine.
  uint8_t* data() { return reinterpret_cast<uint8_t*>(this) + 2 * kLine; }
};

ShmMesh::Ring* ShmMesh::ring(int from, int to) const {
  const size_t header = nLocal_ * kLine;
  const size_t ringSize = 2 * kLine + ringBytes_;
  const size_t index = static_cast<size_t>(from) * nLocal_ + static_cast<size_t>(to);
  return reinterpret_cast<Ring*>(base_ + header + index * ringSize);
}

uint32_t* ShmMesh::sleepFlag(int local) const {
  return reinterpret_cast<uint32_t*>(base_ + static_cast<size_t>(local) * kLine);
}

Result<std::unique_ptr<ShmMesh>> ShmMesh::create(Store& store, int rank,
                                                 const std::vector<int>& localRanks,
                                                 size_t ringBytes, Deadline deadline) {
  std::unique_ptr<ShmMesh> m(new ShmMesh());
  m->rank_ = rank;
  m->ringBytes_ = (ringBytes + kLine - 1) / kLine * kLine;
  m->nLocal_ = localRanks.size();
  int maxRank = 0;
  for (int r : localRanks) {
    maxRank = std::max(maxRank, r);
  }
  m->slot_.assign(static_cast<size_t>(maxRank) + 1, -1);
  for (size_t i = 0; i < localRanks.size(); ++i) {
    m->slot_[localRanks[i]] = static_cast<int>(i);
    if (localRanks[i] == rank) {
      m->me_ = static_cast<int>(i);
    }
  }
  m->mapBytes_ = m->nLocal_ * kLine + m->nLocal_ * m->nLocal_ * (2 * kLine + m->ringBytes_);
  const int leader = localRanks.front();
  const std::string nameKey = strPrintf("shm/name/%d", leader);
  std::string name;
  int fd = -1;
  if (rank == leader) {
    std::random_device rd;
    name = strPrintf("/bagua-%d-%08x%08x", static_cast<int>(::getpid()), rd(), rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      return BAGUA_ERRNO(errno, "shm_open(" + name + ")");
    }
    if (::ftruncate(fd, static_cast<off_t>(m->mapBytes_)) != 0) {
      int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      return BAGUA_ERRNO(err, strPrintf("sizing the shared-memory segment to %zu bytes (is "
                                        "/dev/shm big enough? BAGUA_HOST_SHM=0 turns it off)",
                                        m->mapBytes_));
    }
    BAGUA_RETURN_IF_ERROR(store.set(nameKey, toBytes(name)));
  } else {
    BAGUA_ASSIGN_OR_RETURN(Bytes b,
                           store.get(nameKey, std::chrono::milliseconds(msLeftShm(deadline))));
    name = toString(b);
    if (name == "-") {
      return BAGUA_ERROR(kUnavailable, "local leader rank %d could not create shared memory",
                         leader);
    }
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      return BAGUA_ERRNO(errno, "shm_open(" + name + ")");
    }
  }
  void* p = ::mmap(nullptr, m->mapBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    return BAGUA_ERRNO(errno, "mmap of the shared-memory segment");
  }
  m->base_ = static_cast<uint8_t*>(p);
  // Everyone mapped it: the leader removes the name (the memory lives while mapped).
  BAGUA_RETURN_IF_ERROR(store.set(strPrintf("shm/mapped/%d", rank), toBytes("1")));
  if (rank == leader) {
    std::vector<std::string> keys;
    for (int r : localRanks) {
      keys.push_back(strPrintf("shm/mapped/%d", r));
    }
    Status s = store.wait(keys, std::chrono::milliseconds(msLeftShm(deadline)));
    ::shm_unlink(name.c_str());
    BAGUA_RETURN_IF_ERROR(s);
  }
  BAGUA_LOG_DEBUG(kLogCore, "rank %d: shared-memory rings with %zu local ranks (%zu bytes)", rank,
                  m->nLocal_, m->mapBytes_);
  return m;
}

ShmMesh::~ShmMesh() {
  if (base_ != nullptr) {
    ::munmap(base_, mapBytes_);
  }
}

size_t ShmMesh::trySend(int peer, const uint8_t* data, size_t len) {
  Ring* r = ring(me_, slot_[peer]);
  std::atomic_ref<uint64_t> head(r->head);
  std::atomic_ref<uint64_t> tail(r->tail);
  const uint64_t h = head.load(std::memory_order_relaxed);
  const uint64_t t = tail.load(std::memory_order_acquire);
  size_t room = ringBytes_ - static_cast<size_t>(h - t);
  size_t n = std::min(room, len);
  if (n == 0) {
    return 0;
  }
  const size_t pos = static_cast<size_t>(h % ringBytes_);
  const size_t first = std::min(n, ringBytes_ - pos);
  std::memcpy(r->data() + pos, data, first);
  if (n > first) {
    std::memcpy(r->data(), data + first, n - first);
  }
  head.store(h + n, std::memory_order_release);
  return n;
}

size_t ShmMesh::tryRecv(int peer, uint8_t* data, size_t len) {
  Ring* r = ring(slot_[peer], me_);
  std::atomic_ref<uint64_t> head(r->head);
  std::atomic_ref<uint64_t> tail(r->tail);
  const uint64_t t = tail.load(std::memory_order_relaxed);
  const uint64_t h = head.load(std::memory_order_acquire);
  size_t n = std::min(static_cast<size_t>(h - t), len);
  if (n == 0) {
    return 0;
  }
  const size_t pos = static_cast<size_t>(t % ringBytes_);
  const size_t first = std::min(n, ringBytes_ - pos);
  std::memcpy(data, r->data() + pos, first);
  if (n > first) {
    std::memcpy(data + first, r->data(), n - first);
  }
  tail.store(t + n, std::memory_order_release);
  return n;
}

bool ShmMesh::canSend(int peer) const {
  Ring* r = ring(me_, slot_[peer]);
  return std::atomic_ref<uint64_t>(r->head).load(std::memory_order_relaxed) -
             std::atomic_ref<uint64_t>(r->tail).load(std::memory_order_seq_cst) <
         ringBytes_;
}

bool ShmMesh::canRecv(int peer) const {
  Ring* r = ring(slot_[peer], me_);
  return std::atomic_ref<uint64_t>(r->head).load(std::memory_order_seq_cst) !=
         std::atomic_ref<uint64_t>(r->tail).load(std::memory_order_relaxed);
}

void ShmMesh::setSleeping(bool sleeping) {
  std::atomic_ref<uint32_t>(*sleepFlag(me_)).store(sleeping ? 1u : 0u, std::memory_order_seq_cst);
}

bool ShmMesh::takeWake(int peer) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t> flag(*sleepFlag(slot_[peer]));
  if (flag.load(std::memory_order_seq_cst) == 0) {
    return false;
  }
  return flag.exchange(0, std::memory_order_seq_cst) != 0;
}

}  // namespace bagua::core::host
