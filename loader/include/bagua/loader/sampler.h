// Distributed samplers: which dataset indices each of R ranks reads, in which order, per epoch.
//
// Two samplers share one layout. For an epoch, a sampler computes a step-major order of
// totalSize() = numSamples() * numReplicas() indices: rank r's s-th sample is
// order()[s * numReplicas() + r]. Every rank constructs the same sampler (same dataset size,
// options and seed) and so agrees on the whole order without communication.
//
//  - DistributedSampler: PyTorch's DistributedSampler semantics, used as the fallback and as the
//    peer in the balance benchmark. Shuffle = a random permutation per epoch; without drop_last
//    the list is padded by repeating its head, with drop_last its tail (by position) is cut.
//  - LoadBalancingDistributedSampler: Bagua's ordering (reference: bagua_behaviour.md 5.1).
//    Complexities are computed once at construction; each epoch adds integer noise in
//    [0, (max - min) * randomLevel + 1) to them, stable-sorts, cuts the sorted list into
//    numSamples() chunks of numReplicas() neighbours (wrapping around to the cheapest items to
//    pad, or dropping the most expensive tail with drop_last), shuffles the chunk order, and
//    gives rank r element r of each chunk. So at every step all ranks hold samples of similar
//    complexity.
//
// Sizes (both samplers, N = dataset size, R = replicas): numSamples = N / R with drop_last,
// else ceil(N / R); totalSize = numSamples * R. With drop_last and N < R there is nothing to
// read and create() fails.
//
// Determinism: the order depends only on (N, options, complexities, epoch); the random numbers
// come from bagua::loader::Rng (portable, see random.h), so it is the same on every machine.
//
// Thread safety: a sampler is not synchronised. setEpoch() must not race with the accessors;
// const accessors may be called concurrently with each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/loader/dataset.h"

namespace bagua::loader {

struct SamplerOptions {
  int numReplicas = 1;  // world size, >= 1
  int rank = 0;         // in [0, numReplicas)
  bool shuffle = true;  // reshuffle every epoch (seeded by seed and epoch)
  uint64_t seed = 0;    // must be the same on every rank
  bool dropLast = false;
};

struct LoadBalancingOptions : SamplerOptions {
  // 0: best balance (noise only breaks nothing: chunks are exact neighbours);
  // 1: noise as large as the whole complexity range (balance close to random). In [0, 1].
  double randomLevel = 0.0;
};

// Base of both samplers: the step-major order and the accessors.
class Sampler {
 public:
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
  virtual ~Sampler() = default;

  // Recomputes the order for `epoch`. Every rank must call it with the same epoch.
  void setEpoch(uint64_t epoch);
  uint64_t epoch() const { return epoch_; }

  size_t datasetSize() const { return datasetSize_; }
  int numReplicas() const { return options_.numReplicas; }
  int rank() const { return options_.rank; }
  const SamplerOptions& options() const { return options_; }
  // Samples per rank per epoch (identical on every rank).
  size_t numSamples() const { return numSamples_; }
  size_t totalSize() const { return numSamples_ * static_cast<size_t>(options_.numReplicas); }

  // The whole step-major order of the current epoch (size totalSize()).
  const std::vector<size_t>& order() const { return order_; }
  // The indices `rank` reads this epoch, in order (rank in [0, numReplicas)).
  std::vector<size_t> indicesOf(int rank) const;
  // This rank's indices.
  std::vector<size_t> indices() const { return indicesOf(options_.rank); }

 protected:
  Sampler(size_t datasetSize, const SamplerOptions& options);
  // Fills order_ for `epoch` (called by setEpoch and once at creation with epoch 0).
  virtual void computeOrder(uint64_t epoch) = 0;
  // Validates the common options; the error names what is wrong and the accepted values.
  static Status validate(size_t datasetSize, const SamplerOptions& options);

  size_t datasetSize_;
  SamplerOptions options_;
  size_t numSamples_;
  uint64_t epoch_ = 0;
  std::vector<size_t> order_;
};

class DistributedSampler final : public Sampler {
 public:
  // InvalidArgument for an empty dataset, numReplicas < 1, rank outside [0, numReplicas), or
  // drop_last with fewer samples than replicas.
  static Result<std::unique_ptr<DistributedSampler>> create(size_t datasetSize,
                                                            const SamplerOptions& options);

 private:
  DistributedSampler(size_t datasetSize, const SamplerOptions& options)
      : Sampler(datasetSize, options) {}
  void computeOrder(uint64_t epoch) override;
};

// Cost of one sample, e.g. its token count. Must be deterministic and the same on every rank,
// and lie in [0, kMaxComplexity]. Called once per index, from the thread calling create().
using ComplexityFn = std::function<Result<int64_t>(size_t index)>;

// Adapts a cost function of the sample itself (Bagua's complexity_fn(dataset[i])): reads each
// sample through `dataset` (which must outlive the returned function).
ComplexityFn complexityOfSamples(const Dataset& dataset,
                                 std::function<Result<int64_t>(const Sample&)> fn);

class LoadBalancingDistributedSampler final : public Sampler {
 public:
  static constexpr int64_t kMaxComplexity = int64_t{1} << 52;

  // Calls `complexity` for every index (a full pass, as Bagua does). Errors: those of
  // DistributedSampler::create, randomLevel outside [0, 1], a complexity call failing (with the
  // index as context) or returning a value outside [0, kMaxComplexity].
  static Result<std::unique_ptr<LoadBalancingDistributedSampler>> create(
      size_t datasetSize, const ComplexityFn& complexity, const LoadBalancingOptions& options);
  // The same with complexities computed beforehand (complexities.size() is the dataset size).
  static Result<std::unique_ptr<LoadBalancingDistributedSampler>> create(
      std::vector<int64_t> complexities, const LoadBalancingOptions& options);

  double randomLevel() const { return randomLevel_; }
  const std::vector<int64_t>& complexities() const { return complexity_; }
  // Exclusive upper bound of the per-epoch noise: int((max - min) * randomLevel + 1).
  int64_t noiseRange() const { return noiseRange_; }

 private:
  LoadBalancingDistributedSampler(std::vector<int64_t> complexities,
                                  const LoadBalancingOptions& options);
  void computeOrder(uint64_t epoch) override;

  double randomLevel_;
  std::vector<int64_t> complexity_;
  std::vector<size_t> sorted_;  // indices stably sorted by clean complexity
  int64_t noiseRange_ = 1;
  // Scratch reused across epochs.
  std::vector<int64_t> noisy_;
  std::vector<size_t> epochSorted_;
};

}  // namespace bagua::loader
