#include "bagua/loader/random.h"

#include <cmath>
#include <numbers>

namespace bagua::loader {

uint64_t splitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t epochSeed(uint64_t seed, uint64_t epoch) {
  return splitMix64(splitMix64(seed) ^ splitMix64(epoch ^ 0x6c6f61646572ULL));  // "loader"
}

uint64_t Rng::uniformInt(uint64_t n) {
  if (n <= 1) {
    return 0;
  }
  // Accept only outputs below the largest multiple of n that fits, so the modulo is unbiased.
  // 2^64 mod n computed without overflow as (2^64 - n) mod n.
  const uint64_t rem = (0 - n) % n;
  const uint64_t limit = 0 - rem;  // 2^64 - rem; 0 means "accept everything" (rem == 0)
  for (;;) {
    uint64_t x = engine_();
    if (rem == 0 || x < limit) {
      return x % n;
    }
  }
}

double Rng::uniformDouble() {
  return static_cast<double>(engine_() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
  if (haveSpare_) {
    haveSpare_ = false;
    return spare_;
  }
  double u1 = 0.0;
  do {
    u1 = uniformDouble();
  } while (u1 <= 0.0);
  double u2 = uniformDouble();
  double r = std::sqrt(-2.0 * std::log(u1));
  double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  haveSpare_ = true;
  return r * std::cos(theta);
}

double Rng::logNormal(double mu, double sigma) {
  return std::exp(mu + sigma * normal());
}

std::vector<size_t> Rng::permutation(size_t n) {
  std::vector<size_t> p(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = i;
  }
  shuffle(p);
  return p;
}

}  // namespace bagua::loader
