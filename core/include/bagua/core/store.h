// Rendezvous key-value stores (gloo's rendezvous/store.h idea): an abstract Store, an in-memory
// store for ranks that are threads of one process (tests), a TCP store whose server (Boost.Asio)
// is hosted by rank 0 or runs standalone, and a prefix view so process groups share one store.
//
// Authentication: the TCP store's connections open with a challenge-response under the job key
// (job_key.h) and every request and response after it carries an HMAC with a sequence number;
// a connection without the key is closed at its first frame, logged with its address, and gets
// nothing (core/README.md, "Security").
//
// Contract: every operation is bounded. get() and wait() take a timeout and fail with
// DeadlineExceeded naming the missing keys; the TCP client fails with Unavailable/RemoteError
// naming the server address when it cannot reach the server within its connect timeout.
// Values are byte strings. An absent key compares equal to the empty string in compareSet().
//
// Thread safety: all Store methods may be called from any thread. The TCP client serialises
// requests on one connection (a blocking get() delays other callers of the same client).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/job_key.h"

namespace bagua::core {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

Bytes toBytes(const std::string& s);
std::string toString(const Bytes& b);

class Store {
 public:
  virtual ~Store() = default;

  virtual Status set(const std::string& key, const Bytes& value) = 0;
  // Waits up to `timeout` for the key to exist, then returns its value.
  virtual Result<Bytes> get(const std::string& key, Millis timeout) = 0;
  // Waits up to `timeout` until every key exists.
  virtual Status wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Adds `delta` to the integer stored at key (absent: 0) and returns the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  // If the current value equals `expected` (absent equals empty), stores `desired`. Returns the
  // value after the operation (so the caller won iff the result equals `desired`).
  virtual Result<Bytes> compareSet(const std::string& key, const Bytes& expected,
                                   const Bytes& desired) = 0;
  // True when the key exists now (no waiting).
  virtual Result<bool> check(const std::string& key) = 0;
  // The address peers should use to reach this process (the local end of the connection to
  // the store server; 127.0.0.1 for in-process stores).
  virtual std::string localAddress() const { return "127.0.0.1"; }
};

// Keys live in a map guarded by one mutex; waiters sleep on a condition variable.
class InMemoryStore final : public Store {
 public:
  InMemoryStore() = default;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, Millis timeout) override;
  Status wait(const std::vector<std::string>& keys, Millis timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Result<Bytes> compareSet(const std::string& key, const Bytes& expected,
                           const Bytes& desired) override;
  Result<bool> check(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

// A view of another store with every key prefixed by "<prefix>/". Borrows `base`, which must
// outlive the view (shared ownership keeps it alive).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, Millis timeout) override;
  Status wait(const std::vector<std::string>& keys, Millis timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Result<Bytes> compareSet(const std::string& key, const Bytes& expected,
                           const Bytes& desired) override;
  Result<bool> check(const std::string& key) override;
  std::string localAddress() const override { return base_->localAddress(); }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

struct TcpStoreServerOptions {
  // nullopt: the process's key (jobKeyFromParams()).
  std::optional<JobKey> key;
  // A connection that has not proved the key this long after it was accepted is closed.
  Millis authTimeout{5000};
  // Connections accepted but not yet authenticated; beyond it the oldest is closed, so a flood
  // of strangers costs the job neither memory nor descriptors beyond this many.
  size_t maxPending = 128;
};

// The TCP store's server: a Boost.Asio io_context on one named thread ("bagua-store"). Blocking
// gets and waits are parked server-side until their keys appear or their deadline passes, so
// clients never poll. Its acceptor survives every accept error (descriptors exhausted: it backs
// off 100 ms, retries, and logs once per episode).
class TcpStoreServer {
 public:
  // Listens on host:port (port 0 picks a free port; see port()). `host` is an IP address.
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, int port,
                                                       const TcpStoreServerOptions& options = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  // Stops accepting, closes every connection and joins the thread (also done by the dtor).
  void stop();

  class Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // How long to keep retrying the first connection (the server may start later).
  Millis connectTimeout{30000};
  // A server whose host vanished (no FIN/RST) fails the call waiting on it within about this
  // long (TCP_USER_TIMEOUT + keepalive); negative: BAGUA_PEER_TIMEOUT_MS; 0: TCP's defaults.
  Millis deadPeerTimeout{-1};
  // nullopt: the process's key (jobKeyFromParams()).
  std::optional<JobKey> key;
};

// The address rank 0's store listens on for the rendezvous address `masterAddr`:
// BAGUA_STORE_LISTEN_ADDR when set; else MASTER_ADDR itself when it is an IP address; else the
// first address the name resolves to that belongs to this host (InvalidArgument naming the
// name and its addresses when none does). Never every interface unless asked.
Result<std::string> storeListenAddress(const std::string& masterAddr);

namespace storewire {
class ClientSession;
}

// The client. Speaks a small length-prefixed binary protocol (core/README.md).
class TcpStore final : public Store {
 public:
  static Result<std::unique_ptr<TcpStore>> connect(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, Millis timeout) override;
  Status wait(const std::vector<std::string>& keys, Millis timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Result<Bytes> compareSet(const std::string& key, const Bytes& expected,
                           const Bytes& desired) override;
  Result<bool> check(const std::string& key) override;
  std::string localAddress() const override { return localAddress_; }

 private:
  TcpStore(int fd, std::string server, std::string localAddress,
           std::unique_ptr<storewire::ClientSession> session);
  Result<std::vector<Bytes>> request(uint8_t op, const std::vector<Bytes>& args, Millis timeout);

  std::mutex mu_;
  int fd_ = -1;
  std::unique_ptr<storewire::ClientSession> session_;
  std::string server_;
  std::string localAddress_;
};

}  // namespace bagua::core
