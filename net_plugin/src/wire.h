// Wire formats of the Bagua-Net engine: the connection handle, the hello every socket opens with,
// the control record (one per message, on the control stream) and the chunk header (one per
// chunk, on a data stream). All integers little-endian, fixed offsets, explicit encode/decode
// (no struct punning), so the decoders can be fuzzed and never trust a length they read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/net/engine.h"

namespace bagua::net::wire {

inline constexpr uint32_t kHandleMagic = 0x4e474142;   // "BAGN"
inline constexpr uint32_t kHelloMagic = 0x48474142;    // "BAGH"
inline constexpr uint32_t kControlMagic = 0x43474142;  // "BAGC"
inline constexpr uint32_t kChunkMagic = 0x44474142;    // "BAGD"
inline constexpr uint16_t kVersion = 1;

// ---- little-endian helpers ---------------------------------------------------------------------
inline void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
inline void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
inline uint16_t get16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}
inline uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | p[i];
  }
  return v;
}

// ---- handle ------------------------------------------------------------------------------------
// Layout: 0 magic u32 | 4 version u16 | 6 family u16 (4 or 6) | 8 port u16 | 10 zero u16 |
// 12 scope id u32 | 16 address 16 bytes | 32 nonce u64 | 40 extra rails u8 | 41..47 zero |
// 48 + 6j (j < extra rails): IPv4 address 4 bytes | port u16 | 96..127 caller's.
// Rail 0 is the address at 16; rails 1.. (a device spanning several interfaces) are IPv4 only.
// A handle without extra rails is byte-identical to the single-address handle of earlier builds.
// 8: a virtual NIC of NCCL 2.30 (v12) holds up to 8 devices, 9 rails leave room for all of them.
inline constexpr size_t kMaxExtraRails = (kHandleCallerOffset - 48) / 6;
static_assert(kMaxExtraRails >= 8);
struct HandleInfo {
  SocketAddress address;             // rail 0
  std::vector<SocketAddress> extra;  // rails 1..: IPv4, at most kMaxExtraRails
  uint64_t nonce = 0;

  size_t rails() const { return 1 + extra.size(); }
  const SocketAddress& rail(size_t r) const { return r == 0 ? address : extra[r - 1]; }
};
// Extra rails beyond kMaxExtraRails or not IPv4 are a caller bug (Listener::create checks).
void encodeHandle(const HandleInfo& info, Handle* out);
// kInvalidArgument with a clear message on a wrong magic, version, family or rail list.
Result<HandleInfo> decodeHandle(const uint8_t* bytes, size_t length);

// ---- hello (first bytes on every socket, connector -> listener) -------------------------------
// 0 magic u32 | 4 version u16 | 6 kind u8 (0 control, 1 data) | 7 zero u8 | 8 index u16 |
// 10 nStreams u16 | 12 zero u32 | 16 nonce u64 | 24 connection id u64
inline constexpr size_t kHelloBytes = 32;
enum class StreamKind : uint8_t { kControl = 0, kData = 1 };
struct Hello {
  StreamKind kind = StreamKind::kControl;
  uint16_t index = 0;     // data stream index (0 for control)
  uint16_t nStreams = 0;  // data streams of the connection
  uint64_t nonce = 0;     // listener's nonce from the handle
  uint64_t connId = 0;    // same on all sockets of one connection
};
void encodeHello(const Hello& h, uint8_t* out);
Result<Hello> decodeHello(const uint8_t* bytes, size_t length);

// ---- control record (sender -> receiver, one per message) -------------------------------------
// 0 magic u32 | 4 inline length u32 | 8 sequence u64 | 16 size u64 ; then inline bytes
inline constexpr size_t kControlBytes = 24;
struct ControlRecord {
  uint64_t seq = 0;
  uint64_t size = 0;         // message size in bytes
  uint32_t inlineBytes = 0;  // payload following the record (== size when inline, else 0)
};
void encodeControl(const ControlRecord& r, uint8_t* out);
// `maxInline` bounds the inline length accepted.
Result<ControlRecord> decodeControl(const uint8_t* bytes, size_t length, uint64_t maxInline);

// ---- chunk header (one per chunk on a data stream) --------------------------------------------
// 0 magic u32 | 4 length u32 | 8 sequence u64 | 16 offset u64 | 24 zero u64 ; then payload
inline constexpr size_t kChunkBytes = 32;
// Largest chunk a receiver accepts (the sender's options decide the actual size).
inline constexpr uint64_t kMaxChunkWire = uint64_t{1} << 30;
struct ChunkHeader {
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};
void encodeChunk(const ChunkHeader& c, uint8_t* out);
// `maxChunk` bounds the length accepted; offset + length must not overflow.
Result<ChunkHeader> decodeChunk(const uint8_t* bytes, size_t length, uint64_t maxChunk);

// ---- chunking ----------------------------------------------------------------------------------
// Chunk size for a message of `size` bytes over `nStreams` streams: ceil(size / nStreams)
// clamped to [minChunk, maxChunk] (so a message is spread over the streams, yet chunks stay
// large enough to amortise their header and small enough to balance dynamically).
uint64_t chunkBytesFor(uint64_t size, int nStreams, uint64_t minChunk, uint64_t maxChunk);
// Number of chunks of `chunk` bytes covering `size` bytes (0 for size 0).
inline uint64_t chunkCount(uint64_t size, uint64_t chunk) {
  return chunk == 0 ? 0 : (size + chunk - 1) / chunk;
}

}  // namespace bagua::net::wire
