// Bayesian optimisation of a few mixed knobs: a search space of integer, log-scale integer and
// boolean dimensions; a scrambled, seeded Halton sequence for the quasi-random start; Gaussian-
// process regression (Matern 5/2 kernel with one length scale per dimension, hyper-parameters
// chosen by marginal likelihood over a grid); expected improvement to pick the next point.
//
// The optimiser MAXIMISES a score (throughput). Scores are noisy; the "best" setting is the
// sampled point with the highest posterior mean (Horovod's noise-robust choice), not the
// luckiest single measurement.
//
// Problem sizes are small (a handful of dimensions, at most a few hundred samples), so the
// linear algebra is a plain Cholesky factorisation of an n x n matrix (autotune/README.md).
//
// Determinism: for a given seed and the same sequence of tell() calls, ask() returns the same
// points on every platform that rounds IEEE doubles the same way (no threads, no libm calls
// other than exp/log/sqrt/erfc).
//
// Thread safety: none; one owner (the tuner runs it on rank 0's trainer thread).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::autotune {

enum class DimensionKind {
  kInteger,     // integer in [lo, hi], linear scale
  kLogInteger,  // integer in [lo, hi] (lo >= 1), searched on a log scale
  kBool,        // 0 or 1
};

struct Dimension {
  std::string name;
  DimensionKind kind = DimensionKind::kInteger;
  int64_t lo = 0;
  int64_t hi = 0;

  static Dimension integer(std::string name, int64_t lo, int64_t hi) {
    return {std::move(name), DimensionKind::kInteger, lo, hi};
  }
  static Dimension logInteger(std::string name, int64_t lo, int64_t hi) {
    return {std::move(name), DimensionKind::kLogInteger, lo, hi};
  }
  static Dimension boolean(std::string name) {
    return {std::move(name), DimensionKind::kBool, 0, 1};
  }

  // Maps a value to [0, 1] (the GP's coordinates) and back (rounded to a valid value).
  double normalise(int64_t value) const;
  int64_t denormalise(double unit) const;
  bool contains(int64_t value) const { return value >= lo && value <= hi; }
};

// A setting: one value per dimension, in the space's order.
using Point = std::vector<int64_t>;

class SearchSpace {
 public:
  // Checks the dimensions: names unique and non-empty, lo <= hi, lo >= 1 for log scale.
  static Result<SearchSpace> create(std::vector<Dimension> dims);
  SearchSpace() = default;

  const std::vector<Dimension>& dims() const { return dims_; }
  size_t size() const { return dims_.size(); }
  int index(const std::string& name) const;  // -1 if absent
  Status validate(const Point& p) const;
  std::vector<double> normalise(const Point& p) const;
  Point denormalise(const std::vector<double>& unit) const;
  std::string format(const Point& p) const;  // "bucket_kib=512 hierarchical=0"

 private:
  explicit SearchSpace(std::vector<Dimension> dims) : dims_(std::move(dims)) {}
  std::vector<Dimension> dims_;
};

// Halton points in [0, 1)^d, scrambled by a seeded random permutation of the digits of every
// base (0 kept fixed so the radical inverse stays finite) and a seeded shift modulo 1.
class ScrambledHalton {
 public:
  ScrambledHalton(size_t dims, uint64_t seed);
  std::vector<double> next();

 private:
  std::vector<int> bases_;
  std::vector<std::vector<int>> perms_;
  std::vector<double> shift_;
  uint64_t index_ = 1;
};

// ---- Gaussian-process regression ------------------------------------------------------------

struct GpHyper {
  std::vector<double> lengthScales;  // per dimension, in unit coordinates
  double signalVariance = 1.0;       // of the standardised scores
  double noiseVariance = 1e-2;       // of the standardised scores
};

class GaussianProcess {
 public:
  // Fits to points in [0,1]^d (x[i].size() == d) and raw scores y. Hyper-parameters maximise
  // the log marginal likelihood (plus a weak log-normal prior on the length scales) over a grid:
  // a shared length scale first, then two coordinate passes per dimension.
  static Result<GaussianProcess> fit(const std::vector<std::vector<double>>& x,
                                     const std::vector<double>& y);
  // Fits with fixed hyper-parameters (tests).
  static Result<GaussianProcess> fitWith(const std::vector<std::vector<double>>& x,
                                         const std::vector<double>& y, const GpHyper& hyper);

  struct Prediction {
    double mean = 0;    // in raw score units
    double stddev = 0;  // of the latent function, raw units
  };
  Prediction predict(const std::vector<double>& x) const;
  const GpHyper& hyper() const { return hyper_; }
  double logMarginalLikelihood() const { return lml_; }

 private:
  GaussianProcess() = default;
  double kernel(const std::vector<double>& a, const std::vector<double>& b) const;
  Status factor();

  std::vector<std::vector<double>> x_;
  std::vector<double> yStd_;  // standardised
  double yMean_ = 0;
  double yScale_ = 1;
  GpHyper hyper_;
  std::vector<double> chol_;  // lower-triangular n x n, row-major
  std::vector<double> alpha_;
  double lml_ = 0;
};

// Expected improvement (maximisation) of a prediction over `best`, with exploration margin xi.
double expectedImprovement(double mean, double stddev, double best, double xi);

// ---- The optimiser ---------------------------------------------------------------------------

struct OptimizerOptions {
  uint64_t seed = 0;
  // Quasi-random points before the GP takes over (0: 2 * dims + 2, at least 3).
  int initialSamples = 0;
  // Exploration margin of EI, in standard deviations of the observed scores.
  double xi = 0.01;
  // Random candidates scored by EI per ask (plus local moves around the best points).
  int candidates = 1024;
};

struct Observation {
  Point point;
  double score = 0;
};

class BayesianOptimizer {
 public:
  static Result<BayesianOptimizer> create(SearchSpace space, OptimizerOptions options = {});

  // The next setting to measure.
  Result<Point> ask();
  // Records a measurement (higher is better). Non-finite scores are rejected.
  Status tell(const Point& point, double score);

  const std::vector<Observation>& observations() const { return obs_; }
  const SearchSpace& space() const { return space_; }
  // The best setting so far: highest posterior mean among the sampled points once the GP can be
  // fitted, else the highest observed score. nullopt before any tell().
  std::optional<Point> best() const;
  // best() with its index in observations() and its posterior mean (the observed score while the
  // GP cannot be fitted yet).
  struct Best {
    size_t index = 0;
    double mean = 0;
  };
  std::optional<Best> bestEstimate() const;
  // The sampled point with the highest single observed score.
  std::optional<Observation> bestObserved() const;
  int initialSamples() const { return initial_; }

 private:
  BayesianOptimizer(SearchSpace space, OptimizerOptions options);
  Result<Point> askByExpectedImprovement();

  SearchSpace space_;
  OptimizerOptions options_;
  int initial_ = 0;
  ScrambledHalton halton_;
  std::mt19937_64 rng_;
  std::vector<Observation> obs_;
  int asked_ = 0;
};

}  // namespace bagua::autotune
