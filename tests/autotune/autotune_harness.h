// The autotuner tests' harness: a synthetic model whose gradients become ready in an order that
// differs from registration order, one training iteration checked against the closed form of the
// reduced gradients, a rank's process group on loopback, tuner options that decide within a few
// iterations, and the per-rank log of layouts and switches. Header only, for
// tests/autotune/autotuner_*_test.cc.
//
// Thread safety: each helper touches only its arguments; one Model per rank thread.
#pragma once

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "bagua/autotune/autotuner.h"
#include "bagua/core/ddp.h"
#include "bagua/core/process_group.h"

namespace bagua::autotune::tunetest {

using core::DataType;
using core::DistributedDataParallel;
using core::Parameter;

// A synthetic model: tensors of assorted sizes whose gradients become ready in a fixed order
// that differs from registration order (so a learned order is visible in the layouts).
struct Model {
  std::vector<std::vector<float>> data, grad;
  std::vector<Parameter> params, buffers;
  std::vector<int> readyOrder;

  // `scale` multiplies every tensor's size (large enough and the engine transport chunks).
  Model(const std::string& prefix, int n, size_t scale = 1) {
    data.resize(n);
    grad.resize(n);
    for (int i = 0; i < n; ++i) {
      const size_t numel = (64 + static_cast<size_t>((i * 37) % 11) * 96) * scale;
      data[i].assign(numel, 0.0f);
      grad[i].assign(numel, 0.0f);
    }
    for (int i = 0; i < n; ++i) {
      Parameter p;
      p.name = prefix + "p" + std::to_string(i);
      p.data = data[i].data();
      p.grad = grad[i].data();
      p.numel = data[i].size();
      params.push_back(p);
      readyOrder.push_back((i * 5 + 3) % n);  // a permutation when gcd(5, n) == 1
    }
  }
  size_t bytes() const {
    size_t b = 0;
    for (const auto& g : grad) {
      b += g.size() * 4;
    }
    return b;
  }
};

// Gradient value that averages exactly: mean over 4 ranks of (rank + c) is 1.5 + c.
inline float gradValue(int rank, int64_t step, int tensor, size_t k) {
  return static_cast<float>(rank + 4 * static_cast<int>(k % 7) + tensor + static_cast<int>(step));
}

// One training iteration; checks the reduced gradients against the closed form.
inline std::string trainStep(DistributedDataParallel& d, Model& m, int rank, int world) {
  Status s = d.prepareForward();
  if (!s.isOk()) {
    return s.toString();
  }
  const int64_t step = d.trainStep();
  for (int t : m.readyOrder) {
    for (size_t k = 0; k < m.grad[t].size(); ++k) {
      m.grad[t][k] = gradValue(rank, step, t, k);
    }
    s = d.markGradReady(t);
    if (!s.isOk()) {
      return s.toString();
    }
  }
  s = d.finishBackward();
  if (!s.isOk()) {
    return s.toString();
  }
  const float rankMean = static_cast<float>(world - 1) / 2.0f;
  for (size_t t = 0; t < m.grad.size(); ++t) {
    for (size_t k = 0; k < m.grad[t].size(); ++k) {
      const float want = gradValue(0, step, static_cast<int>(t), k) + rankMean;
      if (m.grad[t][k] != want) {
        return strPrintf("step %lld: tensor %zu element %zu is %g, want %g",
                         static_cast<long long>(step), t, k, m.grad[t][k], want);
      }
    }
  }
  return "";
}

inline core::ProcessGroupOptions groupOptions(int rank, int world, int localWorld = -1) {
  core::ProcessGroupOptions po;
  po.rank = rank;
  po.worldSize = world;
  po.localWorldSize = localWorld;
  po.hierarchical = localWorld > 0;
  po.rendezvousTimeout = std::chrono::milliseconds(20000);
  po.collectiveTimeout = std::chrono::milliseconds(30000);
  return po;
}

inline AutotuneOptions fastOptions(int samples) {
  AutotuneOptions o;
  o.enabled = true;
  o.maxSamples = samples;
  o.warmupTimeS = 0.0;
  o.samplingConfidenceTimeS = 0.0;
  o.checkInterval = 2;
  o.seed = 5;
  o.logFile = "";
  o.saveFile = "";
  o.loadFile = "";
  o.waitTimeout = std::chrono::milliseconds(20000);
  o.minBucketBytes = 256;
  return o;
}

struct RankLog {
  std::vector<std::vector<std::vector<std::string>>> layouts;  // per iteration
  std::vector<bool> hierarchical;                              // per iteration
  std::vector<int64_t> switches;
  std::vector<Trial> trials;
  bool tuning = true;
  bool skipped = false;
};

inline std::string tempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "_" + std::to_string(::getpid()) + ".txt"))
      .string();
}

}  // namespace bagua::autotune::tunetest
