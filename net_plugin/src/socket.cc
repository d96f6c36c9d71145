#include "socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>

namespace bagua::net {

void Fd::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Status setNonBlocking(int fd, bool nonBlocking) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) {
    return BAGUA_ERRNO(errno, "fcntl(F_GETFL)");
  }
  flags = nonBlocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) {
    return BAGUA_ERRNO(errno, "fcntl(F_SETFL)");
  }
  return Status::ok();
}

namespace {

Status setOpt(int fd, int level, int name, int value, const char* what) {
  if (setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    return BAGUA_ERRNO(errno, what);
  }
  return Status::ok();
}

}  // namespace

Status setStreamOptions(int fd, const EngineOptions& options) {
  BAGUA_RETURN_IF_ERROR(setOpt(fd, IPPROTO_TCP, TCP_NODELAY, 1, "setsockopt(TCP_NODELAY)"));
  if (options.socketBufferBytes > 0) {
    int buf = static_cast<int>(std::min<uint64_t>(options.socketBufferBytes, INT_MAX));
    BAGUA_RETURN_IF_ERROR(setOpt(fd, SOL_SOCKET, SO_SNDBUF, buf, "setsockopt(SO_SNDBUF)"));
    BAGUA_RETURN_IF_ERROR(setOpt(fd, SOL_SOCKET, SO_RCVBUF, buf, "setsockopt(SO_RCVBUF)"));
  }
  if (options.notSentLowatBytes > 0) {
    int lowat = static_cast<int>(std::min<uint64_t>(options.notSentLowatBytes, INT_MAX));
    BAGUA_RETURN_IF_ERROR(
        setOpt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, lowat, "setsockopt(TCP_NOTSENT_LOWAT)"));
  }
  // A peer that vanishes without a FIN/RST: unacknowledged data fails after TCP_USER_TIMEOUT;
  // an idle connection is probed by keepalive (idle + cnt * intvl ~ timeout).
  int timeoutMs = static_cast<int>(std::min<int64_t>(options.timeoutMs, INT_MAX));
  int probeSec = std::max(1, timeoutMs / 4000);
  BAGUA_RETURN_IF_ERROR(
      setOpt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, timeoutMs, "setsockopt(TCP_USER_TIMEOUT)"));
  BAGUA_RETURN_IF_ERROR(setOpt(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "setsockopt(SO_KEEPALIVE)"));
  BAGUA_RETURN_IF_ERROR(
      setOpt(fd, IPPROTO_TCP, TCP_KEEPIDLE, probeSec, "setsockopt(TCP_KEEPIDLE)"));
  BAGUA_RETURN_IF_ERROR(
      setOpt(fd, IPPROTO_TCP, TCP_KEEPINTVL, probeSec, "setsockopt(TCP_KEEPINTVL)"));
  BAGUA_RETURN_IF_ERROR(setOpt(fd, IPPROTO_TCP, TCP_KEEPCNT, 3, "setsockopt(TCP_KEEPCNT)"));
  return Status::ok();
}

Status sendSome(int fd, const uint8_t* data, size_t length, size_t* done) {
  iovec iov{const_cast<uint8_t*>(data), length};
  return sendSomeV(fd, &iov, 1, done);
}

Status recvSome(int fd, uint8_t* data, size_t length, size_t* done, bool* eof) {
  while (*done < length) {
    ssize_t n = ::recv(fd, data + *done, length - *done, MSG_DONTWAIT);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && eof != nullptr) {
      *eof = true;
      return Status::ok();
    }
    if (n == 0) {
      return BAGUA_ERROR(kRemoteError, "connection closed by peer after %zu of %zu bytes", *done,
                         length);
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Status::ok();
    }
    return BAGUA_ERRNO(errno, "recv");
  }
  return Status::ok();
}

Status sendSomeV(int fd, const iovec* iov, int iovcnt, size_t* done) {
  for (;;) {
    iovec local[4];
    int n = 0;
    size_t skip = *done;
    for (int i = 0; i < iovcnt && n < 4; ++i) {
      if (skip >= iov[i].iov_len) {
        skip -= iov[i].iov_len;
        continue;
      }
      local[n].iov_base = static_cast<uint8_t*>(iov[i].iov_base) + skip;
      local[n].iov_len = iov[i].iov_len - skip;
      skip = 0;
      ++n;
    }
    if (n == 0) {
      return Status::ok();
    }
    msghdr msg{};
    msg.msg_iov = local;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      *done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) {
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Status::ok();
    }
    return BAGUA_ERRNO(errno, "send");
  }
}

uint64_t randomU64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(v))) {
    return v;
  }
  auto t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return t ^ (static_cast<uint64_t>(getpid()) << 32) ^ reinterpret_cast<uintptr_t>(&v);
}

}  // namespace bagua::net
