#include "bagua/base/crypto.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace bagua {

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

}  // namespace

void Sha256::reset() {
  static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(h_, kInit, sizeof(h_));
  bufLen_ = 0;
  total_ = 0;
}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (static_cast<uint32_t>(p[4 * i]) << 24) | (static_cast<uint32_t>(p[4 * i + 1]) << 16) |
           (static_cast<uint32_t>(p[4 * i + 2]) << 8) | static_cast<uint32_t>(p[4 * i + 3]);
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + ch + kRound[i] + w[i];
    const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (bufLen_ > 0) {
    const size_t take = std::min(len, sizeof(buf_) - bufLen_);
    std::memcpy(buf_ + bufLen_, p, take);
    bufLen_ += take;
    p += take;
    len -= take;
    if (bufLen_ < sizeof(buf_)) {
      return;
    }
    block(buf_);
    bufLen_ = 0;
  }
  while (len >= 64) {
    block(p);
    p += 64;
    len -= 64;
  }
  if (len > 0) {
    std::memcpy(buf_, p, len);
    bufLen_ = len;
  }
}

Digest Sha256::finish() {
  const uint64_t bits = total_ * 8;
  const uint8_t pad = 0x80;
  update(&pad, 1);
  const uint8_t zero[64] = {};
  const size_t fill = bufLen_ <= 56 ? 56 - bufLen_ : 64 + 56 - bufLen_;
  update(zero, fill);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) {
    len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  }
  update(len, 8);
  Digest out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = static_cast<uint8_t>(h_[i] >> 24);
    out[4 * i + 1] = static_cast<uint8_t>(h_[i] >> 16);
    out[4 * i + 2] = static_cast<uint8_t>(h_[i] >> 8);
    out[4 * i + 3] = static_cast<uint8_t>(h_[i]);
  }
  reset();
  return out;
}

HmacSha256::HmacSha256(const void* key, size_t len) {
  uint8_t k[64] = {};
  if (len > sizeof(k)) {
    Digest d = sha256(key, len);
    std::memcpy(k, d.data(), d.size());
  } else if (len > 0) {
    std::memcpy(k, key, len);
  }
  uint8_t pad[64];
  for (size_t i = 0; i < 64; ++i) {
    pad[i] = k[i] ^ 0x36;
  }
  innerStart_.update(pad, 64);
  for (size_t i = 0; i < 64; ++i) {
    pad[i] = k[i] ^ 0x5c;
  }
  outerStart_.update(pad, 64);
  inner_ = innerStart_;
}

void HmacSha256::updateU32(uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) {
    b[i] = static_cast<uint8_t>(v >> (8 * i));
  }
  inner_.update(b, 4);
}

void HmacSha256::updateU64(uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(v >> (8 * i));
  }
  inner_.update(b, 8);
}

void HmacSha256::updateField(std::string_view s) {
  updateU32(static_cast<uint32_t>(s.size()));
  inner_.update(s.data(), s.size());
}

Digest HmacSha256::finish() {
  Digest innerDigest = inner_.finish();
  Sha256 outer = outerStart_;
  outer.update(innerDigest.data(), innerDigest.size());
  inner_ = innerStart_;
  return outer.finish();
}

Digest sha256(const void* data, size_t len) {
  Sha256 s;
  s.update(data, len);
  return s.finish();
}

Digest hmacSha256(std::string_view key, std::string_view data) {
  HmacSha256 h(key);
  h.update(data);
  return h.finish();
}

bool constantTimeEqual(const void* a, const void* b, size_t len) {
  const auto* x = static_cast<const volatile uint8_t*>(a);
  const auto* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < len; ++i) {
    diff = static_cast<uint8_t>(diff | (x[i] ^ y[i]));
  }
  return diff == 0;
}

Status randomBytes(void* out, size_t len) {
  auto* p = static_cast<uint8_t*>(out);
  while (len > 0) {
    ssize_t n = ::getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return BAGUA_ERRNO(errno, "getrandom");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::ok();
}

std::string toHex(const void* data, size_t len) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string s(2 * len, '0');
  for (size_t i = 0; i < len; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 15];
  }
  return s;
}

}  // namespace bagua
