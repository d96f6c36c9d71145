// Shared-memory rings between the ranks of one host, used by the socket transport for its local
// peers: one byte ring per ordered pair (sender -> receiver) in one POSIX shared-memory segment
// per host. A transfer is one copy in and one copy out with no system call, where loopback TCP
// costs two copies plus the kernel's stack (NCCL's SHM transport idea, in its simplest form).
//
// The TCP mesh stays up next to it: it carries the wake-up bytes for a peer that sleeps in
// poll() (the "sleeping" flag below) and it is how a dead peer is noticed (its socket closes).
//
// Layout: per local rank a 64-byte line with its sleeping flag; per ordered pair a header with
// head (bytes written) and tail (bytes consumed) on separate cache lines, then `ringBytes` of
// data. head/tail only grow; head - tail <= ringBytes.
//
// Thread safety: one thread per process drives a ShmMesh (the transport's caller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/host/transport.h"
#include "bagua/base/status.h"
#include "bagua/core/store.h"

namespace bagua::core::host {

class ShmMesh {
 public:
  // `localRanks`: the ranks on this host, sorted, including `rank`. The lowest creates the
  // segment and unlinks it once every local rank has mapped it (so nothing is left behind).
  static Result<std::unique_ptr<ShmMesh>> create(Store& store, int rank,
                                                 const std::vector<int>& localRanks,
                                                 size_t ringBytes, Deadline deadline);
  ~ShmMesh();
  ShmMesh(const ShmMesh&) = delete;
  ShmMesh& operator=(const ShmMesh&) = delete;

  bool isLocal(int peer) const {
    return peer >= 0 && peer < static_cast<int>(slot_.size()) && slot_[peer] >= 0;
  }
  // Copies as much of [data, data+len) as the ring to `peer` has room for; returns the bytes.
  size_t trySend(int peer, const uint8_t* data, size_t len);
  // Copies up to len bytes that `peer` has written; returns the bytes.
  size_t tryRecv(int peer, uint8_t* data, size_t len);
  bool canSend(int peer) const;
  bool canRecv(int peer) const;

  // Marks me as about to sleep (seq_cst), or awake.
  void setSleeping(bool sleeping);
  // After changing a ring shared with `peer`: true if it was asleep (the flag is cleared), so
  // the caller must wake it.
  bool takeWake(int peer);

 private:
  ShmMesh() = default;
  struct Ring;
  Ring* ring(int from, int to) const;
  uint32_t* sleepFlag(int local) const;

  int rank_ = 0;
  int me_ = 0;             // my local index
  std::vector<int> slot_;  // global rank -> local index or -1
  size_t ringBytes_ = 0;
  size_t nLocal_ = 0;
  uint8_t* base_ = nullptr;
  size_t mapBytes_ = 0;
};

}  // namespace bagua::core::host
