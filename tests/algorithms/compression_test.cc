// MinMaxUInt8 compression: Bagua's layout byte by byte, bit-for-bit agreement with a scalar
// transcription of Bagua's formula, the round-trip error bound against double precision, and
// the edge cases (constant chunk, zero length, one element, short last chunk, NaN/Inf policy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "bagua/algorithms/compression.h"

namespace bagua::algo {
namespace {

float headerFloat(const std::vector<uint8_t>& buf, size_t offset) {
  float f = 0.0f;
  std::memcpy(&f, buf.data() + offset, sizeof(float));
  return f;
}

// Bagua's formula written plainly (std::nearbyint, std::min_element), plus our clamp.
std::vector<uint8_t> referenceCompress(const std::vector<float>& x, size_t chunks) {
  const size_t c = (x.size() + chunks - 1) / chunks;
  const size_t seg = (c + 31) / 32 * 32 + 32;
  std::vector<uint8_t> out(chunks * seg, 0);
  for (size_t j = 0; j < chunks; ++j) {
    const size_t begin = std::min(j * c, x.size());
    const size_t end = std::min(begin + c, x.size());
    uint8_t* s = out.data() + j * seg;
    if (begin == end) {
      continue;  // header 0, 0
    }
    const float mn = *std::min_element(x.begin() + begin, x.begin() + end) + 0.0f;  // no -0
    const float mx = *std::max_element(x.begin() + begin, x.begin() + end) + 0.0f;
    std::memcpy(s, &mn, 4);
    std::memcpy(s + 4, &mx, 4);
    const float scale = 255.0f / (mx - mn + 1e-7f);
    const float upper = std::nearbyint(mx * scale);
    const float lower = upper - 255.0f;
    for (size_t i = begin; i < end; ++i) {
      float q = std::min(std::nearbyint(x[i] * scale), upper) - lower;
      q = std::clamp(q, 0.0f, 255.0f);
      s[32 + i - begin] = static_cast<uint8_t>(q);
    }
  }
  return out;
}

std::vector<float> pattern(size_t n, uint32_t seed, float spread = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    // Chunk-dependent offsets so a chunk's min/max computed over the wrong range shows.
    x[i] = d(rng) + static_cast<float>((i / 37) % 5) * 10.0f;
  }
  return x;
}

TEST(MinMaxRounding, MatchesNearbyintBitwise) {
  std::vector<float> v = {0.5f,        1.5f,  2.5f,   -0.5f,      -1.5f,      -2.5f,
                          0.49999997f, -0.3f, -0.0f,  0.0f,       8388607.5f, 8388608.0f,
                          -8388607.5f, 1e30f, -1e30f, 4194303.5f, 2.55e9f,    -2.55e9f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1e7f, 1e7f);
  for (int i = 0; i < 200000; ++i) {
    v.push_back(u(rng));
    v.push_back(static_cast<float>(i) * 0.5f - 50000.0f);  // exact ties
  }
  for (float x : v) {
    const float a = roundHalfEven(x);
    const float b = std::nearbyint(x);
    ASSERT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << x << " -> " << a << " vs " << b;
  }
  EXPECT_TRUE(std::isnan(roundHalfEven(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(roundHalfEven(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
}

TEST(MinMaxLayout, SizesAndSegments) {
  EXPECT_EQ(minMaxChunkElements(100, 3), 34u);
  EXPECT_EQ(minMaxSegmentBytes(34), 64u + 32u);
  EXPECT_EQ(minMaxCompressedBytes(100, 3), 3u * 96u);
  EXPECT_EQ(minMaxCompressedBytes(64, 2), 2u * 64u);  // 32 elements: one 32-byte payload
  EXPECT_EQ(minMaxCompressedBytes(0, 4), 4u * 32u);
  EXPECT_EQ(minMaxCompressedBytes(1, 1), 64u);
}

TEST(MinMaxLayout, HeaderPayloadAndPaddingBytes) {
  const auto x = pattern(100, 1);
  std::vector<uint8_t> buf(minMaxCompressedBytes(100, 3), 0xAB);
  ASSERT_TRUE(minMaxCompress(x.data(), x.size(), 3, buf.data(), buf.size()).isOk());
  const size_t seg = 96;
  for (size_t j = 0; j < 3; ++j) {
    const size_t begin = j * 34;
    const size_t end = std::min<size_t>(begin + 34, 100);
    EXPECT_EQ(headerFloat(buf, j * seg), *std::min_element(x.begin() + begin, x.begin() + end));
    EXPECT_EQ(headerFloat(buf, j * seg + 4), *std::max_element(x.begin() + begin, x.begin() + end));
    for (size_t b = 8; b < 32; ++b) {
      EXPECT_EQ(buf[j * seg + b], 0) << "header padding, chunk " << j << " byte " << b;
    }
    for (size_t b = 32 + (end - begin); b < seg; ++b) {
      EXPECT_EQ(buf[j * seg + b], 0) << "payload padding, chunk " << j << " byte " << b;
    }
    // The chunk's extremes map to 0 and 255.
    const uint8_t* q = buf.data() + j * seg + 32;
    EXPECT_EQ(*std::min_element(q, q + (end - begin)), 0);
    EXPECT_EQ(*std::max_element(q, q + (end - begin)), 255);
  }
  EXPECT_EQ(buf, referenceCompress(x, 3));
}

TEST(MinMaxCompress, BitwiseEqualToReference) {
  for (size_t n : {1u, 2u, 31u, 32u, 33u, 255u, 1000u, 4097u}) {
    for (size_t chunks : {1u, 2u, 3u, 8u}) {
      const auto x = pattern(n, static_cast<uint32_t>(n * 31 + chunks), n % 2 ? 0.01f : 5.0f);
      std::vector<uint8_t> buf(minMaxCompressedBytes(n, chunks), 0xCD);
      ASSERT_TRUE(minMaxCompress(x.data(), n, chunks, buf.data(), buf.size()).isOk());
      ASSERT_EQ(buf, referenceCompress(x, chunks)) << n << " elements, " << chunks << " chunks";
    }
  }
}

// |x' - x| <= (max - min + eps) / 510 + 4 ulp(max |x|), against double precision.
TEST(MinMaxCompress, RoundTripWithinBound) {
  for (size_t chunks : {1u, 4u, 7u}) {
    for (float spread : {1e-4f, 1.0f, 1e3f}) {
      const size_t n = 3001;
      const auto x = pattern(n, static_cast<uint32_t>(chunks * 100 + spread), spread);
      std::vector<uint8_t> buf(minMaxCompressedBytes(n, chunks));
      std::vector<float> y(n, -1.0f);
      ASSERT_TRUE(minMaxCompress(x.data(), n, chunks, buf.data(), buf.size()).isOk());
      ASSERT_TRUE(minMaxDecompress(buf.data(), buf.size(), n, chunks, y.data()).isOk());
      const size_t c = minMaxChunkElements(n, chunks);
      for (size_t j = 0; j < chunks; ++j) {
        const size_t begin = j * c;
        const size_t end = std::min(begin + c, n);
        const double mn = *std::min_element(x.begin() + begin, x.begin() + end);
        const double mx = *std::max_element(x.begin() + begin, x.begin() + end);
        const double maxAbs = std::max(std::fabs(mn), std::fabs(mx));
        const double ulp = maxAbs * std::ldexp(1.0, -23);
        const double bound = (mx - mn + 1e-7) / 510.0 + 4.0 * ulp;
        for (size_t i = begin; i < end; ++i) {
          ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), bound)
              << "element " << i << " chunk " << j << " spread " << spread;
        }
      }
    }
  }
}

TEST(MinMaxCompress, ConstantChunksDoNotOverflow) {
  // A chunk of ones: scale = 2.55e9, where Bagua's unclamped q would be 256.
  for (float value : {1.0f, -1.0f, 0.001f, 12345.0f, 0.0f}) {
    std::vector<float> x(40, value);
    std::vector<uint8_t> buf(minMaxCompressedBytes(40, 2));
    std::vector<float> y(40);
    ASSERT_TRUE(minMaxCompress(x.data(), 40, 2, buf.data(), buf.size()).isOk());
    ASSERT_EQ(buf, referenceCompress(x, 2));
    ASSERT_TRUE(minMaxDecompress(buf.data(), buf.size(), 40, 2, y.data()).isOk());
    for (float v : y) {
      EXPECT_NEAR(v, value, 1e-6 * std::fabs(value) + 1e-7) << value;
    }
  }
}

TEST(MinMaxCompress, ZeroLengthAndOneElement) {
  std::vector<uint8_t> buf(minMaxCompressedBytes(0, 4), 0xAB);
  EXPECT_TRUE(minMaxCompress(nullptr, 0, 4, buf.data(), buf.size()).isOk());
  EXPECT_TRUE(minMaxDecompress(buf.data(), buf.size(), 0, 4, nullptr).isOk());
  for (uint8_t b : buf) {
    EXPECT_EQ(b, 0);  // empty chunks: zero header (min = max = 0)
  }
  const float one = -3.25f;
  std::vector<uint8_t> b1(minMaxCompressedBytes(1, 1));
  float back = 0.0f;
  ASSERT_TRUE(minMaxCompress(&one, 1, 1, b1.data(), b1.size()).isOk());
  ASSERT_TRUE(minMaxDecompress(b1.data(), b1.size(), 1, 1, &back).isOk());
  EXPECT_NEAR(back, one, 1e-6);
  // More chunks than elements: the tail chunks are empty.
  const std::vector<float> three = {1.0f, 2.0f, 3.0f};
  std::vector<uint8_t> b3(minMaxCompressedBytes(3, 5));
  std::vector<float> y3(3);
  ASSERT_TRUE(minMaxCompress(three.data(), 3, 5, b3.data(), b3.size()).isOk());
  ASSERT_TRUE(minMaxDecompress(b3.data(), b3.size(), 3, 5, y3.data()).isOk());
  EXPECT_EQ(b3, referenceCompress(three, 5));
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(y3[i], three[i], 1e-6);
  }
}

// Policy: a chunk holding NaN or +-Inf, or whose range overflows float, decodes to NaN
// everywhere; the other chunks are unaffected.
TEST(MinMaxCompress, NonFiniteChunksDecodeToNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {nan, inf, -inf}) {
    auto x = pattern(96, 3);
    x[40] = bad;  // chunk 1 of 3 (32 elements each)
    std::vector<uint8_t> buf(minMaxCompressedBytes(96, 3));
    std::vector<float> y(96);
    ASSERT_TRUE(minMaxCompress(x.data(), 96, 3, buf.data(), buf.size()).isOk());
    ASSERT_TRUE(minMaxDecompress(buf.data(), buf.size(), 96, 3, y.data()).isOk());
    EXPECT_TRUE(std::isnan(headerFloat(buf, 64)));
    EXPECT_TRUE(std::isnan(headerFloat(buf, 68)));
    for (size_t i = 0; i < 96; ++i) {
      if (i >= 32 && i < 64) {
        EXPECT_TRUE(std::isnan(y[i])) << i;
      } else {
        EXPECT_NEAR(y[i], x[i], 0.2) << i;
      }
    }
  }
  std::vector<float> wide = {-3e38f, 3e38f, 0.0f};
  std::vector<uint8_t> buf(minMaxCompressedBytes(3, 1));
  std::vector<float> y(3);
  ASSERT_TRUE(minMaxCompress(wide.data(), 3, 1, buf.data(), buf.size()).isOk());
  ASSERT_TRUE(minMaxDecompress(buf.data(), buf.size(), 3, 1, y.data()).isOk());
  for (float v : y) {
    EXPECT_TRUE(std::isnan(v));
  }
}

TEST(MinMaxCompress, TargetChunkTouchesOnlyItsSegment) {
  const auto x = pattern(120, 9);
  const size_t bytes = minMaxCompressedBytes(120, 4);
  std::vector<uint8_t> full(bytes);
  ASSERT_TRUE(minMaxCompress(x.data(), 120, 4, full.data(), bytes).isOk());
  std::vector<uint8_t> one(bytes, 0xEE);
  ASSERT_TRUE(minMaxCompress(x.data(), 120, 4, one.data(), bytes, 2).isOk());
  const size_t seg = minMaxSegmentBytes(30);
  for (size_t b = 0; b < bytes; ++b) {
    if (b / seg == 2) {
      EXPECT_EQ(one[b], full[b]) << b;
    } else {
      EXPECT_EQ(one[b], 0xEE) << b;
    }
  }
  std::vector<float> y(120, 7.0f);
  ASSERT_TRUE(minMaxDecompress(full.data(), bytes, 120, 4, y.data(), 2).isOk());
  for (size_t i = 0; i < 120; ++i) {
    if (i / 30 == 2) {
      EXPECT_NEAR(y[i], x[i], 0.2);
    } else {
      EXPECT_EQ(y[i], 7.0f);
    }
  }
}

TEST(MinMaxCompress, RejectsBadArguments) {
  std::vector<float> x(10, 1.0f);
  std::vector<uint8_t> buf(minMaxCompressedBytes(10, 2));
  EXPECT_EQ(minMaxCompress(x.data(), 10, 0, buf.data(), buf.size()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(minMaxCompress(x.data(), 10, 2, buf.data(), buf.size() - 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(minMaxCompress(x.data(), 10, 2, buf.data(), buf.size(), 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(minMaxDecompress(buf.data(), 10, 10, 2, x.data()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bagua::algo
