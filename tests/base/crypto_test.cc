// SHA-256 against the FIPS 180-4 / NIST examples, HMAC-SHA256 against the RFC 4231 test cases,
// incremental use against one-shot use, and the helpers the control plane builds on.
#include "bagua/base/crypto.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace bagua {
namespace {

std::string hex(const Digest& d) {
  return toHex(d.data(), d.size());
}

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(hex(sha256("", 0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc", 3)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(hex(sha256(two.data(), two.size())),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string four =
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
      "nopqrsmnopqrstnopqrstu";
  EXPECT_EQ(hex(sha256(four.data(), four.size())),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(hex(sha256(million.data(), million.size())),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShotAtEveryPaddingBoundary) {
  std::mt19937 rng(7);
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000}) {
    std::string msg(len, '\0');
    for (char& c : msg) {
      c = static_cast<char>(rng());
    }
    const Digest whole = sha256(msg.data(), msg.size());
    Sha256 s;
    size_t pos = 0;
    while (pos < len) {
      const size_t take = std::min<size_t>(len - pos, rng() % 70);
      s.update(msg.data() + pos, take);
      pos += take;
    }
    EXPECT_EQ(hex(s.finish()), hex(whole)) << "length " << len;
    // finish() reset the object: it hashes the next message from scratch.
    s.update(msg);
    EXPECT_EQ(hex(s.finish()), hex(whole)) << "length " << len;
  }
}

struct HmacCase {
  std::string key;
  std::string data;
  std::string tag;  // hex; test case 5 is truncated to 128 bits
};

TEST(HmacSha256, Rfc4231TestCases) {
  std::string key4;
  for (int i = 1; i <= 25; ++i) {
    key4 += static_cast<char>(i);
  }
  const std::vector<HmacCase> cases = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(20, '\x0c'), "Test With Truncation", "a3b6167473100ee06e0c796c2955552b"},
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The "
       "key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const HmacCase& c = cases[i];
    EXPECT_EQ(hex(hmacSha256(c.key, c.data)).substr(0, c.tag.size()), c.tag)
        << "RFC 4231 test case " << i + 1;
  }
}

TEST(HmacSha256, ReusableAfterFinishAndFieldsAreUnambiguous) {
  HmacSha256 h(std::string_view("a key of the job"));
  h.update("frame one");
  const Digest first = h.finish();
  h.update("frame one");
  EXPECT_EQ(hex(h.finish()), hex(first));
  EXPECT_EQ(hex(first), hex(hmacSha256("a key of the job", "frame one")));

  h.updateField("ab");
  h.updateField("c");
  const Digest split1 = h.finish();
  h.updateField("a");
  h.updateField("bc");
  EXPECT_NE(hex(h.finish()), hex(split1));

  h.updateU32(0x01020304);
  const Digest u32 = h.finish();
  EXPECT_EQ(hex(u32), hex(hmacSha256("a key of the job", std::string("\x04\x03\x02\x01", 4))));
  h.updateU64(5);
  EXPECT_EQ(hex(h.finish()),
            hex(hmacSha256("a key of the job", std::string("\x05\0\0\0\0\0\0\0", 8))));
}

TEST(Crypto, ConstantTimeEqualComparesEveryByte) {
  Digest a{};
  Digest b{};
  EXPECT_TRUE(constantTimeEqual(a.data(), b.data(), a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    b = a;
    b[i] ^= 0x80;
    EXPECT_FALSE(constantTimeEqual(a.data(), b.data(), a.size())) << "byte " << i;
  }
  EXPECT_TRUE(constantTimeEqual(a.data(), b.data(), 0));
}

TEST(Crypto, RandomBytesDiffer) {
  uint8_t x[32] = {};
  uint8_t y[32] = {};
  ASSERT_TRUE(randomBytes(x, sizeof(x)).isOk());
  ASSERT_TRUE(randomBytes(y, sizeof(y)).isOk());
  EXPECT_NE(toHex(x, sizeof(x)), toHex(y, sizeof(y)));
  EXPECT_EQ(toHex("\x00\xff\x10", 3), "00ff10");
}

}  // namespace
}  // namespace bagua
