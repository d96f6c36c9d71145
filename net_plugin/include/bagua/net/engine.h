// Bagua-Net TCP engine: the transport behind libnccl-net.so, also usable directly (core's host
// backend). No NCCL dependency.
//
// Model
// -----
// One connection = one control TCP stream + N data TCP streams, one direction only: a SendComm
// sends, the matching RecvComm receives. Messages are byte buffers; sends and receives match in
// posting order (the k-th isend lands in the k-th irecv). A message larger than the inline limit
// is cut into chunks (their size chosen per message: bagua/net/chunk_policy.h) that helper
// threads schedule dynamically: each data stream's thread takes
// the next chunk as soon as the kernel accepted its previous one, so a slow stream carries fewer
// chunks instead of setting the pace. Each chunk carries a small header (message sequence,
// offset, length), so the receiver writes it straight into the posted buffer at its offset (no
// intermediate copy on either side). The control stream carries the real size of every message
// (and small messages inline), so the receiver learns real sizes and detects truncation.
//
// Set-up (all non-blocking, NCCL style)
// -------------------------------------
//   receiver: Listener::create(addr)  -> handle() (kHandleBytes, shipped out of band)
//   sender:   Connector::start(handle) then poll() until it yields a SendComm
//   receiver: listener->accept() until it yields a RecvComm
// poll()/accept() never block; they return a null pointer (Ok) while the connection is still
// being made. Every accepted socket must open with a hello carrying our magic, version and the
// listener's nonce; anything else is dropped with a log line.
//
// Data path
// ---------
//   SendComm::isend(data, size) -> Request*   (kUnavailable: all request slots busy, retry)
//   RecvComm::irecv(data, capacity) -> Request*
//   Request::test(&done, &size)               non-blocking; size = real message size
// A comm holds at least kMinRequestsInFlight requests; the caller keeps the buffer alive and
// untouched until test() reports done. After test() reported done (or an error) the request is
// recycled: do not use the pointer again. Requests of one comm are tested by one thread at a
// time (the caller's); different comms may be used from different threads concurrently.
// isend never blocks. Besides posting, it writes what the sockets take at once: the control record
// (with the payload of an inline message) and, when the chunk policy says so (a lone message cut
// into one chunk that is cheaper to copy than a helper thread's wake-up), that chunk on a parked
// data stream; the helper threads send the rest. test() reads the control stream likewise.
//
// Errors (Status codes from test(), isend(), irecv())
// ---------------------------------------------------
//   kRemoteError        the peer closed or reset the connection, or sent bytes that violate the
//                       protocol, or went silent beyond the timeout (TCP user timeout/keepalive)
//   kSystemError        an OS call failed (errno in the message)
//   kInvalidArgument    caller misuse (null buffer with size > 0); message larger than the posted
//                       receive ("message truncated ..."): the comm is then failed
//   kUnavailable        isend/irecv only: no free request slot right now; retry later
//   kFailedPrecondition test() on a request that is not in flight
// Once a comm has failed, every pending and later request reports that first error (same code);
// the comm must still be destroyed normally.
//
// Threads and teardown
// --------------------
// Each comm owns its helper threads (one per stream, named bagua-net-{s,r}{c,N}), created when the
// comm is made. They park (bounded condition-variable waits after a short spin) when idle and do
// not allocate on the data path. Destroying a comm (unique_ptr reset) shuts its sockets down,
// stops and joins its threads; requests still in flight are abandoned (no crash, their buffers
// are no longer touched once the destructor returns).
#pragma once

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/net/chunk_policy.h"
#include "bagua/net/params.h"  // netParams(), kMaxStreams, kLogNet

namespace bagua::net {

// At least this many requests can be in flight per comm (NCCL_NET_MAX_REQUESTS is 32).
inline constexpr int kMinRequestsInFlight = 32;

// How a message's chunks are spread over the data streams.
enum class Schedule {
  kDynamic,     // the next chunk goes to whichever stream is free (default)
  kRoundRobin,  // chunk k to stream k mod N, equal split (NCCL Socket / Bagua-Net; baseline)
};

// TCP_NOTSENT_LOWAT on the sending side of a connection over several rails (unless set).
inline constexpr uint64_t kMultiRailNotSentLowat = 256 * 1024;

// Engine settings. Defaults come from netParams(); fields set explicitly win (API > env).
struct EngineOptions {
  int nStreams = 8;  // data streams per connection (BAGUA_NET_NSTREAMS)
  // How each message is cut (bagua/net/chunk_policy.h): adaptive (chosen per message from the
  // comm's measured wake-ups, stream rates and queue) or the fixed rule of the three sizes below.
  // fromParams() follows BAGUA_NET_CHUNK_POLICY: adaptive unless BAGUA_NET_MIN_CHUNKSIZE or
  // BAGUA_NET_LONE_CHUNKSIZE is set (a knob set by hand pins its floor). Options built by hand
  // keep the fixed rule unless they set this.
  bool adaptiveChunks = false;
  // Smallest data chunk (BAGUA_NET_MIN_CHUNKSIZE); adaptive: the smallest chunk of a message
  // queued behind unclaimed bytes, and of every message until the comm has measured its streams.
  uint64_t minChunkBytes = 256 * 1024;
  uint64_t maxChunkBytes = 1024 * 1024;  // largest data chunk (BAGUA_NET_MAX_CHUNKSIZE)
  // Fixed rule: smallest chunk of a message posted with nothing queued before it, if below
  // minChunkBytes (BAGUA_NET_LONE_CHUNKSIZE); 0: off.
  uint64_t loneChunkBytes = 0;
  uint64_t inlineBytes = 64 * 1024;      // messages up to this go on the control stream
  uint64_t socketBufferBytes = 4 << 20;  // SO_SNDBUF/SO_RCVBUF; 0 = kernel default
  // TCP_NOTSENT_LOWAT of every stream (BAGUA_NET_NOTSENT_LOWAT); 0 = the kernel's default
  // (unbounded), except on a connection over several rails, whose sender uses
  // kMultiRailNotSentLowat.
  uint64_t notSentLowatBytes = 0;
  int64_t timeoutMs = 30000;  // dead-peer bound: TCP_USER_TIMEOUT + keepalive
  int64_t spinUs = 0;         // helper threads spin this long before parking
  // A parked helper thread re-checks for work this often even if nobody wakes it: the most a
  // lost wake-up can cost. Not a tuning knob (wake-ups are not lost); tests raise it so that a
  // lost one would show as a stall.
  int64_t parkRecheckMs = 20;
  int64_t helloTimeoutMs = 10000;  // accepted sockets must say hello within this
  // Dynamic; round-robin is the comparison baseline of the benchmarks and tests (set in code:
  // bagua-net-bench reaches the plugin's through src/bench_abi.h), not a parameter.
  Schedule schedule = Schedule::kDynamic;
  // Fault injection for benchmarks and tests (BAGUA_NET_SLOW_STREAM_RATE): when non-zero, data
  // stream 0 of every send comm is paced to this many bytes/s by the kernel (SO_MAX_PACING_RATE),
  // i.e. one slow flow among fast ones, as on a congested path or a bad ECMP hash.
  uint64_t slowStreamBytesPerSec = 0;
  // Link emulation (BAGUA_NET_SEND_RATE_MBPS): when non-zero, the payload of every send comm of
  // the process goes out at most at this many Mbit/s in total (one pacing clock per process).
  uint64_t sendRateMbps = 0;

  // Options from the catalogue (environment or defaults). Fails on an invalid value, naming it.
  static Result<EngineOptions> fromParams();
  // Checks ranges and consistency (e.g. minChunk <= maxChunk).
  Status validate() const;
};

// An IPv4 or IPv6 socket address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  uint16_t port() const;
  // "127.0.0.1:1234" or "[::1]:1234".
  std::string toString() const;
  // Parses "1.2.3.4", "1.2.3.4:80", "::1", "[::1]:80" (numeric only, no DNS).
  static Result<SocketAddress> parse(std::string_view text);
};

// One usable network interface (one address).
struct NetInterface {
  std::string name;  // "eth0"
  SocketAddress address;
};

// NCCL_SOCKET_IFNAME syntax: a comma-separated list of name prefixes; a leading '^' excludes the
// listed names instead; a leading '=' (after an optional '^') makes the names exact.
struct IfnameSpec {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;

  static IfnameSpec parse(std::string_view text);
  bool matches(std::string_view ifname) const;
};

// Address family from NCCL_SOCKET_FAMILY text: "" -> AF_UNSPEC, "AF_INET", "AF_INET6".
Result<int> parseAddressFamily(std::string_view text);

// Interfaces to use, NCCL's order: with an ifname spec, the matching ones (lo and docker only
// when named); without, every up interface except lo/docker/virbr, else docker, else lo.
// `family` AF_UNSPEC takes both (IPv4 preferred per interface). One address per interface,
// IPv6 link-local addresses skipped. At most `maxCount`.
Result<std::vector<NetInterface>> findInterfaces(std::string_view ifnameSpec, int family,
                                                 size_t maxCount = 16);

// The connection handle a Listener publishes and a Connector consumes: kHandleBytes opaque bytes
// (address, port, magic, version, nonce). Bytes [kHandleCallerOffset, kHandleBytes) are not
// used by the engine and stay zero in a fresh handle: a caller (the NCCL plugin) may keep its own
// connect state there between non-blocking retries.
inline constexpr size_t kHandleBytes = 128;
inline constexpr size_t kHandleCallerOffset = 96;
using Handle = std::array<uint8_t, kHandleBytes>;

class Request;
class SendComm;
class RecvComm;

// Sender-side settings that may change while comms are in use (the autotuner switches them
// between training iterations). A send comm reads them once per isend (an atomic snapshot), so a
// change applies from the next message on; messages already posted keep the settings they were
// cut with. The receiver needs no agreement: every chunk header carries the message sequence,
// offset and length, and the receiver writes each chunk at its offset whatever its size or
// stream. A field at 0 means "not set here": a SendComm's own setting beats the process-wide
// one, which beats the comm's EngineOptions.
//   activeStreams  data streams that take chunks of new messages, clamped to [1, established
//                  streams] (connections still establish EngineOptions::nStreams streams). Streams
//                  beyond it are not woken for new messages but finish the chunks of messages
//                  posted before the change. Dynamic schedule only: under kRoundRobin the count
//                  stays the established one (every stream walks every message there).
//   min/maxChunkBytes  chunk size bounds for new messages (both schedules; round-robin has no
//                  upper clamp). When the resolved max is below the resolved min, min wins.
struct LiveSettings {
  int activeStreams = 0;
  uint64_t minChunkBytes = 0;
  uint64_t maxChunkBytes = 0;

  // Ranges: activeStreams 0..kMaxStreams; chunk bounds 0 or 1 B..1 GiB; min <= max when both set.
  Status validate() const;
  bool operator==(const LiveSettings&) const = default;
};

// The process-wide live settings every SendComm of this process reads (one copy per loaded copy
// of the engine). The NCCL plugin, loaded by NCCL with its own copy, exports C entries that reach
// its copy: bagua/net/live_abi.h names them, types them and says how to find them in the loaded
// module (never load it yourself: that would be another copy). Thread-safe.
[[nodiscard]] Status setProcessLiveSettings(const LiveSettings& settings);
LiveSettings processLiveSettings();

// A completion signal that several comms may share, so that a caller waiting on many requests
// can sleep instead of spinning on test(). A comm given a Notifier (setNotifier, before its first
// request) bumps it from its helper threads whenever one of its requests completes, the comm
// fails, or the peer closes a stream. Usage: seen = epoch(); test the requests; if none finished,
// waitChange(seen, deadline). (Requests completed by the caller's own isend/test bump it too,
// which only costs the caller one more look.) Thread-safe; must outlive the comms using it.
class Notifier {
 public:
  Notifier() = default;
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // Returns once epoch() != seen, or at the deadline.
  void waitChange(uint64_t seen, std::chrono::steady_clock::time_point deadline);
  void notify();

 private:
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Receiving side of connection set-up. Not thread-safe (one caller at a time).
class Listener {
 public:
  // Binds to `bindAddress` (port 0: any free port) and listens.
  static Result<std::unique_ptr<Listener>> create(const SocketAddress& bindAddress,
                                                  const EngineOptions& options);
  // Listens on several addresses at once, the rails of one device spanning several interfaces
  // (each its own port, all under one nonce). The handle lists them all; a Connector spreads
  // its streams over them: data stream i on rail i mod rails, the control stream on rail 0.
  // Rails after the first must be IPv4; at most 1 + wire's kMaxExtraRails (9) rails.
  static Result<std::unique_ptr<Listener>> create(const std::vector<SocketAddress>& bindAddresses,
                                                  const EngineOptions& options);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  const Handle& handle() const;
  const SocketAddress& address() const;  // rail 0
  int rails() const;

  // Non-blocking: accepts and validates pending sockets; returns a RecvComm when one connector's
  // control and data streams are all there, else nullptr (Ok). Strangers are dropped and logged.
  Result<std::unique_ptr<RecvComm>> accept();

  struct Impl;

 private:
  explicit Listener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sending side of connection set-up. Not thread-safe (one caller at a time).
class Connector {
 public:
  // Validates the handle (magic, version: a handle from another version is kInvalidArgument) and
  // starts non-blocking connects, data stream i to the listener's rail i mod rails (see
  // Listener::create). When `local` has one interface per rail of the handle, the streams of rail
  // r leave from local[r]: bound to its address and, where the process may, to its device
  // (SO_BINDTODEVICE), so that rails on one subnet still use their own interfaces. Otherwise the
  // kernel's routing chooses.
  static Result<std::unique_ptr<Connector>> start(const Handle& handle,
                                                  const EngineOptions& options,
                                                  const std::vector<NetInterface>& local = {});
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Non-blocking: progresses the connects and hellos; returns the SendComm when all streams are
  // up, else nullptr (Ok). kRemoteError/kSystemError when the listener is unreachable.
  Result<std::unique_ptr<SendComm>> poll();

  struct Impl;

 private:
  explicit Connector(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class SendComm {
 public:
  ~SendComm();  // shuts the streams down and joins the helper threads
  SendComm(const SendComm&) = delete;
  SendComm& operator=(const SendComm&) = delete;

  // Posts a send of [data, data+size). size 0 is allowed. kUnavailable: no free slot, retry.
  Result<Request*> isend(const void* data, size_t size);
  // See Notifier. Call before the first isend; nullptr detaches.
  void setNotifier(Notifier* notifier);
  // Any thread: shuts the streams down (the peer sees the connection close at once) and fails
  // every pending and later request with kAborted and `why`. The comm must still be destroyed.
  void abort(const std::string& why);
  int nStreams() const;
  const SocketAddress& peer() const;
  // Payload bytes and chunks each data stream has sent so far (how the schedule spread them).
  std::vector<uint64_t> bytesPerStream() const;
  std::vector<uint64_t> chunksPerStream() const;
  // Data chunks the messages posted so far were cut into (caller's thread, or after it).
  uint64_t chunksPosted() const;
  // How the last message posted was cut: what the comm saw (CommLoad), the rules in force and the
  // chunk policy's plan, which isend applied (bagua/net/chunk_policy.h). Caller's thread.
  MessagePlan lastPlan() const;
  // Tests only: starts the comm's measurements (the wake-up, and every stream's rate with enough
  // samples to count) from these values instead of from nothing; later chunks keep updating
  // them. Any thread.
  void seedMeasurementsForTesting(double wakeSeconds, double streamBytesPerSecond);
  // The remote address each data stream is connected to (its rail).
  std::vector<SocketAddress> streamPeers() const;
  // This comm's own live settings (beat the process-wide ones; all zero clears the override).
  // Any thread; applies from the next isend.
  [[nodiscard]] Status setLiveSettings(const LiveSettings& settings);
  // What the next isend will use, resolved (activeStreams >= 1, chunk bounds non-zero).
  LiveSettings effectiveLiveSettings() const;

  struct Impl;
  explicit SendComm(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

class RecvComm {
 public:
  ~RecvComm();  // shuts the streams down and joins the helper threads
  RecvComm(const RecvComm&) = delete;
  RecvComm& operator=(const RecvComm&) = delete;

  // Posts a receive into [data, data+capacity). kUnavailable: no free slot, retry.
  Result<Request*> irecv(void* data, size_t capacity);
  // See Notifier. Call before the first irecv; nullptr detaches.
  void setNotifier(Notifier* notifier);
  // As SendComm::abort.
  void abort(const std::string& why);
  int nStreams() const;
  const SocketAddress& peer() const;
  // The sender's address of each data stream (the interface it left from).
  std::vector<SocketAddress> streamPeers() const;

  struct Impl;
  explicit RecvComm(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// A posted send or receive, owned by its comm.
class Request {
 public:
  // Non-blocking. On completion sets *done = true and *size to the message size (for a receive,
  // the sender's size, <= capacity) and recycles the request. Errors as listed above.
  Status test(bool* done, size_t* size);

 protected:
  Request() = default;
  ~Request() = default;
};

}  // namespace bagua::net
