#include "bagua/loader/sampler.h"

#include <algorithm>
#include <cmath>

#include "bagua/loader/random.h"

namespace bagua::loader {

// --- Sampler ------------------------------------------------------------------------------------

Sampler::Sampler(size_t datasetSize, const SamplerOptions& options)
    : datasetSize_(datasetSize), options_(options) {
  const size_t r = static_cast<size_t>(options.numReplicas);
  numSamples_ = options.dropLast ? datasetSize / r : (datasetSize + r - 1) / r;
}

Status Sampler::validate(size_t datasetSize, const SamplerOptions& options) {
  if (datasetSize == 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "the dataset is empty: a sampler needs at least one sample");
  }
  if (options.numReplicas < 1) {
    return BAGUA_ERROR(kInvalidArgument, "numReplicas is %d; it must be at least 1 (world size)",
                       options.numReplicas);
  }
  if (options.rank < 0 || options.rank >= options.numReplicas) {
    return BAGUA_ERROR(kInvalidArgument,
                       "rank %d is out of range: expected [0, %d) for %d replicas", options.rank,
                       options.numReplicas, options.numReplicas);
  }
  if (options.dropLast && datasetSize < static_cast<size_t>(options.numReplicas)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "drop_last with %zu samples and %d replicas leaves no sample for any rank; "
                       "use drop_last=false (pads by repetition) or fewer replicas",
                       datasetSize, options.numReplicas);
  }
  return Status::ok();
}

void Sampler::setEpoch(uint64_t epoch) {
  epoch_ = epoch;
  computeOrder(epoch);
}

std::vector<size_t> Sampler::indicesOf(int rank) const {
  std::vector<size_t> out;
  if (rank < 0 || rank >= options_.numReplicas) {
    return out;
  }
  const size_t r = static_cast<size_t>(options_.numReplicas);
  out.reserve(numSamples_);
  for (size_t s = 0; s < numSamples_; ++s) {
    out.push_back(order_[s * r + static_cast<size_t>(rank)]);
  }
  return out;
}

// --- DistributedSampler ---------------------------------------------------------------------

Result<std::unique_ptr<DistributedSampler>> DistributedSampler::create(
    size_t datasetSize, const SamplerOptions& options) {
  BAGUA_RETURN_IF_ERROR(validate(datasetSize, options));
  std::unique_ptr<DistributedSampler> s(new DistributedSampler(datasetSize, options));
  s->setEpoch(0);
  return s;
}

void DistributedSampler::computeOrder(uint64_t epoch) {
  std::vector<size_t> base;
  if (options_.shuffle) {
    Rng rng(epochSeed(options_.seed, epoch));
    base = rng.permutation(datasetSize_);
  } else {
    base.resize(datasetSize_);
    for (size_t i = 0; i < datasetSize_; ++i) {
      base[i] = i;
    }
  }
  // PyTorch: pad by repeating the head (as many times as needed), or cut the tail by position.
  // Its subsample indices[rank:total:R] is exactly our step-major layout.
  const size_t total = totalSize();
  order_.resize(total);
  for (size_t k = 0; k < total; ++k) {
    order_[k] = base[k % datasetSize_];
  }
}

// --- LoadBalancingDistributedSampler ----------------------------------------------------------

ComplexityFn complexityOfSamples(const Dataset& dataset,
                                 std::function<Result<int64_t>(const Sample&)> fn) {
  return [&dataset, fn = std::move(fn)](size_t index) -> Result<int64_t> {
    Sample sample;
    BAGUA_RETURN_IF_ERROR(dataset.get(index, sample));
    return fn(sample);
  };
}

Result<std::unique_ptr<LoadBalancingDistributedSampler>> LoadBalancingDistributedSampler::create(
    size_t datasetSize, const ComplexityFn& complexity, const LoadBalancingOptions& options) {
  BAGUA_RETURN_IF_ERROR(validate(datasetSize, options));
  if (!complexity) {
    return BAGUA_ERROR(kInvalidArgument, "the complexity function is empty");
  }
  std::vector<int64_t> c(datasetSize);
  for (size_t i = 0; i < datasetSize; ++i) {
    Result<int64_t> v = complexity(i);
    if (!v.isOk()) {
      Status s = v.takeStatus();
      s.withContext(strPrintf("complexity function failed for sample %zu of %zu", i, datasetSize));
      return std::move(s.addFrame(__FILE__, __LINE__));
    }
    c[i] = *v;
  }
  return create(std::move(c), options);
}

Result<std::unique_ptr<LoadBalancingDistributedSampler>> LoadBalancingDistributedSampler::create(
    std::vector<int64_t> complexities, const LoadBalancingOptions& options) {
  BAGUA_RETURN_IF_ERROR(validate(complexities.size(), options));
  if (!(options.randomLevel >= 0.0 && options.randomLevel <= 1.0)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "randomLevel is %g; it must be in [0, 1] (0 = best balance, 1 = noise as "
                       "large as the complexity range)",
                       options.randomLevel);
  }
  for (size_t i = 0; i < complexities.size(); ++i) {
    if (complexities[i] < 0 || complexities[i] > kMaxComplexity) {
      return BAGUA_ERROR(kInvalidArgument,
                         "complexity of sample %zu is %lld; it must be in [0, 2^52] (a cost such "
                         "as a token count)",
                         i, static_cast<long long>(complexities[i]));
    }
  }
  std::unique_ptr<LoadBalancingDistributedSampler> s(
      new LoadBalancingDistributedSampler(std::move(complexities), options));
  s->setEpoch(0);
  return s;
}

LoadBalancingDistributedSampler::LoadBalancingDistributedSampler(
    std::vector<int64_t> complexities, const LoadBalancingOptions& options)
    : Sampler(complexities.size(), options),
      randomLevel_(options.randomLevel),
      complexity_(std::move(complexities)) {
  sorted_.resize(complexity_.size());
  for (size_t i = 0; i < sorted_.size(); ++i) {
    sorted_[i] = i;
  }
  std::stable_sort(sorted_.begin(), sorted_.end(),
                   [this](size_t a, size_t b) { return complexity_[a] < complexity_[b]; });
  const int64_t lo = complexity_[sorted_.front()];
  const int64_t hi = complexity_[sorted_.back()];
  // Bagua: int((max_c - min_c) * random_level + 1). Complexities are <= 2^52, so the double
  // product is exact enough and the sum with a complexity stays far from overflow.
  noiseRange_ = static_cast<int64_t>(static_cast<double>(hi - lo) * randomLevel_ + 1.0);
  if (noiseRange_ < 1) {
    noiseRange_ = 1;
  }
}

void LoadBalancingDistributedSampler::computeOrder(uint64_t epoch) {
  const size_t n = datasetSize_;
  const size_t r = static_cast<size_t>(options_.numReplicas);
  const size_t chunks = numSamples_;
  const std::vector<size_t>* list = &sorted_;
  std::vector<size_t> chunkOrder(chunks);
  for (size_t i = 0; i < chunks; ++i) {
    chunkOrder[i] = i;
  }
  if (options_.shuffle) {
    Rng rng(epochSeed(options_.seed, epoch));
    if (noiseRange_ > 1) {
      // Noise drawn in index order, then a stable sort of the clean order by the noisy key:
      // ties keep complexity order, then index order.
      noisy_.resize(n);
      for (size_t i = 0; i < n; ++i) {
        noisy_[i] = complexity_[i] +
                    static_cast<int64_t>(rng.uniformInt(static_cast<uint64_t>(noiseRange_)));
      }
      epochSorted_ = sorted_;
      std::stable_sort(epochSorted_.begin(), epochSorted_.end(),
                       [this](size_t a, size_t b) { return noisy_[a] < noisy_[b]; });
      list = &epochSorted_;
    }
    chunkOrder = rng.permutation(chunks);
  }
  // Chunk c holds sorted positions [c * R, c * R + R), wrapping around to the cheapest items to
  // pad. With drop_last, total <= n and the most expensive tail is never reached.
  order_.resize(chunks * r);
  for (size_t s = 0; s < chunks; ++s) {
    const size_t base = chunkOrder[s] * r;
    for (size_t k = 0; k < r; ++k) {
      order_[s * r + k] = (*list)[(base + k) % n];
    }
  }
}

}  // namespace bagua::loader
