// SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), a constant-time comparison and the kernel's
// random bytes: what the control plane needs to authenticate its messages with the job's key
// (core/README.md, "Security"). Written here rather than taken from OpenSSL so that no installed
// library or wheel gains a dependency; the control plane MACs frames of a few hundred bytes, so
// a portable implementation (no SHA extensions) is enough. Checked against the FIPS 180-4
// examples and the RFC 4231 test cases (tests/base/crypto_test.cc) and fuzzed through the
// control-plane decoders.
//
// Thread safety: the objects are not shared; the free functions are pure (randomBytes reads the
// kernel's generator, which is thread-safe).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "bagua/base/status.h"

namespace bagua {

inline constexpr size_t kSha256Bytes = 32;
using Digest = std::array<uint8_t, kSha256Bytes>;

// Incremental SHA-256. finish() returns the digest and resets the object for a new message.
class Sha256 {
 public:
  Sha256() { reset(); }
  void reset();
  void update(const void* data, size_t len);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest finish();

 private:
  void block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t bufLen_ = 0;
  uint64_t total_ = 0;
};

// Incremental HMAC-SHA256 under one key; finish() returns the tag and readies the object for the
// next message under the same key (so a session MACs many frames without re-hashing the key).
class HmacSha256 {
 public:
  HmacSha256(const void* key, size_t len);
  explicit HmacSha256(std::span<const uint8_t> key) : HmacSha256(key.data(), key.size()) {}
  explicit HmacSha256(std::string_view key) : HmacSha256(key.data(), key.size()) {}

  void update(const void* data, size_t len) { inner_.update(data, len); }
  void update(std::string_view s) { inner_.update(s.data(), s.size()); }
  void update(std::span<const uint8_t> s) { inner_.update(s.data(), s.size()); }
  // Fixed-width little-endian integers, so that fields cannot be confused by their length.
  void updateU32(uint32_t v);
  void updateU64(uint64_t v);
  // A length-prefixed string (u32 length, bytes): two fields "ab","c" and "a","bc" differ.
  void updateField(std::string_view s);
  Digest finish();

 private:
  Sha256 innerStart_;  // the state after absorbing key ^ ipad
  Sha256 outerStart_;  // ... key ^ opad
  Sha256 inner_;
};

Digest sha256(const void* data, size_t len);
Digest hmacSha256(std::string_view key, std::string_view data);

// True when the `len` bytes at a and b are equal; the time taken does not depend on where they
// differ (a verifier must not leak how much of a forged tag was right).
bool constantTimeEqual(const void* a, const void* b, size_t len);

// Fills `out` from the kernel's CSPRNG (getrandom(2)); fails only when the kernel refuses.
Status randomBytes(void* out, size_t len);

// Lower-case hex of the bytes.
std::string toHex(const void* data, size_t len);

}  // namespace bagua
