// Helpers shared by the loader tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bagua/loader/random.h"
#include "bagua/loader/sampler.h"

namespace bagua::loader::testing {

// Long-tailed token counts (lognormal, median ~150, a few in the thousands).
inline std::vector<int64_t> lognormalCosts(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> c(n);
  for (size_t i = 0; i < n; ++i) {
    c[i] = 1 + static_cast<int64_t>(rng.logNormal(5.0, 1.0));
  }
  return c;
}

// Sum over steps of max-over-ranks step cost divided by the sum of mean step costs: how much
// longer a synchronous step takes than perfectly balanced work (1.0 = perfect).
inline double slowestOverMean(const std::vector<std::vector<std::vector<size_t>>>& perRankBatches,
                              const std::vector<int64_t>& cost) {
  const size_t ranks = perRankBatches.size();
  const size_t steps = perRankBatches[0].size();
  double sumMax = 0;
  double sumMean = 0;
  for (size_t s = 0; s < steps; ++s) {
    double mx = 0;
    double total = 0;
    for (size_t r = 0; r < ranks; ++r) {
      double c = 0;
      for (size_t i : perRankBatches[r][s]) {
        c += static_cast<double>(cost[i]);
      }
      mx = std::max(mx, c);
      total += c;
    }
    sumMax += mx;
    sumMean += total / static_cast<double>(ranks);
  }
  return sumMax / sumMean;
}

// Rank r's indices cut into consecutive batches of `batch`.
inline std::vector<std::vector<std::vector<size_t>>> fixedBatchesPerRank(const Sampler& s,
                                                                         size_t batch) {
  std::vector<std::vector<std::vector<size_t>>> out(static_cast<size_t>(s.numReplicas()));
  for (int r = 0; r < s.numReplicas(); ++r) {
    std::vector<size_t> idx = s.indicesOf(r);
    for (size_t b = 0; b + batch <= idx.size(); b += batch) {
      out[static_cast<size_t>(r)].emplace_back(
          idx.begin() + static_cast<std::ptrdiff_t>(b),
          idx.begin() + static_cast<std::ptrdiff_t>(b + batch));
    }
  }
  return out;
}

}  // namespace bagua::loader::testing
