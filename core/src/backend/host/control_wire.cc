#include "backend/host/control_wire.h"

#include <cstring>

namespace bagua::core::host::wire {

namespace {

void putU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
uint32_t getU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
void putU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
uint64_t getU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  return v;
}

Digest helloTag(HmacSha256& key, const Nonce& nonce, uint32_t from, uint32_t to) {
  key.updateField("hello");
  key.update(nonce.data(), nonce.size());
  key.updateU32(from);
  key.updateU32(to);
  return key.finish();
}

Digest beatTag(HmacSha256& key, const Nonce& nonce, const uint8_t* head) {
  key.update(nonce.data(), nonce.size());
  key.update(head, 24);
  return key.finish();
}

}  // namespace

Result<Nonce> freshNonce() {
  Nonce n;
  BAGUA_RETURN_IF_ERROR(randomBytes(n.data(), n.size()));
  return n;
}

std::string nonceHex(const Nonce& n) {
  return toHex(n.data(), n.size());
}

bool parseNonceHex(std::string_view text, Nonce* out) {
  if (text.size() != 2 * kNonceBytes) {
    return false;
  }
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') {
      return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
      return c - 'a' + 10;
    }
    return -1;
  };
  for (size_t i = 0; i < kNonceBytes; ++i) {
    const int hi = digit(text[2 * i]);
    const int lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return false;
    }
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

std::string publishListener(const std::string& hostPort, const Nonce& nonce) {
  return hostPort + " " + nonceHex(nonce);
}

bool parseListener(const std::string& text, std::string* hostPort, Nonce* nonce) {
  const size_t space = text.rfind(' ');
  if (space == std::string::npos) {
    return false;
  }
  *hostPort = text.substr(0, space);
  return !hostPort->empty() && parseNonceHex(std::string_view(text).substr(space + 1), nonce);
}

Hello encodeHello(HmacSha256& meshKey, const Nonce& listenerNonce, uint32_t from, uint32_t to) {
  Hello h{};
  putU32(h.data(), kHelloMagic);
  putU32(h.data() + 4, kHelloVersion);
  putU32(h.data() + 8, from);
  putU32(h.data() + 12, to);
  const Digest tag = helloTag(meshKey, listenerNonce, from, to);
  std::memcpy(h.data() + 16, tag.data(), tag.size());
  return h;
}

Result<int> verifyHello(const uint8_t* data, size_t len, HmacSha256& meshKey,
                        const Nonce& listenerNonce, int to, int size) {
  if (len != kHelloBytes) {
    return BAGUA_ERROR(kInvalidArgument, "a %zu-byte hello (expected %zu)", len, kHelloBytes);
  }
  if (getU32(data) != kHelloMagic) {
    return BAGUA_ERROR(kInvalidArgument, "not a bagua socket-mesh hello (magic %08x)",
                       getU32(data));
  }
  if (getU32(data + 4) != kHelloVersion) {
    return BAGUA_ERROR(kInvalidArgument, "hello of protocol version %u, this build speaks %u",
                       getU32(data + 4), kHelloVersion);
  }
  const uint32_t from = getU32(data + 8);
  const uint32_t target = getU32(data + 12);
  if (target != static_cast<uint32_t>(to)) {
    return BAGUA_ERROR(kInvalidArgument, "a hello meant for rank %u", target);
  }
  if (from <= static_cast<uint32_t>(to) || from >= static_cast<uint32_t>(size)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "a hello claiming rank %u (only ranks %d..%d connect here)", from, to + 1,
                       size - 1);
  }
  const Digest want = helloTag(meshKey, listenerNonce, from, target);
  if (!constantTimeEqual(want.data(), data + 16, want.size())) {
    return BAGUA_ERROR(kInvalidArgument,
                       "a hello claiming rank %u without the job key's proof (a stranger, or "
                       "BAGUA_JOB_KEY differs)",
                       from);
  }
  return static_cast<int>(from);
}

Datagram encodeBeat(HmacSha256& heartbeatKey, const Nonce& senderNonce, const Beat& beat) {
  Datagram d{};
  putU32(d.data(), kBeatMagic);
  putU32(d.data() + 4, beat.kind);
  putU32(d.data() + 8, beat.from);
  putU32(d.data() + 12, beat.about);
  putU64(d.data() + 16, beat.counter);
  const Digest tag = beatTag(heartbeatKey, senderNonce, d.data());
  std::memcpy(d.data() + 24, tag.data(), tag.size());
  return d;
}

Result<Beat> parseBeat(const uint8_t* data, size_t len) {
  if (len != kDatagramBytes || getU32(data) != kBeatMagic) {
    return BAGUA_ERROR(kInvalidArgument, "not a bagua heartbeat (%zu bytes)", len);
  }
  Beat b;
  b.kind = getU32(data + 4);
  b.from = getU32(data + 8);
  b.about = getU32(data + 12);
  b.counter = getU64(data + 16);
  if (b.kind < kBeat || b.kind > kLost) {
    return BAGUA_ERROR(kInvalidArgument, "heartbeat of unknown kind %u", b.kind);
  }
  return b;
}

bool verifyBeat(const uint8_t* data, HmacSha256& heartbeatKey, const Nonce& senderNonce) {
  const Digest want = beatTag(heartbeatKey, senderNonce, data);
  return constantTimeEqual(want.data(), data + 24, want.size());
}

Digest engineProof(HmacSha256& engineKey, uint32_t from, uint32_t to, const Challenge& challenge) {
  engineKey.updateField("engine");
  engineKey.updateU32(from);
  engineKey.updateU32(to);
  engineKey.update(challenge.data(), challenge.size());
  return engineKey.finish();
}

}  // namespace bagua::core::host::wire
