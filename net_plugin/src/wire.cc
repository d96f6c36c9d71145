#include "wire.h"

#include <netinet/in.h>

#include <algorithm>

namespace bagua::net::wire {

void encodeHandle(const HandleInfo& info, Handle* out) {
  out->fill(0);
  uint8_t* p = out->data();
  put32(p, kHandleMagic);
  put16(p + 4, kVersion);
  const SocketAddress& a = info.address;
  if (a.family() == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    put16(p + 6, 6);
    put16(p + 8, ntohs(s6->sin6_port));
    put32(p + 12, s6->sin6_scope_id);
    std::memcpy(p + 16, &s6->sin6_addr, 16);
  } else {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&a.storage);
    put16(p + 6, 4);
    put16(p + 8, ntohs(s4->sin_port));
    std::memcpy(p + 16, &s4->sin_addr, 4);
  }
  put64(p + 32, info.nonce);
  size_t extra = std::min(info.extra.size(), kMaxExtraRails);
  p[40] = static_cast<uint8_t>(extra);
  for (size_t j = 0; j < extra; ++j) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&info.extra[j].storage);
    uint8_t* e = p + 48 + 6 * j;
    std::memcpy(e, &s4->sin_addr, 4);
    put16(e + 4, ntohs(s4->sin_port));
  }
}

Result<HandleInfo> decodeHandle(const uint8_t* bytes, size_t length) {
  if (bytes == nullptr || length < kHandleCallerOffset) {
    return BAGUA_ERROR(kInvalidArgument, "connection handle too short: %zu bytes, need %zu", length,
                       kHandleCallerOffset);
  }
  uint32_t magic = get32(bytes);
  if (magic != kHandleMagic) {
    return BAGUA_ERROR(kInvalidArgument,
                       "not a Bagua-Net connection handle (magic 0x%08x, expected 0x%08x): was it "
                       "made by another plugin or NCCL transport?",
                       magic, kHandleMagic);
  }
  uint16_t version = get16(bytes + 4);
  if (version != kVersion) {
    return BAGUA_ERROR(kInvalidArgument,
                       "connection handle from Bagua-Net wire version %u, this build speaks %u: "
                       "use the same plugin build on every rank",
                       version, kVersion);
  }
  HandleInfo info;
  uint16_t family = get16(bytes + 6);
  uint16_t port = get16(bytes + 8);
  if (family == 4) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&info.address.storage);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    std::memcpy(&s4->sin_addr, bytes + 16, 4);
    info.address.length = sizeof(sockaddr_in);
  } else if (family == 6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&info.address.storage);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    s6->sin6_scope_id = get32(bytes + 12);
    std::memcpy(&s6->sin6_addr, bytes + 16, 16);
    info.address.length = sizeof(sockaddr_in6);
  } else {
    return BAGUA_ERROR(kInvalidArgument, "connection handle has unknown address family %u", family);
  }
  if (port == 0) {
    return BAGUA_ERROR(kInvalidArgument, "connection handle has port 0");
  }
  info.nonce = get64(bytes + 32);
  size_t extra = bytes[40];
  if (extra > kMaxExtraRails) {
    return BAGUA_ERROR(kInvalidArgument, "connection handle lists %zu extra rails (at most %zu)",
                       extra, kMaxExtraRails);
  }
  for (size_t j = 0; j < extra; ++j) {
    const uint8_t* e = bytes + 48 + 6 * j;
    SocketAddress a;
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.storage);
    s4->sin_family = AF_INET;
    std::memcpy(&s4->sin_addr, e, 4);
    s4->sin_port = htons(get16(e + 4));
    a.length = sizeof(sockaddr_in);
    if (s4->sin_port == 0) {
      return BAGUA_ERROR(kInvalidArgument, "connection handle: rail %zu has port 0", j + 1);
    }
    info.extra.push_back(a);
  }
  return info;
}

void encodeHello(const Hello& h, uint8_t* out) {
  std::memset(out, 0, kHelloBytes);
  put32(out, kHelloMagic);
  put16(out + 4, kVersion);
  out[6] = static_cast<uint8_t>(h.kind);
  put16(out + 8, h.index);
  put16(out + 10, h.nStreams);
  put64(out + 16, h.nonce);
  put64(out + 24, h.connId);
}

Result<Hello> decodeHello(const uint8_t* bytes, size_t length) {
  if (length < kHelloBytes) {
    return BAGUA_ERROR(kRemoteError, "hello too short: %zu bytes", length);
  }
  uint32_t magic = get32(bytes);
  if (magic != kHelloMagic) {
    return BAGUA_ERROR(kRemoteError, "bad hello magic 0x%08x (a stranger, not a Bagua-Net peer)",
                       magic);
  }
  uint16_t version = get16(bytes + 4);
  if (version != kVersion) {
    return BAGUA_ERROR(kRemoteError, "peer speaks Bagua-Net wire version %u, we speak %u", version,
                       kVersion);
  }
  Hello h;
  if (bytes[6] > 1) {
    return BAGUA_ERROR(kRemoteError, "hello has unknown stream kind %u", bytes[6]);
  }
  h.kind = static_cast<StreamKind>(bytes[6]);
  h.index = get16(bytes + 8);
  h.nStreams = get16(bytes + 10);
  h.nonce = get64(bytes + 16);
  h.connId = get64(bytes + 24);
  if (h.nStreams < 1 || h.nStreams > kMaxStreams) {
    return BAGUA_ERROR(kRemoteError, "hello announces %u data streams (accepted 1..%d)", h.nStreams,
                       kMaxStreams);
  }
  if (h.kind == StreamKind::kData && h.index >= h.nStreams) {
    return BAGUA_ERROR(kRemoteError, "hello: data stream index %u out of range (%u streams)",
                       h.index, h.nStreams);
  }
  if (h.kind == StreamKind::kControl && h.index != 0) {
    return BAGUA_ERROR(kRemoteError, "hello: control stream with index %u", h.index);
  }
  return h;
}

void encodeControl(const ControlRecord& r, uint8_t* out) {
  put32(out, kControlMagic);
  put32(out + 4, r.inlineBytes);
  put64(out + 8, r.seq);
  put64(out + 16, r.size);
}

Result<ControlRecord> decodeControl(const uint8_t* bytes, size_t length, uint64_t maxInline) {
  if (length < kControlBytes) {
    return BAGUA_ERROR(kRemoteError, "control record too short: %zu bytes", length);
  }
  uint32_t magic = get32(bytes);
  if (magic != kControlMagic) {
    return BAGUA_ERROR(kRemoteError, "bad control record magic 0x%08x (stream out of sync)", magic);
  }
  ControlRecord r;
  r.inlineBytes = get32(bytes + 4);
  r.seq = get64(bytes + 8);
  r.size = get64(bytes + 16);
  if (r.inlineBytes > maxInline) {
    return BAGUA_ERROR(kRemoteError, "control record carries %u inline bytes, limit %llu",
                       r.inlineBytes, static_cast<unsigned long long>(maxInline));
  }
  if (r.inlineBytes != 0 && r.inlineBytes != r.size) {
    return BAGUA_ERROR(kRemoteError,
                       "control record: inline length %u differs from message size %llu",
                       r.inlineBytes, static_cast<unsigned long long>(r.size));
  }
  return r;
}

void encodeChunk(const ChunkHeader& c, uint8_t* out) {
  put32(out, kChunkMagic);
  put32(out + 4, c.length);
  put64(out + 8, c.seq);
  put64(out + 16, c.offset);
  put64(out + 24, 0);
}

Result<ChunkHeader> decodeChunk(const uint8_t* bytes, size_t length, uint64_t maxChunk) {
  if (length < kChunkBytes) {
    return BAGUA_ERROR(kRemoteError, "chunk header too short: %zu bytes", length);
  }
  uint32_t magic = get32(bytes);
  if (magic != kChunkMagic) {
    return BAGUA_ERROR(kRemoteError, "bad chunk header magic 0x%08x (data stream out of sync)",
                       magic);
  }
  ChunkHeader c;
  c.length = get32(bytes + 4);
  c.seq = get64(bytes + 8);
  c.offset = get64(bytes + 16);
  if (c.length == 0 || c.length > maxChunk) {
    return BAGUA_ERROR(kRemoteError, "chunk length %u outside 1..%llu", c.length,
                       static_cast<unsigned long long>(maxChunk));
  }
  if (c.offset > UINT64_MAX - c.length) {
    return BAGUA_ERROR(kRemoteError, "chunk offset %llu overflows",
                       static_cast<unsigned long long>(c.offset));
  }
  return c;
}

uint64_t chunkBytesFor(uint64_t size, int nStreams, uint64_t minChunk, uint64_t maxChunk) {
  uint64_t n = nStreams < 1 ? 1 : static_cast<uint64_t>(nStreams);
  uint64_t even = (size + n - 1) / n;
  uint64_t lo = std::max<uint64_t>(minChunk, 1);
  uint64_t hi = std::max(maxChunk, lo);
  return std::clamp(even, lo, hi);
}

}  // namespace bagua::net::wire
