#include "bagua/net/socket_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace bagua::net {

namespace {

// Drops the first `n` bytes from the iovecs, and with them every entry left empty (a leading
// zero-length entry would otherwise make sendmsg report no progress forever).
void consume(iovec*& iov, int& iovcnt, size_t n) {
  while (iovcnt > 0 && n >= iov->iov_len) {
    n -= iov->iov_len;
    ++iov;
    --iovcnt;
  }
  if (iovcnt > 0) {
    iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + n;
    iov->iov_len -= n;
  }
}

}  // namespace

Status transferAllV(int fd, IoDirection direction, iovec* iov, int iovcnt,
                    IoClock::time_point deadline, bool* cleanEof) {
  const bool send = direction == IoDirection::kSend;
  const bool bounded = deadline != kNoDeadline;
  const char* what = send ? "send" : "recv";
  if (cleanEof != nullptr) {
    *cleanEof = false;
  }
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    total += iov[i].iov_len;
  }
  // Bounded: never block inside the call, so that the wait below can stop at the deadline.
  const int flags =
      send ? (MSG_NOSIGNAL | (bounded ? MSG_DONTWAIT : 0)) : (bounded ? MSG_DONTWAIT : MSG_WAITALL);
  size_t moved = 0;
  consume(iov, iovcnt, 0);
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    const ssize_t n = send ? ::sendmsg(fd, &msg, flags) : ::recvmsg(fd, &msg, flags);
    if (n > 0) {
      moved += static_cast<size_t>(n);
      consume(iov, iovcnt, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 && !send) {
      if (moved == 0 && cleanEof != nullptr) {
        *cleanEof = true;
      }
      return BAGUA_ERROR(kRemoteError, "connection closed by peer after %zu of %zu bytes", moved,
                         total);
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return BAGUA_ERRNO(errno, what);
    }
    // No room (send) or no data (recv) yet.
    int waitMs = -1;
    if (bounded) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - IoClock::now()).count();
      if (left <= 0) {
        return BAGUA_ERROR(kDeadlineExceeded, "%s timed out after %zu of %zu bytes", what, moved,
                           total);
      }
      waitMs = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    pollfd p{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    ::poll(&p, 1, waitMs);  // readiness, an error or a hang-up: the next call tells which
  }
  return Status::ok();
}

Status sendAllV(int fd, iovec* iov, int iovcnt, IoClock::time_point deadline) {
  return transferAllV(fd, IoDirection::kSend, iov, iovcnt, deadline);
}

Status sendAll(int fd, const void* data, size_t length, IoClock::time_point deadline) {
  iovec iov{const_cast<void*>(data), length};
  return transferAllV(fd, IoDirection::kSend, &iov, 1, deadline);
}

Status recvAll(int fd, void* data, size_t length, IoClock::time_point deadline, bool* cleanEof) {
  iovec iov{data, length};
  return transferAllV(fd, IoDirection::kRecv, &iov, 1, deadline, cleanEof);
}

}  // namespace bagua::net
