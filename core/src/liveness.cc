#include "liveness.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>

#include "bagua/core/params.h"

namespace bagua::core {

Result<Liveness> livenessFromParams() {
  Liveness l;
  BAGUA_ASSIGN_OR_RETURN(int64_t timeout, coreParams().peerTimeoutMs.get());
  BAGUA_ASSIGN_OR_RETURN(int64_t interval, coreParams().heartbeatIntervalMs.get());
  if (timeout > 0 && interval * 3 > timeout) {
    return BAGUA_ERROR(kInvalidArgument,
                       "BAGUA_HEARTBEAT_INTERVAL_MS=%lld is above a third of "
                       "BAGUA_PEER_TIMEOUT_MS=%lld: two lost heartbeats would fail a healthy peer; "
                       "lower the interval or raise the timeout",
                       static_cast<long long>(interval), static_cast<long long>(timeout));
  }
  l.timeout = std::chrono::milliseconds(timeout);
  l.interval = std::chrono::milliseconds(interval);
  return l;
}

Status setDeadPeerBound(int fd, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    return Status::ok();
  }
  const int userTimeout = static_cast<int>(std::min<int64_t>(timeout.count(), INT_MAX));
  const int probeSec = static_cast<int>(std::max<int64_t>(1, timeout.count() / 5000));
  const int one = 1;
  const int count = 5;
  struct Opt {
    int level;
    int name;
    const int* value;
    const char* what;
  };
  const Opt opts[] = {
      {IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, "setsockopt(TCP_USER_TIMEOUT)"},
      {SOL_SOCKET, SO_KEEPALIVE, &one, "setsockopt(SO_KEEPALIVE)"},
      {IPPROTO_TCP, TCP_KEEPIDLE, &probeSec, "setsockopt(TCP_KEEPIDLE)"},
      {IPPROTO_TCP, TCP_KEEPINTVL, &probeSec, "setsockopt(TCP_KEEPINTVL)"},
      {IPPROTO_TCP, TCP_KEEPCNT, &count, "setsockopt(TCP_KEEPCNT)"},
  };
  for (const Opt& o : opts) {
    if (::setsockopt(fd, o.level, o.name, o.value, sizeof(int)) != 0) {
      return BAGUA_ERRNO(errno, o.what);
    }
  }
  return Status::ok();
}

}  // namespace bagua::core
