#include "bagua/autotune/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

namespace bagua::autotune {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Uniform double in [0, 1) from the generator's raw bits (std::uniform_real_distribution is not
// specified bit-for-bit across standard libraries).
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

double normal01(std::mt19937_64& rng) {
  double u1 = uniform01(rng);
  const double u2 = uniform01(rng);
  if (u1 < 1e-300) {
    u1 = 1e-300;
  }
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

double clamp01(double u) {
  return std::min(1.0, std::max(0.0, u));
}

// A value drawn with equal mass on every integer (the ends included), for random sampling.
int64_t fromUniform(const Dimension& d, double u) {
  u = clamp01(u);
  if (d.kind == DimensionKind::kLogInteger) {
    return d.denormalise(u);
  }
  const int64_t n = d.hi - d.lo + 1;
  return std::min(d.hi, d.lo + static_cast<int64_t>(u * static_cast<double>(n)));
}

bool choleskyInPlace(std::vector<double>& a, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double s = a[j * n + j];
    for (size_t k = 0; k < j; ++k) {
      s -= a[j * n + k] * a[j * n + k];
    }
    if (!(s > 0.0) || !std::isfinite(s)) {
      return false;
    }
    const double ljj = std::sqrt(s);
    a[j * n + j] = ljj;
    for (size_t i = j + 1; i < n; ++i) {
      double t = a[i * n + j];
      for (size_t k = 0; k < j; ++k) {
        t -= a[i * n + k] * a[j * n + k];
      }
      a[i * n + j] = t / ljj;
    }
    for (size_t i = 0; i < j; ++i) {
      a[i * n + j] = 0.0;
    }
  }
  return true;
}

// Solves L z = b in place (L lower-triangular, row-major).
void forwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) {
      s -= l[i * n + k] * b[k];
    }
    b[i] = s / l[i * n + i];
  }
}

// Solves L^T z = b in place.
void backwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t ii = n; ii-- > 0;) {
    double s = b[ii];
    for (size_t k = ii + 1; k < n; ++k) {
      s -= l[k * n + ii] * b[k];
    }
    b[ii] = s / l[ii * n + ii];
  }
}

const std::vector<double>& lengthGrid() {
  static const std::vector<double> g = {0.05, 0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9, 1.4, 2.0, 3.0};
  return g;
}
const std::vector<double>& noiseGrid() {
  static const std::vector<double> g = {1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.3};
  return g;
}
const std::vector<double>& signalGrid() {
  static const std::vector<double> g = {0.5, 1.0, 2.0};
  return g;
}

// Weak log-normal prior on the length scales (centred at half the unit interval): keeps a few
// noisy points from being explained by a wiggly function with tiny length scales.
double lengthPrior(const std::vector<double>& ls) {
  double p = 0;
  for (double l : ls) {
    const double z = std::log(l / 0.5);
    p -= 0.5 * z * z;
  }
  return p;
}

}  // namespace

// ---- Dimensions and space ---------------------------------------------------------------------

double Dimension::normalise(int64_t value) const {
  if (hi == lo) {
    return 0.0;
  }
  switch (kind) {
  case DimensionKind::kBool:
    return value != 0 ? 1.0 : 0.0;
  case DimensionKind::kLogInteger:
    return clamp01((std::log(static_cast<double>(value)) - std::log(static_cast<double>(lo))) /
                   (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo))));
  case DimensionKind::kInteger:
    break;
  }
  return clamp01(static_cast<double>(value - lo) / static_cast<double>(hi - lo));
}

int64_t Dimension::denormalise(double unit) const {
  unit = clamp01(unit);
  int64_t v = lo;
  switch (kind) {
  case DimensionKind::kBool:
    v = unit >= 0.5 ? 1 : 0;
    break;
  case DimensionKind::kLogInteger: {
    const double l = std::log(static_cast<double>(lo));
    const double h = std::log(static_cast<double>(hi));
    v = std::llround(std::exp(l + unit * (h - l)));
    break;
  }
  case DimensionKind::kInteger:
    v = lo + std::llround(unit * static_cast<double>(hi - lo));
    break;
  }
  return std::min(hi, std::max(lo, v));
}

Result<SearchSpace> SearchSpace::create(std::vector<Dimension> dims) {
  if (dims.empty()) {
    return BAGUA_ERROR(kInvalidArgument, "search space: no dimensions");
  }
  std::set<std::string> names;
  for (const Dimension& d : dims) {
    if (d.name.empty() || !names.insert(d.name).second) {
      return BAGUA_ERROR(kInvalidArgument, "search space: dimension name '%s' empty or repeated",
                         d.name.c_str());
    }
    if (d.lo > d.hi) {
      return BAGUA_ERROR(kInvalidArgument, "search space: %s has lo %lld > hi %lld", d.name.c_str(),
                         static_cast<long long>(d.lo), static_cast<long long>(d.hi));
    }
    if (d.kind == DimensionKind::kLogInteger && d.lo < 1) {
      return BAGUA_ERROR(kInvalidArgument, "search space: log-scale %s needs lo >= 1 (got %lld)",
                         d.name.c_str(), static_cast<long long>(d.lo));
    }
    if (d.kind == DimensionKind::kBool && (d.lo != 0 || d.hi != 1)) {
      return BAGUA_ERROR(kInvalidArgument, "search space: boolean %s must span [0, 1]",
                         d.name.c_str());
    }
  }
  return SearchSpace(std::move(dims));
}

int SearchSpace::index(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == name) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

Status SearchSpace::validate(const Point& p) const {
  if (p.size() != dims_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "setting has %zu values for %zu dimensions", p.size(),
                       dims_.size());
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (!dims_[i].contains(p[i])) {
      return BAGUA_ERROR(kInvalidArgument, "%s = %lld is outside [%lld, %lld]",
                         dims_[i].name.c_str(), static_cast<long long>(p[i]),
                         static_cast<long long>(dims_[i].lo), static_cast<long long>(dims_[i].hi));
    }
  }
  return Status::ok();
}

std::vector<double> SearchSpace::normalise(const Point& p) const {
  std::vector<double> u(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) {
    u[i] = dims_[i].normalise(p[i]);
  }
  return u;
}

Point SearchSpace::denormalise(const std::vector<double>& unit) const {
  Point p(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) {
    p[i] = dims_[i].denormalise(unit[i]);
  }
  return p;
}

std::string SearchSpace::format(const Point& p) const {
  std::string s;
  for (size_t i = 0; i < dims_.size() && i < p.size(); ++i) {
    s += strPrintf("%s%s=%lld", i ? " " : "", dims_[i].name.c_str(), static_cast<long long>(p[i]));
  }
  return s;
}

// ---- Halton -----------------------------------------------------------------------------------

ScrambledHalton::ScrambledHalton(size_t dims, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5eed0f4a17u);
  for (int c = 2; bases_.size() < dims; ++c) {
    bool prime = true;
    for (int k = 2; k * k <= c; ++k) {
      if (c % k == 0) {
        prime = false;
        break;
      }
    }
    if (prime) {
      bases_.push_back(c);
    }
  }
  for (int b : bases_) {
    std::vector<int> perm(b);
    std::iota(perm.begin(), perm.end(), 0);
    // Fisher-Yates on digits 1..b-1 (0 stays 0).
    for (int i = b - 1; i > 1; --i) {
      const int j = 1 + static_cast<int>(rng() % static_cast<uint64_t>(i));
      std::swap(perm[i], perm[j]);
    }
    perms_.push_back(std::move(perm));
    shift_.push_back(uniform01(rng));
  }
}

std::vector<double> ScrambledHalton::next() {
  std::vector<double> u(bases_.size());
  for (size_t d = 0; d < bases_.size(); ++d) {
    const int b = bases_[d];
    double f = 1.0;
    double r = 0.0;
    for (uint64_t i = index_; i > 0; i /= static_cast<uint64_t>(b)) {
      f /= b;
      r += f * perms_[d][static_cast<size_t>(i % static_cast<uint64_t>(b))];
    }
    r += shift_[d];
    u[d] = r - std::floor(r);
  }
  ++index_;
  return u;
}

// ---- Gaussian process -------------------------------------------------------------------------

double GaussianProcess::kernel(const std::vector<double>& a, const std::vector<double>& b) const {
  double r2 = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const double d = (a[k] - b[k]) / hyper_.lengthScales[k];
    r2 += d * d;
  }
  const double r = std::sqrt(5.0 * r2);
  return hyper_.signalVariance * (1.0 + r + r * r / 3.0) * std::exp(-r);
}

Status GaussianProcess::factor() {
  const size_t n = x_.size();
  chol_.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      const double k = kernel(x_[i], x_[j]);
      chol_[i * n + j] = k;
      chol_[j * n + i] = k;
    }
    chol_[i * n + i] += hyper_.noiseVariance + 1e-9;
  }
  if (!choleskyInPlace(chol_, n)) {
    return BAGUA_ERROR(kInternal, "GP: kernel matrix of %zu points is not positive definite", n);
  }
  alpha_ = yStd_;
  forwardSolve(chol_, n, alpha_);
  double quad = 0;
  for (double v : alpha_) {
    quad += v * v;
  }
  backwardSolve(chol_, n, alpha_);
  double logDet = 0;
  for (size_t i = 0; i < n; ++i) {
    logDet += std::log(chol_[i * n + i]);
  }
  lml_ = -0.5 * quad - logDet - 0.5 * static_cast<double>(n) * std::log(2.0 * kPi);
  return Status::ok();
}

Result<GaussianProcess> GaussianProcess::fitWith(const std::vector<std::vector<double>>& x,
                                                 const std::vector<double>& y,
                                                 const GpHyper& hyper) {
  if (x.empty() || x.size() != y.size()) {
    return BAGUA_ERROR(kInvalidArgument, "GP: %zu points and %zu scores", x.size(), y.size());
  }
  const size_t d = x[0].size();
  for (const auto& xi : x) {
    if (xi.size() != d) {
      return BAGUA_ERROR(kInvalidArgument, "GP: points of different dimension (%zu and %zu)",
                         xi.size(), d);
    }
  }
  if (hyper.lengthScales.size() != d) {
    return BAGUA_ERROR(kInvalidArgument, "GP: %zu length scales for %zu dimensions",
                       hyper.lengthScales.size(), d);
  }
  GaussianProcess gp;
  gp.x_ = x;
  gp.hyper_ = hyper;
  const double n = static_cast<double>(y.size());
  gp.yMean_ = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double var = 0;
  for (double v : y) {
    var += (v - gp.yMean_) * (v - gp.yMean_);
  }
  const double sd = std::sqrt(var / n);
  gp.yScale_ = sd > 1e-12 * std::max(1.0, std::fabs(gp.yMean_)) ? sd : 1.0;
  gp.yStd_.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    gp.yStd_[i] = (y[i] - gp.yMean_) / gp.yScale_;
  }
  BAGUA_RETURN_IF_ERROR(gp.factor());
  return gp;
}

Result<GaussianProcess> GaussianProcess::fit(const std::vector<std::vector<double>>& x,
                                             const std::vector<double>& y) {
  if (x.empty()) {
    return BAGUA_ERROR(kInvalidArgument, "GP: no points to fit");
  }
  const size_t d = x[0].size();
  GpHyper h;
  h.lengthScales.assign(d, 0.5);
  BAGUA_ASSIGN_OR_RETURN(GaussianProcess best, fitWith(x, y, h));
  double bestScore = -INFINITY;
  auto consider = [&](const GpHyper& cand) -> double {
    best.hyper_ = cand;
    if (!best.factor().isOk()) {
      return -INFINITY;
    }
    return best.lml_ + lengthPrior(cand.lengthScales);
  };
  GpHyper bestHyper = h;
  // Stage 1: one shared length scale, every noise and signal level.
  for (double l : lengthGrid()) {
    for (double s : signalGrid()) {
      for (double nz : noiseGrid()) {
        GpHyper c;
        c.lengthScales.assign(d, l);
        c.signalVariance = s;
        c.noiseVariance = nz;
        const double sc = consider(c);
        if (sc > bestScore) {
          bestScore = sc;
          bestHyper = c;
        }
      }
    }
  }
  // Stage 2: per-dimension length scales, two coordinate passes, then the noise again.
  if (d > 1) {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k = 0; k < d; ++k) {
        for (double l : lengthGrid()) {
          GpHyper c = bestHyper;
          c.lengthScales[k] = l;
          const double sc = consider(c);
          if (sc > bestScore) {
            bestScore = sc;
            bestHyper = c;
          }
        }
      }
    }
    for (double nz : noiseGrid()) {
      GpHyper c = bestHyper;
      c.noiseVariance = nz;
      const double sc = consider(c);
      if (sc > bestScore) {
        bestScore = sc;
        bestHyper = c;
      }
    }
  }
  best.hyper_ = bestHyper;
  BAGUA_RETURN_IF_ERROR(best.factor());
  return best;
}

GaussianProcess::Prediction GaussianProcess::predict(const std::vector<double>& x) const {
  const size_t n = x_.size();
  std::vector<double> ks(n);
  double mean = 0;
  for (size_t i = 0; i < n; ++i) {
    ks[i] = kernel(x, x_[i]);
    mean += ks[i] * alpha_[i];
  }
  forwardSolve(chol_, n, ks);
  double vv = 0;
  for (double v : ks) {
    vv += v * v;
  }
  const double var = std::max(hyper_.signalVariance - vv, 1e-12);
  return {yMean_ + yScale_ * mean, yScale_ * std::sqrt(var)};
}

double expectedImprovement(double mean, double stddev, double best, double xi) {
  const double imp = mean - best - xi;
  if (stddev <= 0) {
    return std::max(imp, 0.0);
  }
  const double z = imp / stddev;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2.0 * kPi);
  return imp * cdf + stddev * pdf;
}

// ---- Optimiser --------------------------------------------------------------------------------

BayesianOptimizer::BayesianOptimizer(SearchSpace space, OptimizerOptions options)
    : space_(std::move(space)),
      options_(options),
      halton_(space_.size(), options.seed),
      rng_(options.seed * 0x9e3779b97f4a7c15ull + 1) {
  initial_ = options.initialSamples > 0 ? options.initialSamples
                                        : std::max(3, 2 * static_cast<int>(space_.size()) + 2);
}

Result<BayesianOptimizer> BayesianOptimizer::create(SearchSpace space, OptimizerOptions options) {
  if (space.size() == 0) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer: empty search space");
  }
  if (options.candidates < 1 || options.xi < 0 || !std::isfinite(options.xi)) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer: candidates (%d) must be >= 1, xi (%g) >= 0",
                       options.candidates, options.xi);
  }
  return BayesianOptimizer(std::move(space), options);
}

Status BayesianOptimizer::tell(const Point& point, double score) {
  BAGUA_RETURN_IF_ERROR(space_.validate(point));
  if (!std::isfinite(score)) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer: score %g for %s is not finite", score,
                       space_.format(point).c_str());
  }
  obs_.push_back({point, score});
  return Status::ok();
}

Result<Point> BayesianOptimizer::ask() {
  ++asked_;
  if (asked_ <= initial_ || obs_.size() < 2) {
    const std::vector<double> u = halton_.next();
    Point p(space_.size());
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] = fromUniform(space_.dims()[i], u[i]);
    }
    return p;
  }
  return askByExpectedImprovement();
}

Result<Point> BayesianOptimizer::askByExpectedImprovement() {
  std::vector<std::vector<double>> xs;
  std::vector<double> ys;
  for (const Observation& o : obs_) {
    xs.push_back(space_.normalise(o.point));
    ys.push_back(o.score);
  }
  BAGUA_ASSIGN_OR_RETURN(GaussianProcess gp, GaussianProcess::fit(xs, ys));
  // Incumbent: the best posterior mean at a sampled point (robust to one lucky measurement).
  double best = -INFINITY;
  std::vector<std::pair<double, size_t>> ranked;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double m = gp.predict(xs[i]).mean;
    best = std::max(best, m);
    ranked.push_back({m, i});
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  double sd = 0;
  {
    const double mean = std::accumulate(ys.begin(), ys.end(), 0.0) / static_cast<double>(ys.size());
    for (double y : ys) {
      sd += (y - mean) * (y - mean);
    }
    sd = std::sqrt(sd / static_cast<double>(ys.size()));
  }
  const double xi = options_.xi * (sd > 0 ? sd : 1.0);

  // A setting measured twice already is not proposed again: with a large fitted noise EI can
  // otherwise keep returning one boundary point (seen on a loaded machine: nine trials in a row
  // at the largest bucket). Its measurements still inform the GP.
  std::map<Point, int> measured;
  for (const Observation& o : obs_) {
    ++measured[o.point];
  }
  std::set<Point> seen;
  Point bestPoint;
  double bestEi = -1.0;
  auto score = [&](const Point& p) {
    if (!seen.insert(p).second) {
      return;
    }
    if (auto it = measured.find(p); it != measured.end() && it->second >= 2) {
      return;
    }
    const auto pr = gp.predict(space_.normalise(p));
    const double ei = expectedImprovement(pr.mean, pr.stddev, best, xi);
    if (ei > bestEi) {
      bestEi = ei;
      bestPoint = p;
    }
  };
  const size_t d = space_.size();
  // Uniform candidates.
  for (int c = 0; c < options_.candidates; ++c) {
    Point p(d);
    for (size_t i = 0; i < d; ++i) {
      p[i] = fromUniform(space_.dims()[i], uniform01(rng_));
    }
    score(p);
  }
  // Local candidates around the most promising sampled points.
  const size_t top = std::min<size_t>(5, ranked.size());
  for (size_t t = 0; t < top; ++t) {
    const std::vector<double> base = xs[ranked[t].second];
    for (double sigma : {0.03, 0.1, 0.25}) {
      for (int c = 0; c < 24; ++c) {
        std::vector<double> u = base;
        for (size_t i = 0; i < d; ++i) {
          u[i] = clamp01(u[i] + sigma * normal01(rng_));
        }
        score(space_.denormalise(u));
      }
    }
  }
  // Hill-climb from the winner with single-coordinate moves.
  auto neighbours = [&](const Point& p) {
    std::vector<Point> out;
    for (size_t i = 0; i < d; ++i) {
      const Dimension& dim = space_.dims()[i];
      std::vector<int64_t> vals;
      if (dim.kind == DimensionKind::kBool) {
        vals.push_back(1 - p[i]);
      } else if (dim.kind == DimensionKind::kInteger) {
        vals = {p[i] - 1, p[i] + 1, p[i] - 2, p[i] + 2};
      } else {
        for (double f : {0.84, 1.19, 0.71, 1.41, 0.5, 2.0}) {
          vals.push_back(std::llround(static_cast<double>(p[i]) * f));
        }
        vals.push_back(p[i] - 1);
        vals.push_back(p[i] + 1);
      }
      for (int64_t v : vals) {
        if (dim.contains(v) && v != p[i]) {
          Point q = p;
          q[i] = v;
          out.push_back(std::move(q));
        }
      }
    }
    return out;
  };
  for (int iter = 0; iter < 32 && !bestPoint.empty(); ++iter) {
    const Point from = bestPoint;
    for (const Point& q : neighbours(from)) {
      score(q);
    }
    if (bestPoint == from) {
      break;
    }
  }
  if (bestPoint.empty()) {
    return BAGUA_ERROR(kInternal, "optimizer: no candidate could be scored");
  }
  return bestPoint;
}

std::optional<Observation> BayesianOptimizer::bestObserved() const {
  std::optional<Observation> out;
  for (const Observation& o : obs_) {
    if (!out || o.score > out->score) {
      out = o;
    }
  }
  return out;
}

std::optional<BayesianOptimizer::Best> BayesianOptimizer::bestEstimate() const {
  if (obs_.empty()) {
    return std::nullopt;
  }
  if (obs_.size() >= 3) {
    std::vector<std::vector<double>> xs;
    std::vector<double> ys;
    for (const Observation& o : obs_) {
      xs.push_back(space_.normalise(o.point));
      ys.push_back(o.score);
    }
    Result<GaussianProcess> gp = GaussianProcess::fit(xs, ys);
    if (gp.isOk()) {
      Best b{0, -INFINITY};
      for (size_t i = 0; i < xs.size(); ++i) {
        const double m = gp->predict(xs[i]).mean;
        if (m > b.mean) {
          b = {i, m};
        }
      }
      return b;
    }
  }
  Best b{0, obs_[0].score};
  for (size_t i = 1; i < obs_.size(); ++i) {
    if (obs_[i].score > b.mean) {
      b = {i, obs_[i].score};
    }
  }
  return b;
}

std::optional<Point> BayesianOptimizer::best() const {
  std::optional<Best> b = bestEstimate();
  if (!b) {
    return std::nullopt;
  }
  return obs_[b->index].point;
}

}  // namespace bagua::autotune
