// What the host backend's connection set-up and heartbeats put on the wire, with no sockets:
// socket_transport.cc, peer_monitor.cc and engine_transport.cc send and check these, the fuzz
// target (tests/core/fuzz) feeds them arbitrary bytes. Every message carries an HMAC-SHA256 under
// a key derived from the job key for its kind (job_key.h: "mesh", "heartbeat", "engine"), so a
// process without the key can neither claim a rank nor change what a rank believes about its
// peers (core/README.md, "Security").
//
// Socket-mesh hello (48 bytes, the connecting rank's first bytes on the connection):
//   magic u32 | version u32 | from u32 | to u32 | HMAC(Km, "hello", listener nonce, from, to)
// The listener's nonce (16 random bytes, fresh per listener) is published beside its address,
// so a hello recorded at one set-up is worth nothing at another.
//
// Heartbeat datagram (56 bytes):
//   magic u32 | kind u32 | from u32 | about u32 | counter u64 | HMAC(Kh, sender nonce, the 24
//   bytes before)
// The sender's nonce is published with its UDP address; its counter rises with every datagram,
// and a receiver accepts only a counter above the last one it accepted from that rank, and only
// from the address that rank published.
//
// Engine connection proof (16-byte challenge, 32-byte answer): over a new engine connection
// pair each rank sends a random challenge and answers the peer's with
//   HMAC(Ke, "engine", from, to, challenge)
// before any data moves.
//
// Thread safety: pure functions; an HmacSha256 passed in is used (and reset) by the call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bagua/base/crypto.h"
#include "bagua/base/status.h"

namespace bagua::core::host::wire {

inline constexpr size_t kNonceBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;

Result<Nonce> freshNonce();
std::string nonceHex(const Nonce& n);
// 32 hex digits; false otherwise.
bool parseNonceHex(std::string_view text, Nonce* out);

// ---- socket-mesh hello ----
inline constexpr uint32_t kHelloMagic = 0xBA6A0C0Eu;
inline constexpr uint32_t kHelloVersion = 2;
inline constexpr size_t kHelloBytes = 16 + kSha256Bytes;
using Hello = std::array<uint8_t, kHelloBytes>;

// "ip:port" and the listener's nonce as published under "addr/<rank>": "ip:port nonce".
std::string publishListener(const std::string& hostPort, const Nonce& nonce);
bool parseListener(const std::string& text, std::string* hostPort, Nonce* nonce);

Hello encodeHello(HmacSha256& meshKey, const Nonce& listenerNonce, uint32_t from, uint32_t to);
// The rank a hello to rank `to` of a communicator of `size` ranks proves it is (a higher rank
// than `to`: the higher rank connects); InvalidArgument saying what is wrong otherwise.
Result<int> verifyHello(const uint8_t* data, size_t len, HmacSha256& meshKey,
                        const Nonce& listenerNonce, int to, int size);

// ---- heartbeat datagram ----
inline constexpr uint32_t kBeatMagic = 0x32484742;  // "BGH2" little endian
inline constexpr uint32_t kBeat = 1;
inline constexpr uint32_t kBye = 2;
inline constexpr uint32_t kLost = 3;  // `about` is the rank the sender declared lost
inline constexpr size_t kDatagramBytes = 24 + kSha256Bytes;
using Datagram = std::array<uint8_t, kDatagramBytes>;

struct Beat {
  uint32_t kind = kBeat;
  uint32_t from = 0;
  uint32_t about = 0;
  uint64_t counter = 0;
};

Datagram encodeBeat(HmacSha256& heartbeatKey, const Nonce& senderNonce, const Beat& beat);
// The fields of a datagram of the right size and magic (not yet verified); InvalidArgument
// otherwise.
Result<Beat> parseBeat(const uint8_t* data, size_t len);
// True when the datagram's tag verifies under the sender's nonce (parseBeat accepted it).
bool verifyBeat(const uint8_t* data, HmacSha256& heartbeatKey, const Nonce& senderNonce);

// ---- engine connection proof ----
inline constexpr size_t kChallengeBytes = 16;
using Challenge = std::array<uint8_t, kChallengeBytes>;
Digest engineProof(HmacSha256& engineKey, uint32_t from, uint32_t to, const Challenge& challenge);

}  // namespace bagua::core::host::wire
