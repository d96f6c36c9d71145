// Dead-peer bounds shared by the TCP store and the host backend: how long a peer on
// another host may stay silent before the calls waiting on it fail, and the TCP options that make
// the kernel enforce it on a connection whose peer vanished without a FIN or RST (power loss,
// cable pulled, host frozen).
//
// Thread safety: pure functions; livenessFromParams() reads the frozen catalogue.
#pragma once

#include <chrono>

#include "bagua/base/status.h"

namespace bagua::core {

struct Liveness {
  std::chrono::milliseconds timeout{10000};  // 0: off (no heartbeat, TCP's defaults)
  std::chrono::milliseconds interval{1000};  // heartbeat period, at most timeout / 3
  bool on() const { return timeout.count() > 0; }
};

// BAGUA_PEER_TIMEOUT_MS and BAGUA_HEARTBEAT_INTERVAL_MS, checked against each other (an interval
// above a third of the timeout would let two lost datagrams fail a healthy peer).
Result<Liveness> livenessFromParams();

// TCP_USER_TIMEOUT (unacknowledged data fails after `timeout`) and keepalive probes every
// timeout / 5 (an idle connection whose peer vanished fails at the first probe past `timeout`),
// so blocked I/O on `fd` fails within about 1.2 x timeout. Nothing when timeout is 0.
Status setDeadPeerBound(int fd, std::chrono::milliseconds timeout);

}  // namespace bagua::core
