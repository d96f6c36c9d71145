// Heartbeats between the ranks of a host communicator that run on different hosts:
// a peer whose host vanishes without closing its sockets (power loss, cable pulled, frozen
// kernel) sends no FIN or RST, so a rank blocked on it, or on a rank blocked on it, would wait
// for the collective deadline. Every rank sends a small UDP datagram to each peer on another
// host every `interval`; a peer not heard from for `timeout` is declared lost, onLost(why) runs
// once, naming the peer's rank, address and host name, and a "lost" notice goes to every other
// rank of the communicator, which adopts the same reason at once. The communicator aborts, so
// every survivor fails within about timeout + interval, each naming the lost peer.
//
// Datagrams carry the sender's rank, a counter and an HMAC under the job key's heartbeat key
// over the sender's nonce (published through the store with its address; control_wire.h). A
// datagram whose tag does not verify, whose counter is not above the last one accepted from that
// rank, or that comes from another address than the rank published is dropped (logged with its
// source, rate-limited) and changes nothing: strays of an earlier job, replays and forgeries
// can neither keep a lost peer alive nor declare a live one lost. A monitor that stops in order
// sends "bye": its peers stop watching it (a rank that finished is not a lost one; its closed
// sockets still fail any collective that needs it). Peers on this host (hostIdentity(): host name,
// boot id, network namespace) are not watched: their death closes the sockets.
//
// Thread model: one thread per monitor, "bagua-heartbeat", sending, receiving (non-blocking
// socket, poll at most 200 ms at a time to see the stop request) and checking; onLost runs on
// it and must not block long (HostCommunicator::abort). waitLost() may be called from any
// thread (the communicator's worker); mu_ guards the loss reason and is never held while onLost
// runs or a datagram is sent.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/host/control_wire.h"
#include "bagua/base/crypto.h"
#include "bagua/base/status.h"
#include "bagua/core/job_key.h"
#include "bagua/core/store.h"

namespace bagua::core::host {

struct PeerMonitorOptions {
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds setupTimeout{60000};  // waiting for the peers' published addresses
  std::string bindAddress;                        // empty: the store's localAddress()
  std::optional<JobKey> key;                      // nullopt: the process's (jobKeyFromParams())
};

class PeerMonitor {
 public:
  using LostFn = std::function<void(const std::string& why)>;

  // Collective over `store` (every rank of the communicator calls it): binds a UDP socket,
  // publishes "hb/<rank>" and reads every peer's. Returns null when no peer is on another host.
  static Result<std::unique_ptr<PeerMonitor>> start(Store& store, int rank, int size,
                                                    const PeerMonitorOptions& options,
                                                    LostFn onLost);
  ~PeerMonitor();  // stop()
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // Joins the thread and sends "bye" to every peer (idempotent). No loss is reported after it.
  void stop();
  // The reason a peer was declared lost (here or by a notice), waiting up to `grace` for one;
  // empty if none. A transport error caused by a survivor aborting over the lost peer reaches
  // the worker about when that survivor's notice does: the worker asks here before reporting.
  std::string waitLost(std::chrono::milliseconds grace);
  int watchedPeers() const;

 private:
  struct Peer {
    std::string address;                  // "ip:port" of its UDP socket
    std::string host;                     // its host name, for messages
    wire::Nonce nonce{};                  // its datagrams' tags are over this
    uint64_t counter = 0;                 // the highest counter accepted from it
    std::vector<unsigned char> sockaddr;  // where to send, and where its datagrams must come from
    bool watched = false;                 // on another host
    bool departed = false;                // said bye
    std::chrono::steady_clock::time_point lastHeard;
  };

  PeerMonitor() = default;
  void loop(std::stop_token stop);
  void sendAll(uint32_t kind, uint32_t about, bool watchedOnly);
  void drain(std::chrono::steady_clock::time_point now);
  void declareLost(const std::string& why);  // thread only
  std::string describe(int rank) const;

  void rejected(const std::vector<unsigned char>& from, const std::string& why);

  int rank_ = 0;
  int fd_ = -1;
  wire::Nonce nonce_{};
  uint64_t counter_ = 0;  // of the last datagram sent
  std::unique_ptr<HmacSha256> key_;
  uint64_t rejected_ = 0;  // datagrams dropped (thread only)
  PeerMonitorOptions options_;
  LostFn onLost_;
  std::vector<Peer> peers_;  // indexed by rank; peers_[rank_] unused
  std::jthread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string lost_;      // guarded by mu_
  bool stopped_ = false;  // guarded by mu_
};

}  // namespace bagua::core::host
