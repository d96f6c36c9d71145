// PowerSGD's test model, its gradients, a double-precision reference of the algorithm written
// from the paper (independent of algorithms/src), and a runner that trains the model through
// the reducer on the host backend or (with copy callbacks) on CUDA tensors over NCCL. Shared by
// powersgd_test.cc and gpu_algorithms_test.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bagua/algorithms/powersgd.h"
#include "bagua/core/ddp.h"
#include "multi_rank.h"

namespace bagua::algo::psgdtest {

using namespace std::chrono_literals;

struct TensorSpec {
  std::string name;
  std::vector<size_t> shape;  // empty: no shape given (one dimension)
  size_t numel;
};

// Matrices that are and are not worth compressing at ranks 1-3 (the rule's edge cases), a 3-D
// and a 4-D tensor (folded into their second dimension), vectors, a tensor without a shape, and
// "z.weight", whose gradient is 0 on every rank at step kZeroStep.
inline const std::vector<TensorSpec>& model() {
  static const std::vector<TensorSpec> m = {
      {"a.weight", {12, 20}, 240},
      {"a.bias", {12}, 12},
      {"b.weight", {6, 2, 5}, 60},
      {"c.weight", {30, 7}, 210},
      {"d.weight", {9, 4, 2, 2}, 144},
      {"e.weight", {3, 50}, 150},
      {"norm.weight", {40}, 40},
      {"z.weight", {8, 8}, 64},
      {"s", {}, 10},
  };
  return m;
}
inline constexpr int kZeroStep = 2;

inline size_t rowsOf(const TensorSpec& t) {
  return t.shape.size() >= 2 ? t.shape[0] : 0;
}
inline size_t colsOf(const TensorSpec& t) {
  return t.shape.size() >= 2 ? t.numel / t.shape[0] : 0;
}

// The rank a matrix is compressed at (0: all-reduced uncompressed): min(rank, rows, cols) when
// rows * cols > minCompressionRate * (rows + cols) * that rank.
inline int compressedRank(const PowerSgdOptions& o, const TensorSpec& t) {
  const size_t rows = rowsOf(t), cols = colsOf(t);
  if (rows == 0) {
    return 0;
  }
  const size_t r = std::min({static_cast<size_t>(o.rank), rows, cols});
  return static_cast<double>(rows * cols) >
                 o.minCompressionRate * static_cast<double>((rows + cols) * r)
             ? static_cast<int>(r)
             : 0;
}

// Rank-, step-, tensor- and index-dependent gradients. Matrices: three rank-one terms of
// well-separated weights (so the power iteration is well conditioned and float and double
// agree), scaled per rank and step, plus a small rank- and index-dependent term.
inline float gradient(int rank, int step, size_t tensor, size_t index) {
  const TensorSpec& t = model()[tensor];
  if (t.name == "z.weight" && step == kZeroStep) {
    return 0.0f;
  }
  const double noise = 0.05 * std::sin(0.91 * static_cast<double>(index) + 1.3 * rank + 0.7 * step +
                                       static_cast<double>(tensor));
  const size_t cols = colsOf(t);
  if (cols == 0) {
    return static_cast<float>(std::cos(0.37 * static_cast<double>(index) + rank) + noise);
  }
  const double i = static_cast<double>(index / cols), j = static_cast<double>(index % cols);
  double v = 0.0;
  for (int k = 0; k < 3; ++k) {
    const double s = 3.0 / ((k + 1) * (k + 1));
    const double c = 1.0 + 0.2 * rank + 0.1 * step * (k + 1);
    v += s * c * std::sin(0.7 * (i + 1) * (k + 1) + static_cast<double>(tensor)) *
         std::cos(0.3 * (j + 1) * (k + 2) + 0.1 * step);
  }
  return static_cast<float>(v + noise);
}

// ---- The reference ----------------------------------------------------------------------------

using Mat = std::vector<double>;  // row-major

// Modified Gram-Schmidt on the columns of x (dim x r), as the paper and torch's hook: normalise
// column k by (norm + eps) (a norm-0 column: redrawn when `redraw`, else left at 0), then
// remove it from the later columns.
inline void orthogonalize(Mat& x, size_t dim, int r, double eps, bool redraw, uint64_t seed,
                          uint32_t key, uint64_t generation) {
  auto dot = [&](int a, int b) {
    double s = 0.0;
    for (size_t i = 0; i < dim; ++i) {
      s += x[i * r + a] * x[i * r + b];
    }
    return s;
  };
  for (int k = 0; k < r; ++k) {
    double n2 = dot(k, k);
    if (redraw && n2 == 0.0) {
      for (size_t i = 0; i < dim; ++i) {
        x[i * r + k] = powerSgdDraw(seed, key, generation, i * r + k);
      }
      for (int c = 0; c < k; ++c) {
        const double d = dot(c, k);
        for (size_t i = 0; i < dim; ++i) {
          x[i * r + k] -= d * x[i * r + c];
        }
      }
      n2 = dot(k, k);
    }
    const double n = std::sqrt(n2);
    if (n > 0 || eps > 0) {
      for (size_t i = 0; i < dim; ++i) {
        x[i * r + k] /= n + eps;
      }
    }
    for (int c = k + 1; c < r; ++c) {
      const double d = dot(k, c);
      for (size_t i = 0; i < dim; ++i) {
        x[i * r + c] -= d * x[i * r + k];
      }
    }
  }
}

// One compressed step of one matrix (rows x cols at rank r) from every rank's M (gradient plus
// error) and the Q it starts from (last step's average, or fresh draws): P = sum of M Q over
// ranks, orthogonalised; Q = mean of M^T P; approx = P Q^T. q is replaced by the new average.
inline Mat compressOne(const std::vector<Mat>& m, Mat& q, size_t rows, size_t cols, int r,
                       const PowerSgdOptions& o, uint32_t key, uint64_t gen) {
  const int world = static_cast<int>(m.size());
  orthogonalize(q, cols, r, o.orthogonalizationEpsilon, true, o.seed, key, gen);
  Mat p(rows * r, 0.0);
  for (int w = 0; w < world; ++w) {
    for (size_t i = 0; i < rows; ++i) {
      for (int k = 0; k < r; ++k) {
        double s = 0.0;
        for (size_t j = 0; j < cols; ++j) {
          s += m[w][i * cols + j] * q[j * r + k];
        }
        p[i * r + k] += s;
      }
    }
  }
  orthogonalize(p, rows, r, o.orthogonalizationEpsilon, false, o.seed, key, gen);
  q.assign(cols * r, 0.0);
  for (int w = 0; w < world; ++w) {
    for (size_t j = 0; j < cols; ++j) {
      for (int k = 0; k < r; ++k) {
        double s = 0.0;
        for (size_t i = 0; i < rows; ++i) {
          s += m[w][i * cols + j] * p[i * r + k];
        }
        q[j * r + k] += s / world;
      }
    }
  }
  Mat approx(rows * cols, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      double a = 0.0;
      for (int k = 0; k < r; ++k) {
        a += p[i * r + k] * q[j * r + k];
      }
      approx[i * cols + j] = a;
    }
  }
  return approx;
}

// What every rank should see after each step.
struct RefStep {
  std::vector<std::vector<double>> grads;  // [tensor]: the reduced gradient (all ranks)
  std::vector<std::vector<Mat>> error;     // [rank][tensor]: empty where not compressed
  std::vector<Mat> q;                      // [tensor]: the averaged Q (compressed steps)
};

class Reference {
 public:
  Reference(int world, const PowerSgdOptions& o) : world_(world), o_(o) {
    const size_t nt = model().size();
    err_.assign(world, std::vector<Mat>(nt));
    q_.assign(nt, {});
    for (size_t t = 0; t < nt; ++t) {
      if (compressedRank(o_, model()[t]) > 0) {
        for (auto& e : err_) {
          e[t].assign(model()[t].numel, 0.0);
        }
      }
    }
  }

  // Step `step` from gradients g[rank][tensor][i].
  RefStep step(int step, const std::vector<std::vector<std::vector<float>>>& g) {
    RefStep out;
    const size_t nt = model().size();
    out.grads.resize(nt);
    out.q.resize(nt);
    const bool compress = step >= o_.startIter;
    for (size_t t = 0; t < nt; ++t) {
      const TensorSpec& ts = model()[t];
      const int r = compress ? compressedRank(o_, ts) : 0;
      if (r == 0) {
        out.grads[t].assign(ts.numel, 0.0);
        for (int w = 0; w < world_; ++w) {
          for (size_t i = 0; i < ts.numel; ++i) {
            out.grads[t][i] += g[w][t][i];
          }
        }
        for (double& v : out.grads[t]) {
          v /= world_;
        }
        continue;
      }
      const size_t cols = colsOf(ts);
      const auto key = static_cast<uint32_t>(t);
      const auto gen = static_cast<uint64_t>(step);
      Mat& q = q_[t];
      if (!o_.warmStart || !qReady_) {
        q.assign(cols * r, 0.0);
        for (size_t e = 0; e < q.size(); ++e) {
          q[e] = powerSgdDraw(o_.seed, key, gen, e);
        }
      }
      std::vector<Mat> m(world_, Mat(ts.numel));
      for (int w = 0; w < world_; ++w) {
        for (size_t i = 0; i < ts.numel; ++i) {
          m[w][i] = g[w][t][i] + (o_.errorFeedback ? err_[w][t][i] : 0.0);
        }
      }
      out.grads[t] = compressOne(m, q, rowsOf(ts), cols, r, o_, key, gen);
      if (o_.errorFeedback) {
        for (int w = 0; w < world_; ++w) {
          for (size_t i = 0; i < ts.numel; ++i) {
            err_[w][t][i] = m[w][i] - out.grads[t][i];
          }
        }
      }
      out.q[t] = q;
    }
    qReady_ = qReady_ || compress;
    out.error = err_;
    return out;
  }

 private:
  int world_;
  PowerSgdOptions o_;
  std::vector<std::vector<Mat>> err_;
  std::vector<Mat> q_;
  bool qReady_ = false;
};

// ---- The runner -------------------------------------------------------------------------------

// What one rank saw after each step.
struct RankRun {
  std::vector<std::vector<std::vector<float>>> grads;  // [step][tensor]
  std::vector<PowerSgd::Snapshot> snapshots;           // [step], after the step
  std::vector<std::vector<std::string>> layouts;       // bucket layout of each step
};

// Memory of one rank's parameters: host vectors, or device memory through these callbacks.
struct Memory {
  std::function<void*(size_t bytes)> alloc;  // null: host
  std::function<void(void* dst, const void* src, size_t bytes)> toDevice;
  std::function<void(void* dst, const void* src, size_t bytes)> toHost;
};

// Trains `steps` steps of model() on one rank: gradient(rank, step, ...) into every gradient,
// marked ready in a fixed order unlike registration's (so the reducer's rebuild after the first
// step moves tensors between buckets), small buckets (several per step).
// resumeAfter >= 0: before that step, the reducer's schedule (step counter and algorithm state)
// is saved, the reducer destroyed, and a new one with a new PowerSgd restores it (a resume).
inline std::string runRank(core::ProcessGroup& pg, int rank, int steps,
                           std::shared_ptr<PowerSgd> algo, const Memory& mem, core::Device device,
                           RankRun& out, int resumeAfter = -1) {
  const auto& spec = model();
  std::vector<core::Parameter> params(spec.size());
  std::vector<std::vector<float>> data(spec.size()), grad(spec.size());
  for (size_t t = 0; t < spec.size(); ++t) {
    data[t].assign(spec[t].numel, 0.5f);
    grad[t].assign(spec[t].numel, 0.0f);
    core::Parameter& p = params[t];
    p.name = spec[t].name;
    p.numel = spec[t].numel;
    p.shape = spec[t].shape;
    p.device = device;
    if (mem.alloc) {
      p.data = mem.alloc(p.numel * 4);
      p.grad = mem.alloc(p.numel * 4);
      mem.toDevice(p.data, data[t].data(), p.numel * 4);
    } else {
      p.data = data[t].data();
      p.grad = grad[t].data();
    }
  }
  std::vector<core::Parameter> buffers;
  core::DdpOptions dopt;
  dopt.bucketCapMb = 800.0 / (1024.0 * 1024.0);  // 200 floats: most tensors get a bucket
  dopt.firstBucketBytes = 400;
  auto ddp = core::DistributedDataParallel::create(params, buffers, {}, algo, pg, dopt);
  if (!ddp.isOk()) {
    return ddp.status().toString();
  }
  const std::vector<int> order = {2, 7, 0, 5, 8, 1, 3, 6, 4};
  for (int step = 0; step < steps; ++step) {
    if (step == resumeAfter) {
      auto saved = (*ddp)->saveSchedule();
      if (!saved.isOk()) {
        return saved.status().toString();
      }
      ddp->reset();
      algo = std::make_shared<PowerSgd>(algo->options());
      ddp = core::DistributedDataParallel::create(params, buffers, {}, algo, pg, dopt);
      if (!ddp.isOk()) {
        return ddp.status().toString();
      }
      Status r = (*ddp)->restoreSchedule(*saved);
      if (!r.isOk()) {
        return "restore: " + r.toString();
      }
    }
    Status s = (*ddp)->prepareForward();
    out.layouts.push_back({});
    for (const auto& b : (*ddp)->bucketLayout()) {
      std::string names;
      for (const auto& n : b) {
        names += n + " ";
      }
      out.layouts.back().push_back(names);
    }
    for (int t : order) {
      if (!s.isOk()) {
        break;
      }
      std::vector<float> g(spec[t].numel);
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = gradient(rank, step, static_cast<size_t>(t), i);
      }
      if (mem.alloc) {
        mem.toDevice(params[t].grad, g.data(), g.size() * 4);
      } else {
        std::copy(g.begin(), g.end(), static_cast<float*>(params[t].grad));
      }
      s = (*ddp)->markGradReady(t);
    }
    if (s.isOk()) {
      s = (*ddp)->finishBackward();
    }
    if (!s.isOk()) {
      return strPrintf("step %d: %s", step, s.toString().c_str());
    }
    out.grads.push_back({});
    for (size_t t = 0; t < spec.size(); ++t) {
      std::vector<float> g(spec[t].numel);
      if (mem.alloc) {
        mem.toHost(g.data(), params[t].grad, g.size() * 4);
      } else {
        std::copy_n(static_cast<const float*>(params[t].grad), g.size(), g.begin());
      }
      out.grads.back().push_back(std::move(g));
    }
    auto snap = algo->snapshot();
    if (!snap.isOk()) {
      return snap.status().toString();
    }
    out.snapshots.push_back(std::move(*snap));
  }
  return "";
}

// Largest |a - b| over a tensor, and the largest |b| (the scale of the comparison).
struct Diff {
  double maxAbs = 0.0;
  double scale = 0.0;
};
inline Diff diff(const std::vector<float>& a, const std::vector<double>& b) {
  Diff d;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d.maxAbs = std::max(d.maxAbs, std::abs(static_cast<double>(a[i]) - b[i]));
    d.scale = std::max(d.scale, std::abs(b[i]));
  }
  return d;
}

// ---- The checks ---------------------------------------------------------------------------------

inline std::vector<std::vector<std::vector<float>>> gradientsAt(int world, int step) {
  std::vector<std::vector<std::vector<float>>> g(world);
  for (int w = 0; w < world; ++w) {
    g[w].resize(model().size());
    for (size_t t = 0; t < model().size(); ++t) {
      g[w][t].resize(model()[t].numel);
      for (size_t i = 0; i < model()[t].numel; ++i) {
        g[w][t][i] = gradient(w, step, t, i);
      }
    }
  }
  return g;
}

inline double maxAbs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) {
    m = std::max(m, std::abs(x));
  }
  return m;
}

// Every step of `runs` against the reference, relative to each tensor's largest value: the
// reduced gradients (bitwise equal across ranks), the compressed set and the elements per step
// (the rule), each rank's error and the averaged Q. "" when all hold, else the first failure.
// *worst: the largest relative difference of the gradients.
inline std::string checkReference(const std::vector<RankRun>& runs, const PowerSgdOptions& o,
                                  int steps, double tol, double* worst) {
  const int world = static_cast<int>(runs.size());
  Reference ref(world, o);
  std::set<std::string> compressed;
  size_t perStep = 0, plain = 0;
  for (const TensorSpec& ts : model()) {
    const int r = compressedRank(o, ts);
    plain += ts.numel;
    perStep += r > 0 ? (rowsOf(ts) + colsOf(ts)) * static_cast<size_t>(r) : ts.numel;
    if (r > 0) {
      compressed.insert(ts.name);
    }
  }
  *worst = 0.0;
  for (int step = 0; step < steps; ++step) {
    const RefStep want = ref.step(step, gradientsAt(world, step));
    for (int w = 0; w < world; ++w) {
      const RankRun& run = runs[w];
      if (run.grads.size() != static_cast<size_t>(steps)) {
        return strPrintf("rank %d ran %zu steps", w, run.grads.size());
      }
      const std::string at = strPrintf("step %d rank %d", step, w);
      const PowerSgd::Snapshot& snap = run.snapshots[step];
      if (snap.steps != step + 1 || snap.elementsPerStep != perStep ||
          snap.uncompressedElements != plain) {
        return at + strPrintf(": snapshot steps %lld, elements %zu (want %zu) of %zu (want %zu)",
                              static_cast<long long>(snap.steps), snap.elementsPerStep, perStep,
                              snap.uncompressedElements, plain);
      }
      std::set<std::string> got;
      for (const auto& [name, st] : snap.tensors) {
        got.insert(name);
      }
      if (got != compressed) {
        return at + ": the compressed set differs from the rule's";
      }
      for (size_t t = 0; t < model().size(); ++t) {
        const TensorSpec& ts = model()[t];
        const Diff d = diff(run.grads[step][t], want.grads[t]);
        const double rel = d.maxAbs / std::max(d.scale, 1e-3);
        *worst = std::max(*worst, rel);
        if (rel > tol) {
          return at + strPrintf(": %s off the reference by %.3g of its scale %.3g", ts.name.c_str(),
                                rel, d.scale);
        }
        if (run.grads[step][t] != runs[0].grads[step][t]) {
          return at + ": " + ts.name + " differs from rank 0's";
        }
        auto it = snap.tensors.find(ts.name);
        if (it == snap.tensors.end()) {
          continue;
        }
        const PowerSgd::TensorState& st = it->second;
        if (st.rank != compressedRank(o, ts)) {
          return at + ": " + ts.name + " compressed at the wrong rank";
        }
        if (step >= o.startIter) {
          const Diff dq = diff(st.q, want.q[t]);
          if (dq.maxAbs > tol * dq.scale) {
            return at +
                   strPrintf(": Q of %s off by %.3g of %.3g", ts.name.c_str(), dq.maxAbs, dq.scale);
          }
        }
        if (o.errorFeedback) {
          // Relative to the gradient's scale: the error is what the approximation missed.
          const Diff de = diff(st.error, want.error[w][t]);
          if (de.maxAbs > tol * std::max(maxAbs(want.grads[t]), de.scale)) {
            return at + strPrintf(": error of %s off by %.3g", ts.name.c_str(), de.maxAbs);
          }
          if (step < o.startIter && de.scale != 0.0) {
            return at + ": an error before compression started";
          }
        } else if (!st.error.empty()) {
          return at + ": an error kept without error feedback";
        }
      }
    }
    // A gradient of 0 on every rank with no error to add: P = 0, so Q = 0 and the step applies
    // 0; the next step redraws Q's columns and compresses again.
    if (!o.errorFeedback && step >= o.startIter && step == kZeroStep) {
      const auto& q = runs[0].snapshots[step].tensors.at("z.weight").q;
      if (maxAbs(std::vector<double>(q.begin(), q.end())) != 0.0 || maxAbs(want.grads[7]) != 0.0) {
        return "z.weight: a zero gradient should leave Q and the step at 0";
      }
    }
    if (!o.errorFeedback && step == kZeroStep + 1 && step > o.startIter &&
        maxAbs(want.grads[7]) < 0.1) {
      return "z.weight: not compressing again after the redraw";
    }
  }
  return "";
}

// A run with quantised factors: ranks bitwise equal; uncompressed tensors and the first
// compressed step (no column norms yet) exact to `tol`; every later compressed step within
// `bound` (relative Frobenius) of the exact step from the state the run had (each rank's error
// and the previous Q); and error + applied gradient = M on every rank (the error absorbs the
// quantisation). *worst: the largest relative distance to the exact step.
inline std::string checkQuantized(const std::vector<RankRun>& runs, const PowerSgdOptions& o,
                                  int steps, double tol, double bound, double* worst) {
  const int world = static_cast<int>(runs.size());
  Reference exact(world, o);
  *worst = 0.0;
  for (int step = 0; step < steps; ++step) {
    const auto g = gradientsAt(world, step);
    const RefStep first = exact.step(step, g);
    for (size_t t = 0; t < model().size(); ++t) {
      const TensorSpec& ts = model()[t];
      const std::string at = strPrintf("step %d %s", step, ts.name.c_str());
      const int r = step >= o.startIter ? compressedRank(o, ts) : 0;
      for (int w = 1; w < world; ++w) {
        if (runs[w].grads[step][t] != runs[0].grads[step][t]) {
          return at + ": ranks differ";
        }
      }
      if (r == 0 || step == o.startIter) {
        const Diff d = diff(runs[0].grads[step][t], first.grads[t]);
        if (d.maxAbs > tol * std::max(d.scale, 1e-3)) {
          return at + strPrintf(": exact step off by %.3g of %.3g", d.maxAbs, d.scale);
        }
        continue;
      }
      std::vector<Mat> m(world, Mat(ts.numel));
      for (int w = 0; w < world; ++w) {
        const auto& prev = runs[w].snapshots[step - 1].tensors.at(ts.name);
        for (size_t i = 0; i < ts.numel; ++i) {
          m[w][i] = g[w][t][i] + static_cast<double>(prev.error[i]);
        }
      }
      const auto& prevQ = runs[0].snapshots[step - 1].tensors.at(ts.name).q;
      Mat q(prevQ.begin(), prevQ.end());
      const Mat want = compressOne(m, q, rowsOf(ts), colsOf(ts), r, o, static_cast<uint32_t>(t),
                                   static_cast<uint64_t>(step));
      double num = 0.0, den = 0.0;
      for (size_t i = 0; i < ts.numel; ++i) {
        const double e = runs[0].grads[step][t][i] - want[i];
        num += e * e;
        den += want[i] * want[i];
      }
      const double rel = std::sqrt(num / den);
      *worst = std::max(*worst, rel);
      if (rel > bound) {
        return at + strPrintf(": %.4f from the exact step (bound %.3f)", rel, bound);
      }
      for (int w = 0; w < world; ++w) {
        const auto& now = runs[w].snapshots[step].tensors.at(ts.name);
        double scale = 0.0, bad = 0.0;
        for (size_t i = 0; i < ts.numel; ++i) {
          scale = std::max(scale, std::abs(m[w][i]));
          bad = std::max(bad, std::abs(static_cast<double>(now.error[i]) +
                                       runs[w].grads[step][t][i] - m[w][i]));
        }
        if (bad > 1e-5 * scale) {
          return at + strPrintf(" rank %d: error + applied differs from M by %.3g", w, bad);
        }
      }
    }
  }
  return "";
}

}  // namespace bagua::algo::psgdtest
