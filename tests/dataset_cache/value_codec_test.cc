// The typed cache codec (value_codec.h): what it encodes comes back item for item, and what a
// stranger or a broken disk could put in a cache (every truncation and a set of crafted lies)
// is refused with an error, never believed.
#include "bagua/dataset_cache/value_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace bagua::cache::codec {
namespace {

using namespace std::string_literals;

Item make(Tag t) {
  Item it;
  it.tag = t;
  return it;
}

// {"image": float32[2,3], "label": 7, "name": "café", "raw": b"\0\1", "aug": [None, True, 2.5,
//  (False,)]}
std::vector<Item> sample(const std::string& floats) {
  std::vector<Item> v;
  Item d = make(Tag::kDict);
  d.count = 5;
  v.push_back(d);
  Item k = make(Tag::kStr);
  k.data = "image";
  v.push_back(k);
  Item a = make(Tag::kArray);
  a.elem = static_cast<uint8_t>(Elem::kF32);
  a.shape = {2, 3};
  a.data = floats;
  v.push_back(a);
  k.data = "label";
  v.push_back(k);
  Item i = make(Tag::kInt);
  i.integer = -7;
  v.push_back(i);
  k.data = "name";
  v.push_back(k);
  Item s = make(Tag::kStr);
  s.data = "caf\xc3\xa9";
  v.push_back(s);
  k.data = "raw";
  v.push_back(k);
  Item b = make(Tag::kBytes);
  b.data = std::string_view("\0\1", 2);
  v.push_back(b);
  k.data = "aug";
  v.push_back(k);
  Item l = make(Tag::kList);
  l.count = 4;
  v.push_back(l);
  v.push_back(make(Tag::kNone));
  v.push_back(make(Tag::kTrue));
  Item f = make(Tag::kFloat);
  f.real = 2.5;
  v.push_back(f);
  Item t = make(Tag::kTuple);
  t.count = 1;
  v.push_back(t);
  v.push_back(make(Tag::kFalse));
  return v;
}

std::string floats() {
  std::string s(24, '\0');
  for (int i = 0; i < 6; ++i) {
    float x = static_cast<float>(i) * 0.5f;
    std::memcpy(s.data() + 4 * i, &x, 4);
  }
  return s;
}

TEST(ValueCodec, RoundTripsItemForItem) {
  const std::string f = floats();
  const std::vector<Item> in = sample(f);
  auto bytes = encode(in);
  ASSERT_TRUE(bytes.isOk()) << bytes.status().toString();
  EXPECT_TRUE(isTyped(*bytes));
  auto out = decode(*bytes);
  ASSERT_TRUE(out.isOk()) << out.status().toString();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const Item& a = in[i];
    const Item& b = (*out)[i];
    EXPECT_EQ(a.tag, b.tag) << i;
    EXPECT_EQ(a.integer, b.integer) << i;
    EXPECT_EQ(a.real, b.real) << i;
    EXPECT_EQ(a.count, b.count) << i;
    EXPECT_EQ(a.data, b.data) << i;
    EXPECT_EQ(a.elem, b.elem) << i;
    EXPECT_EQ(a.shape, b.shape) << i;
  }
  // Canonical: what decodes re-encodes to the same bytes.
  auto again = encode(*out);
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(*again, *bytes);
}

TEST(ValueCodec, EveryTruncationAndTrailingByteIsRefused) {
  const std::string f = floats();
  const std::string bytes = *encode(sample(f));
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode(std::string_view(bytes).substr(0, n)).isOk()) << "prefix " << n;
  }
  EXPECT_FALSE(decode(bytes + "x").isOk());
  EXPECT_FALSE(decode("BGP1 a pickle").isOk());
}

TEST(ValueCodec, CraftedLiesAreRefusedBeforeTheyCostAnything) {
  auto u64 = [](uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) {
      s[i] = static_cast<char>(v >> (8 * i));
    }
    return s;
  };
  const std::string m(kMagic);
  // A list claiming 2^60 elements (an allocation a trusting decoder would make).
  EXPECT_FALSE(decode(m + "\x07"s + u64(uint64_t{1} << 60)).isOk());
  // A string longer than the value.
  EXPECT_FALSE(decode(m + "\x05"s + u64(1000) + "abc").isOk());
  // Not UTF-8 (an overlong '/', a lone surrogate).
  EXPECT_FALSE(decode(m + "\x05"s + u64(2) + "\xc0\xaf"s).isOk());
  EXPECT_FALSE(decode(m + "\x05"s + u64(3) + "\xed\xa0\x80"s).isOk());
  // An array whose shape overflows, and one whose data is short.
  EXPECT_FALSE(decode(m + "\x0a\x08\x00\x02"s + u64(uint64_t{1} << 62) + u64(8)).isOk());
  EXPECT_FALSE(decode(m + "\x0a\x08\x00\x01"s + u64(4) + std::string(15, '\0')).isOk());
  EXPECT_TRUE(decode(m + "\x0a\x08\x00\x01"s + u64(4) + std::string(16, '\0')).isOk());
  // An unknown element type, an unknown tag.
  EXPECT_FALSE(decode(m + "\x0a\x63\x00\x00"s).isOk());
  EXPECT_FALSE(decode(m + "\x63"s).isOk());
  // Nested deeper than the limit, and an empty list nested as deep as it allows.
  std::string deep = m;
  for (int i = 0; i < 65; ++i) {
    deep += "\x07"s + u64(1);
  }
  deep += "\x00"s;
  EXPECT_FALSE(decode(deep).isOk());
  std::string ok = m;
  for (int i = 0; i < 64; ++i) {
    ok += "\x07"s + u64(1);
  }
  ok += "\x00"s;
  EXPECT_TRUE(decode(ok).isOk());
}

TEST(ValueCodec, EncodeRefusesItemsThatAreNotOneValue) {
  Item a = make(Tag::kArray);
  a.elem = static_cast<uint8_t>(Elem::kF64);
  a.shape = {3};
  a.data = "12345678";
  EXPECT_FALSE(encode(std::vector<Item>{a}).isOk());  // 8 bytes for 3 doubles
  Item l = make(Tag::kList);
  l.count = 2;
  EXPECT_FALSE(encode(std::vector<Item>{l, make(Tag::kNone)}).isOk());  // one element short
  EXPECT_FALSE(encode(std::vector<Item>{make(Tag::kNone), make(Tag::kNone)}).isOk());
  Item s = make(Tag::kStr);
  s.data = "\xff";
  EXPECT_FALSE(encode(std::vector<Item>{s}).isOk());
  EXPECT_EQ(elemSize(static_cast<uint8_t>(Elem::kC128)), 16u);
  EXPECT_EQ(elemSize(200), 0u);
}

}  // namespace
}  // namespace bagua::cache::codec
