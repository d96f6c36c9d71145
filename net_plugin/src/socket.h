// Small socket helpers: an owning fd, socket options, non-blocking partial reads/writes for
// connection set-up and the control streams. The blocking whole-buffer loop is public:
// bagua/net/socket_io.h (core's sockets use it too).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "bagua/base/status.h"
#include "bagua/net/engine.h"
#include "bagua/net/socket_io.h"

namespace bagua::net {

// Owns a file descriptor; move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

Status setNonBlocking(int fd, bool nonBlocking);
// TCP_NODELAY, SO_SNDBUF/SO_RCVBUF, keepalive and TCP_USER_TIMEOUT from the options.
Status setStreamOptions(int fd, const EngineOptions& options);

// Non-blocking: sends/receives what the socket takes now, advancing *done. Ok with no progress on
// EAGAIN; kRemoteError on EOF.
Status sendSome(int fd, const uint8_t* data, size_t length, size_t* done);
// With `eof` given, an orderly close sets *eof and returns Ok instead of kRemoteError.
Status recvSome(int fd, uint8_t* data, size_t length, size_t* done, bool* eof = nullptr);
// Non-blocking gather send: sends what the socket takes now from the iovecs, skipping the first
// *done bytes of them, and advances *done.
Status sendSomeV(int fd, const iovec* iov, int iovcnt, size_t* done);

// 64 random bits (getrandom, with a time/pid fallback).
uint64_t randomU64();

}  // namespace bagua::net
