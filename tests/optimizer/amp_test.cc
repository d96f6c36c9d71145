// Mixed precision: GradScaler's scale schedule (growth, backoff, interval) as PyTorch's
// _amp_update_scale_; a step with an inf or NaN gradient is skipped and changes nothing; otherwise
// the scaled step equals the unscaled one bit for bit (power-of-two scales), fused or not; f16/bf16
// parameters with f32 master weights follow the f32 trajectory exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "bagua/optimizer/elementwise.h"
#include "bagua/optimizer/grad_scaler.h"
#include "optimizer_support.h"

namespace bagua::optim {
namespace {

using core::DataType;
using testing::Model;

OptimizerOptions opts() {
  OptimizerOptions o;
  o.threads = 2;
  o.chunkElements = 1024;
  return o;
}

TEST(GradScaler, GrowsAfterIntervalAndBacksOffOnInf) {
  GradScalerOptions o;
  o.initScale = 1024;
  o.growthInterval = 3;
  auto s = GradScaler::create(o);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(s->invScale(), 1.0f / 1024.0f);
  s->update(false);
  s->update(false);
  EXPECT_EQ(s->scale(), 1024.0f);
  EXPECT_EQ(s->growthTracker(), 2);
  s->update(false);
  EXPECT_EQ(s->scale(), 2048.0f);
  EXPECT_EQ(s->growthTracker(), 0);
  s->update(false);
  s->update(true);
  EXPECT_EQ(s->scale(), 1024.0f);
  EXPECT_EQ(s->growthTracker(), 0);
  // Growth that would overflow f32 keeps the scale.
  GradScalerOptions big;
  big.initScale = 3e38;
  big.growthInterval = 1;
  auto b = GradScaler::create(big);
  ASSERT_TRUE(b.isOk());
  b->update(false);
  EXPECT_EQ(b->scale(), 3e38f);
  // Save / load.
  GradScaler copy = *GradScaler::create(o);
  ASSERT_TRUE(copy.load(s->save()).isOk());
  EXPECT_EQ(copy.scale(), s->scale());
  EXPECT_FALSE(copy.load({1, 2, 3}).isOk());
  // Bad options.
  o.backoffFactor = 1.5;
  EXPECT_FALSE(GradScaler::create(o).isOk());
}

std::vector<testing::Spec> ampSpecs() {
  return {{100, DataType::kF16},
          {3000, DataType::kF16},
          {50, DataType::kBF16},
          {700, DataType::kF32},
          {9, DataType::kF64}};
}

TEST(Amp, InfOrNanGradientSkipsTheStepAndBacksOff) {
  for (uint16_t bad : {uint16_t{0x7c00}, uint16_t{0xfe00}}) {  // +inf, NaN
    for (bool fused : {false, true}) {
      Model m(ampSpecs());
      auto opt = Adam::create(m.params(), AdamRule::Hyper{}, opts());
      ASSERT_TRUE(opt.isOk());
      if (fused) {
        ASSERT_TRUE((*opt)->fuse().isOk());
      }
      GradScalerOptions so;
      so.initScale = 256;
      auto scaler = GradScaler::create(so);
      ASSERT_TRUE(scaler.isOk());
      (*opt)->setGradScaler(&*scaler);
      m.fillGrads(0, 256);
      ASSERT_TRUE((*opt)->step().isOk());
      EXPECT_FALSE((*opt)->lastStepSkipped());
      const auto params = m.snapshot();
      const auto state = *(*opt)->saveState();
      m.fillGrads(1, 256);
      static_cast<uint16_t*>(m.params()[1].grad)[2999] = bad;
      ASSERT_TRUE((*opt)->step().isOk());
      EXPECT_TRUE((*opt)->lastStepSkipped());
      EXPECT_EQ(m.snapshot(), params);
      EXPECT_EQ(*(*opt)->saveState(), state);
      EXPECT_EQ(scaler->scale(), 128.0f);
      EXPECT_EQ((*opt)->stepCount(0), 1);
    }
  }
}

TEST(Amp, OverflowingScaleBacksOffUntilStepsProceed) {
  Model m({{64, DataType::kF16}});
  auto opt = Sgd::create(m.params(), SgdRule::Hyper{0.01}, opts());
  ASSERT_TRUE(opt.isOk());
  auto scaler = GradScaler::create({});  // 65536
  ASSERT_TRUE(scaler.isOk());
  (*opt)->setGradScaler(&*scaler);
  int skipped = 0;
  for (int step = 0; step < 6; ++step) {
    // The trainer's backward of a loss scaled by scale(): gradient * scale, rounded to f16; one
    // gradient of 2 overflows f16 (> 65504) while the scale is 65536 or 32768.
    const double scale = static_cast<double>(scaler->scale());
    m.fillGrads(step, scale);
    testing::storeAs(DataType::kF16, m.params()[0].grad, 0, 2.0 * scale);
    ASSERT_TRUE((*opt)->step().isOk());
    skipped += (*opt)->lastStepSkipped() ? 1 : 0;
  }
  EXPECT_EQ(skipped, 2) << "65536 and 32768 overflow, 16384 does not";
  EXPECT_EQ(scaler->scale(), 16384.0f);
  EXPECT_EQ((*opt)->stepCount(0), 4);
}

TEST(Amp, ScaledStepEqualsUnscaledStepBitForBit) {
  for (bool fused : {false, true}) {
    Model scaled(ampSpecs()), plain(ampSpecs());
    AdamRule::Hyper h;
    h.weightDecay = 0.01;
    auto a = Adam::create(scaled.params(), h, opts());
    auto b = Adam::create(plain.params(), h, opts());
    ASSERT_TRUE(a.isOk() && b.isOk());
    if (fused) {
      ASSERT_TRUE((*a)->fuse().isOk());
    }
    GradScalerOptions so;
    so.initScale = 1024;
    so.growthInterval = 2;
    auto scaler = GradScaler::create(so);
    ASSERT_TRUE(scaler.isOk());
    (*a)->setGradScaler(&*scaler);
    for (int step = 0; step < 6; ++step) {
      scaled.fillGrads(step, static_cast<double>(scaler->scale()));
      plain.fillGrads(step);
      ASSERT_TRUE((*a)->step().isOk());
      ASSERT_TRUE((*b)->step().isOk());
      ASSERT_FALSE((*a)->lastStepSkipped());
      ASSERT_EQ(scaled.snapshot(), plain.snapshot()) << "step " << step << " fused " << fused;
    }
    EXPECT_EQ(scaler->scale(), 8192.0f) << "grew three times (interval 2, six good steps)";
  }
}

TEST(Amp, MasterWeightsFollowTheF32Trajectory) {
  // Same initial values (f16-representable) and the same f16-representable gradients: the master
  // weights of the f16 model equal the f32 model's weights exactly, and the f16 weights are their
  // rounding.
  for (DataType low : {DataType::kF16, DataType::kBF16}) {
    Model half({{500, low}, {31, low}});
    Model full({{500, DataType::kF32}, {31, DataType::kF32}});
    for (size_t t = 0; t < 2; ++t) {
      for (size_t i = 0; i < half.params()[t].numel; ++i) {
        testing::storeAs(DataType::kF32, full.params()[t].data, i,
                         testing::loadAs(low, half.params()[t].data, i));
      }
    }
    auto a = Adam::create(half.params(), AdamRule::Hyper{}, opts());
    auto b = Adam::create(full.params(), AdamRule::Hyper{}, opts());
    ASSERT_TRUE(a.isOk() && b.isOk());
    ASSERT_TRUE((*a)->fuse().isOk());
    for (int step = 0; step < 5; ++step) {
      half.fillGrads(step);
      for (size_t t = 0; t < 2; ++t) {
        for (size_t i = 0; i < half.params()[t].numel; ++i) {
          testing::storeAs(DataType::kF32, full.params()[t].grad, i,
                           testing::loadAs(low, half.params()[t].grad, i));
        }
      }
      ASSERT_TRUE((*a)->step().isOk());
      ASSERT_TRUE((*b)->step().isOk());
    }
    for (size_t t = 0; t < 2; ++t) {
      const float* master = (*a)->masterData(static_cast<int>(t));
      ASSERT_NE(master, nullptr);
      const auto* f = static_cast<const float*>(full.params()[t].data);
      ASSERT_EQ(std::memcmp(master, f, half.params()[t].numel * 4), 0) << "tensor " << t;
      for (size_t i = 0; i < half.params()[t].numel; ++i) {
        const auto got = static_cast<const uint16_t*>(half.params()[t].data)[i];
        const uint16_t want = low == DataType::kF16 ? toHalfBits(f[i]) : toBf16Bits(f[i]);
        ASSERT_EQ(got, want) << "tensor " << t << " element " << i;
      }
    }
  }
}

TEST(Amp, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(toHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(toHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(toHalfBits(65519.0f), 0x7bff);
  EXPECT_EQ(toHalfBits(65520.0f), 0x7c00);
  EXPECT_EQ(toHalfBits(-0.0f), 0x8000);
  EXPECT_EQ(toHalfBits(5.9604645e-8f), 0x0001);       // smallest subnormal
  EXPECT_EQ(toHalfBits(2.9802322e-8f), 0x0000);       // half of it: ties to even (0)
  EXPECT_EQ(toHalfBits(8.940697e-8f), 0x0002);        // 1.5 units: ties to even (2)
  EXPECT_EQ(toHalfBits(1.0f + 1.0f / 2048), 0x3c00);  // tie below: even
  EXPECT_EQ(toHalfBits(1.0f + 3.0f / 2048), 0x3c02);  // tie above odd: up
  for (uint32_t h = 0; h < 0x7c00; ++h) {             // every finite half round-trips
    ASSERT_EQ(toHalfBits(fromHalfBits(static_cast<uint16_t>(h))), h);
    ASSERT_EQ(toHalfBits(fromHalfBits(static_cast<uint16_t>(h | 0x8000))), h | 0x8000);
  }
  EXPECT_EQ(toBf16Bits(1.0f + 1.0f / 256), 0x3f80);  // tie: even
  EXPECT_EQ(toBf16Bits(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(fromBf16Bits(0x3f80), 1.0f);
}

}  // namespace
}  // namespace bagua::optim
