// The TCP store's wire protocol and per-connection logic, with no sockets: tcp_store_server.cc and
// tcp_store_client.cc move the bytes, the fuzz target (tests/core/fuzz) feeds arbitrary ones.
//
// Every frame is a u32 little-endian body length, then the body. A connection opens with a
// challenge-response under the job key's store key Ks = derive("store") (job_key.h):
//
//   server -> client  challenge  magic u32 "BGS2" | version u8 | server nonce (32)
//   client -> server  hello      op u8 kHello | client nonce (32) | HMAC(Ks, "client", sN, cN)
//   server -> client  welcome    code u8 kOk | HMAC(Ks, "server", sN, cN)
//
// so both ends prove the key over nonces the other chose (a recorded session replays nothing).
// Then every frame is payload | HMAC(Kc, direction, sequence, payload) with the connection's key
// Kc = HMAC(Ks, "session", sN, cN) and an implicit sequence number per direction (the n-th
// request of the connection, the n-th response), so a frame cannot be replayed, reordered,
// moved to another connection or altered. Payloads:
//
//   request   op u8 | u32 argument count | each argument as u32 length + bytes
//   response  code u8 (0 ok, 1 deadline, 2 bad request) | arguments the same way
//
// Before the hello is verified a frame may hold at most kMaxUnauthenticatedFrame bytes (the
// only valid one has 65): a stranger's connection is closed at its first frame, and what it
// makes the server hold is bounded by that cap, not by the length it claims. After it, frames
// up to kMaxFrame; a frame's buffer grows only as its bytes arrive (FrameReader).
//
// Thread safety: none; a session belongs to one connection (the server's io thread, or the
// client under its mutex).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bagua/base/crypto.h"
#include "bagua/base/status.h"
#include "bagua/core/store.h"

namespace bagua::core::storewire {

// An int64 as the 8 little-endian bytes the store's requests and replies carry, and back
// (missing high bytes read as 0).
Bytes i64Bytes(int64_t v);
int64_t bytesI64(const Bytes& b);

inline constexpr uint32_t kMagic = 0x32534742;  // "BGS2" little endian
inline constexpr uint8_t kVersion = 2;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = kSha256Bytes;
inline constexpr size_t kChallengeBytes = 4 + 1 + kNonceBytes;
inline constexpr size_t kHelloBytes = 1 + kNonceBytes + kMacBytes;
inline constexpr size_t kWelcomeBytes = 1 + kMacBytes;
inline constexpr uint32_t kMaxUnauthenticatedFrame = 256;
inline constexpr uint32_t kMaxFrame = 256u << 20;

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCas = 5, kCheck = 6, kHello = 16 };
enum Code : uint8_t { kOk = 0, kDeadline = 1, kBad = 2 };

using Nonce = std::array<uint8_t, kNonceBytes>;

// A nonce from the system's random source (a challenge's, a hello's).
Result<Nonce> freshNonce();

// A whole frame: u32 length + body.
Bytes frame(const Bytes& body);
// op/code byte + u32 count + length-prefixed arguments.
Bytes encodePayload(uint8_t head, const std::vector<Bytes>& args);
// The inverse; false when the bytes are not exactly one such payload.
bool decodePayload(const uint8_t* data, size_t len, uint8_t* head, std::vector<Bytes>* args);

// Reassembles frames from a byte stream. feed() consumes at most up to the end of the current
// frame, so the caller handles one frame before the next is read. The body buffer grows with
// the bytes that arrived, never to the length the header claims.
class FrameReader {
 public:
  explicit FrameReader(uint32_t maxFrame) : max_(maxFrame) {}
  void setMaxFrame(uint32_t maxFrame) { max_ = maxFrame; }
  // Bytes consumed; InvalidArgument when the header's length is 0 or above the limit.
  Result<size_t> feed(const uint8_t* data, size_t len);
  bool hasFrame() const { return complete_; }
  // The completed frame's body; the reader then waits for the next header.
  Bytes take();
  size_t buffered() const { return headerGot_ + body_.size(); }

 private:
  uint32_t max_;
  uint8_t header_[4] = {};
  size_t headerGot_ = 0;
  uint32_t expect_ = 0;
  Bytes body_;
  bool complete_ = false;
};

// The key-value data and the request semantics of store.h, shared by every connection.
struct Parked {
  uint8_t op = 0;  // kGet or kWait
  std::vector<std::string> keys;
  int64_t timeoutMs = 0;
};
struct Reply {
  uint8_t code = kOk;
  std::vector<Bytes> args;
};
class Data {
 public:
  // A request's reply, or the get/wait to park until its keys exist. `changed` is set when the
  // request modified the data (parked waiters should be re-checked).
  std::variant<Reply, Parked> handle(uint8_t op, const std::vector<Bytes>& args, bool* changed);
  // The reply of a parked request now: its value (get) or Ok (wait) when every key exists, else
  // kDeadline listing the missing keys.
  Reply complete(const Parked& p) const;
  bool ready(const Parked& p) const;
  size_t size() const { return map_.size(); }

 private:
  std::map<std::string, Bytes> map_;
};

// The server's side of one connection.
class ServerSession {
 public:
  ServerSession(const Digest& storeKey, const Nonce& serverNonce);

  Bytes challengeFrame() const;
  bool authenticated() const { return authed_; }
  uint32_t maxFrame() const { return authed_ ? kMaxFrame : kMaxUnauthenticatedFrame; }

  struct Action {
    enum Kind { kSend, kPark, kClose } kind = kClose;
    Bytes frame;         // kSend: the whole frame to write
    Parked parked;       // kPark
    std::string reason;  // kClose: why (for the log)
  };
  // One complete frame body from the client.
  Action onFrame(const Bytes& body, Data& data, bool* changed);
  // The frame answering the parked request.
  Bytes respond(const Reply& reply);

 private:
  Digest mac(bool toClient, uint64_t seq, const uint8_t* payload, size_t len);

  HmacSha256 store_;
  Nonce serverNonce_;
  std::optional<HmacSha256> session_;
  bool authed_ = false;
  uint64_t inSeq_ = 0;
  uint64_t outSeq_ = 0;
};

// The client's side of one connection.
class ClientSession {
 public:
  ClientSession(const Digest& storeKey, const Nonce& clientNonce);
  // The hello frame answering the server's challenge body. InvalidArgument when the body is
  // not a challenge of this protocol version.
  Result<Bytes> answer(const Bytes& challengeBody);
  // Verifies the server's proof (PermissionDenied-like kInvalidArgument when it differs).
  Status welcome(const Bytes& body);
  Bytes request(uint8_t op, const std::vector<Bytes>& args);
  // Verifies and decodes a response body.
  Result<Reply> response(const Bytes& body);

 private:
  Digest mac(bool toClient, uint64_t seq, const uint8_t* payload, size_t len);

  HmacSha256 store_;
  Nonce clientNonce_;
  Nonce serverNonce_{};
  std::optional<HmacSha256> session_;
  uint64_t inSeq_ = 0;
  uint64_t outSeq_ = 0;
};

}  // namespace bagua::core::storewire
