// Portable random numbers for the samplers.
//
// Why not <random>'s distributions: std::uniform_int_distribution, std::shuffle and
// std::normal_distribution are implementation-defined, so libstdc++ and libc++ give different
// orders for the same seed. The engine std::mt19937_64 is fully specified by the standard
// (its 10000th output from the default seed is fixed by [rand.predef]), so we keep the engine
// and write the transforms ourselves:
//   - uniformInt(n): rejection sampling on whole 64-bit outputs, then modulo. Exact, so every
//     integer-valued draw (noise, permutations, shuffles) is identical on every machine.
//   - uniformDouble(): the top 53 bits of one output times 2^-53. Exact.
//   - normal()/logNormal(): Box-Muller over uniformDouble(); uses std::log/std::sqrt/std::cos,
//     which are correctly rounded (sqrt) or faithfully rounded (log, cos) in glibc but may
//     differ in the last bit elsewhere. The samplers never use them; they serve benchmarks and
//     test data.
// Seeding for an epoch: epochSeed(seed, epoch) mixes both with SplitMix64, so (seed 0, epoch 1)
// and (seed 1, epoch 0) give unrelated streams (Bagua's seed + epoch does not).
//
// Thread safety: an Rng is a value; do not share one between threads without a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace bagua::loader {

// SplitMix64 finaliser: a bijective 64-bit mix.
uint64_t splitMix64(uint64_t x);

// The engine seed used for `epoch` of a sampler seeded with `seed`.
uint64_t epochSeed(uint64_t seed, uint64_t epoch);

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // The raw engine output.
  uint64_t next() { return engine_(); }
  // Uniform integer in [0, n); n must be > 0 (returns 0 for n == 0).
  uint64_t uniformInt(uint64_t n);
  // Uniform double in [0, 1) with 53 random bits.
  double uniformDouble();
  // Standard normal (Box-Muller; see the note on portability above).
  double normal();
  // exp(mu + sigma * normal()).
  double logNormal(double mu, double sigma);
  // Uniform random permutation of 0..n-1 (Fisher-Yates from the back).
  std::vector<size_t> permutation(size_t n);
  // Fisher-Yates shuffle in place.
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(uniformInt(i));
      std::swap(v[i - 1], v[j]);
    }
  }

 private:
  std::mt19937_64 engine_;
  bool haveSpare_ = false;
  double spare_ = 0.0;
};

}  // namespace bagua::loader
