// Loopback transfers between a SendComm and a RecvComm of the engine, shared by the engine's
// unit tests: test options, a connected pair (over one address or several rails), bounded waits
// and a windowed transfer that checks every byte. Runs on the test thread plus one sender thread.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bagua/net/engine.h"
#include "net_test_util.h"

namespace bagua::net::testing {

inline EngineOptions testOptions(int nStreams) {
  EngineOptions o;
  o.nStreams = nStreams;
  o.minChunkBytes = 4096;
  o.maxChunkBytes = 64 << 10;
  o.inlineBytes = 256;
  o.socketBufferBytes = 0;
  o.timeoutMs = 5000;
  o.spinUs = 20;
  o.helloTimeoutMs = 2000;
  return o;
}

struct Pair {
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// A connected pair over a listener on `addrs` (its rails); the connector binds to `local` (see
// Connector::start).
inline Pair connectPair(const EngineOptions& o, const std::vector<std::string>& addrs,
                        const std::vector<NetInterface>& local = {}) {
  Pair p;
  std::vector<SocketAddress> bind;
  for (const std::string& a : addrs) {
    bind.push_back(*SocketAddress::parse(a));
  }
  Result<std::unique_ptr<Listener>> l = Listener::create(bind, o);
  EXPECT_TRUE(l.isOk()) << l.status().toString();
  if (!l.isOk()) {
    return p;
  }
  Result<std::unique_ptr<Connector>> c = Connector::start((*l)->handle(), o, local);
  EXPECT_TRUE(c.isOk()) << c.status().toString();
  if (!c.isOk()) {
    return p;
  }
  bool ok = pollFor(10, [&] {
    if (!p.send) {
      Result<std::unique_ptr<SendComm>> s = (*c)->poll();
      EXPECT_TRUE(s.isOk()) << s.status().toString();
      if (s.isOk()) {
        p.send = std::move(*s);
      }
    }
    if (!p.recv) {
      Result<std::unique_ptr<RecvComm>> r = (*l)->accept();
      EXPECT_TRUE(r.isOk()) << r.status().toString();
      if (r.isOk()) {
        p.recv = std::move(*r);
      }
    }
    return (p.send && p.recv) || ::testing::Test::HasFailure();
  });
  EXPECT_TRUE(ok) << "connection set-up timed out";
  return p;
}

inline Pair connectPair(const EngineOptions& o, const char* addr = "127.0.0.1") {
  return connectPair(o, std::vector<std::string>{addr});
}

// Tests a request to completion (bounded); returns the status and size.
inline Status waitRequest(Request* r, size_t* size, double seconds = 30) {
  bool done = false;
  Status s;
  bool finished = pollFor(seconds, [&] {
    s = r->test(&done, size);
    return done || !s.isOk();
  });
  if (!finished) {
    return BAGUA_ERROR(kDeadlineExceeded, "request did not finish in %.0f s", seconds);
  }
  return s;
}

// One message: posts a receive of all of `rbuf` and a send of all of `sbuf`, waits for both;
// returns the size received (0 after a failure, which is reported).
inline size_t exchangeOne(Pair& p, const std::vector<uint8_t>& sbuf, std::vector<uint8_t>& rbuf) {
  Result<Request*> r = p.recv->irecv(rbuf.data(), rbuf.size());
  Result<Request*> s = p.send->isend(sbuf.data(), sbuf.size());
  EXPECT_TRUE(r.isOk() && s.isOk());
  if (!r.isOk() || !s.isOk()) {
    return 0;
  }
  size_t n = 0;
  EXPECT_TRUE(waitRequest(*s, &n).isOk());
  n = 0;
  EXPECT_TRUE(waitRequest(*r, &n).isOk());
  return n;
}

// Sends `sizes` in order with up to `window` in flight on each side; checks every byte.
inline void transfer(Pair& p, const std::vector<size_t>& sizes, size_t window,
                     size_t recvSlack = 0) {
  std::vector<std::vector<uint8_t>> sendBufs(sizes.size()), recvBufs(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    sendBufs[i].resize(sizes[i]);
    fillPattern(sendBufs[i], i);
    recvBufs[i].assign(sizes[i] + recvSlack, 0xee);
  }
  std::thread sender([&] {
    std::vector<Request*> inflight;
    size_t next = 0, doneCount = 0;
    while (doneCount < sizes.size()) {
      while (next < sizes.size() && inflight.size() < window) {
        Result<Request*> r = p.send->isend(sendBufs[next].data(), sizes[next]);
        if (!r.isOk() && r.status().code() == StatusCode::kUnavailable) {
          break;
        }
        ASSERT_TRUE(r.isOk()) << r.status().toString();
        inflight.push_back(*r);
        ++next;
      }
      size_t n = 0;
      ASSERT_TRUE(waitRequest(inflight.front(), &n).isOk());
      EXPECT_EQ(n, sizes[doneCount]);
      inflight.erase(inflight.begin());
      ++doneCount;
    }
  });
  std::vector<Request*> inflight;
  size_t next = 0, doneCount = 0;
  while (doneCount < sizes.size() && !::testing::Test::HasFatalFailure()) {
    while (next < sizes.size() && inflight.size() < window) {
      Result<Request*> r = p.recv->irecv(recvBufs[next].data(), recvBufs[next].size());
      ASSERT_TRUE(r.isOk()) << r.status().toString();
      inflight.push_back(*r);
      ++next;
    }
    size_t n = 0;
    Status s = waitRequest(inflight.front(), &n);
    ASSERT_TRUE(s.isOk()) << s.toString();
    size_t i = doneCount;
    EXPECT_EQ(n, sizes[i]) << "message " << i;
    long long bad = firstMismatch(recvBufs[i].data(), sizes[i], i);
    EXPECT_EQ(bad, -1) << "message " << i << " of " << sizes[i] << " bytes";
    for (size_t k = sizes[i]; k < recvBufs[i].size(); ++k) {
      ASSERT_EQ(recvBufs[i][k], 0xee) << "write past the message end, message " << i;
    }
    inflight.erase(inflight.begin());
    ++doneCount;
  }
  sender.join();
}

}  // namespace bagua::net::testing
