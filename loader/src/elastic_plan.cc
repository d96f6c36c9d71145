#include "bagua/loader/elastic_plan.h"

#include <algorithm>
#include <numeric>

#include "bagua/loader/random.h"

namespace bagua::loader {

namespace {

constexpr uint32_t kPositionMagic = 0x50455442;  // "BTEP" little-endian: bagua elastic position
constexpr uint32_t kPositionVersion = 1;
// Tags that keep the noise streams of a fresh epoch's cut and a resumed segment's cut apart.
constexpr uint64_t kTagFull = 0x66756c6c;
constexpr uint64_t kTagResumed = 0x72657375;

void put(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
}

uint64_t get(std::span<const uint8_t> in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(in[at + static_cast<size_t>(i)]) << (8 * i);
  }
  return v;
}

}  // namespace

std::vector<uint8_t> ElasticPosition::serialize() const {
  std::vector<uint8_t> out;
  out.reserve(40 + 8 * remaining.size());
  put(out, kPositionMagic, 4);
  put(out, kPositionVersion, 4);
  put(out, epoch, 8);
  put(out, datasetSize, 8);
  put(out, seed, 8);
  put(out, numReplicas, 4);
  put(out, remaining.size(), 8);
  for (uint64_t i : remaining) {
    put(out, i, 8);
  }
  return out;
}

Result<ElasticPosition> ElasticPosition::parse(std::span<const uint8_t> bytes) {
  constexpr size_t kHeader = 44;
  if (bytes.size() < kHeader || get(bytes, 0, 4) != kPositionMagic) {
    return BAGUA_ERROR(kInvalidArgument,
                       "not an elastic data position (%zu bytes, bad magic or too short)",
                       bytes.size());
  }
  if (get(bytes, 4, 4) != kPositionVersion) {
    return BAGUA_ERROR(kInvalidArgument,
                       "elastic data position of version %llu; this build reads %u",
                       static_cast<unsigned long long>(get(bytes, 4, 4)), kPositionVersion);
  }
  ElasticPosition p;
  p.epoch = get(bytes, 8, 8);
  p.datasetSize = get(bytes, 16, 8);
  p.seed = get(bytes, 24, 8);
  p.numReplicas = static_cast<uint32_t>(get(bytes, 32, 4));
  const uint64_t count = get(bytes, 36, 8);
  if (count > (bytes.size() - kHeader) / 8 || bytes.size() != kHeader + 8 * count) {
    return BAGUA_ERROR(kInvalidArgument,
                       "elastic data position is truncated or has trailing bytes: %zu bytes for "
                       "%llu samples (expected %llu)",
                       bytes.size(), static_cast<unsigned long long>(count),
                       static_cast<unsigned long long>(kHeader + 8 * count));
  }
  p.remaining.resize(count);
  for (size_t i = 0; i < count; ++i) {
    p.remaining[i] = get(bytes, kHeader + 8 * i, 8);
  }
  return p;
}

Result<std::unique_ptr<ElasticBatchPlan>> ElasticBatchPlan::create(size_t datasetSize,
                                                                   ElasticPlanOptions options) {
  if (datasetSize == 0) {
    return BAGUA_ERROR(kInvalidArgument, "the dataset is empty; an elastic plan needs samples");
  }
  if (options.numReplicas < 1) {
    return BAGUA_ERROR(kInvalidArgument, "numReplicas is %d; it must be at least 1",
                       options.numReplicas);
  }
  if (options.rank < 0 || options.rank >= options.numReplicas) {
    return BAGUA_ERROR(kInvalidArgument, "rank %d is outside [0, %d)", options.rank,
                       options.numReplicas);
  }
  if (options.batchSize == 0) {
    return BAGUA_ERROR(kInvalidArgument, "batch size is 0; it must be at least 1");
  }
  if (!(options.randomLevel >= 0.0 && options.randomLevel <= 1.0)) {
    return BAGUA_ERROR(kInvalidArgument, "randomLevel is %g; it must be in [0, 1]",
                       options.randomLevel);
  }
  std::unique_ptr<ElasticBatchPlan> plan(new ElasticBatchPlan(datasetSize, std::move(options)));
  const ElasticPlanOptions& o = plan->options_;
  if (!o.complexities.empty()) {
    if (o.complexities.size() != datasetSize) {
      return BAGUA_ERROR(kInvalidArgument, "%zu complexities for a dataset of %zu samples",
                         o.complexities.size(), datasetSize);
    }
    LoadBalancingOptions lb;
    lb.numReplicas = o.numReplicas;
    lb.rank = o.rank;
    lb.shuffle = o.shuffle;
    lb.seed = o.seed;
    lb.randomLevel = o.randomLevel;
    // Validates the complexities (range) and gives the noise range; its order serves fresh
    // epochs when R divides N (no padding then).
    BAGUA_ASSIGN_OR_RETURN(plan->balanced_,
                           LoadBalancingDistributedSampler::create(o.complexities, lb));
    plan->noiseRange_ = plan->balanced_->noiseRange();
    if (datasetSize % static_cast<size_t>(o.numReplicas) != 0) {
      plan->balanced_.reset();
    }
  }
  return plan;
}

std::vector<size_t> ElasticBatchPlan::fullOrder(uint64_t epoch) {
  if (balanced_) {
    balanced_->setEpoch(epoch);
    return balanced_->order();
  }
  std::vector<size_t> all(datasetSize_);
  std::iota(all.begin(), all.end(), size_t{0});
  if (!options_.complexities.empty()) {
    return rebalanced(std::move(all), epoch, kTagFull);
  }
  if (options_.shuffle) {
    Rng rng(epochSeed(options_.seed, epoch));
    rng.shuffle(all);
  }
  return all;
}

std::vector<size_t> ElasticBatchPlan::rebalanced(std::vector<size_t> samples, uint64_t epoch,
                                                 uint64_t tag) const {
  if (options_.complexities.empty()) {
    return samples;
  }
  const size_t r = static_cast<size_t>(options_.numReplicas);
  Rng rng(splitMix64(epochSeed(options_.seed, epoch) ^ splitMix64(tag ^ samples.size())));
  // Noisy keys drawn in the samples' order, then a stable sort by key (ties keep that order).
  std::vector<std::pair<int64_t, size_t>> keyed(samples.size());
  for (size_t k = 0; k < samples.size(); ++k) {
    int64_t noise = 0;
    if (options_.shuffle && noiseRange_ > 1) {
      noise = static_cast<int64_t>(rng.uniformInt(static_cast<uint64_t>(noiseRange_)));
    }
    keyed[k] = {options_.complexities[samples[k]] + noise, samples[k]};
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  // Runs of R neighbours, shuffled; a short run stays last so that every step's block starts
  // at a run's beginning.
  const size_t fullRuns = keyed.size() / r;
  std::vector<size_t> runOrder(fullRuns);
  std::iota(runOrder.begin(), runOrder.end(), size_t{0});
  if (options_.shuffle) {
    rng.shuffle(runOrder);
  }
  std::vector<size_t> out;
  out.reserve(keyed.size());
  for (size_t run : runOrder) {
    for (size_t k = 0; k < r; ++k) {
      out.push_back(keyed[run * r + k].second);
    }
  }
  for (size_t k = fullRuns * r; k < keyed.size(); ++k) {
    out.push_back(keyed[k].second);
  }
  return out;
}

Result<Batches> ElasticBatchPlan::batchesForEpoch(uint64_t epoch) {
  if (resumed_ && resumed_->epoch == epoch) {
    std::vector<size_t> rest(resumed_->remaining.begin(), resumed_->remaining.end());
    segment_ = rebalanced(std::move(rest), epoch, kTagResumed);
  } else {
    segment_ = fullOrder(epoch);
  }
  resumed_.reset();
  planned_ = true;
  epoch_ = epoch;
  const size_t block = static_cast<size_t>(options_.numReplicas) * options_.batchSize;
  const size_t n = segment_.size();
  steps_.clear();
  for (size_t lo = 0; lo < n; lo += block) {
    steps_.emplace_back(lo, std::min(n, lo + block));
  }
  if (steps_.size() >= 2 &&
      steps_.back().second - steps_.back().first < static_cast<size_t>(options_.numReplicas)) {
    // A tail shorter than the world joins the step before.
    steps_[steps_.size() - 2].second = n;
    steps_.pop_back();
  }
  Batches out;
  out.reserve(steps_.size());
  for (size_t s = 0; s < steps_.size(); ++s) {
    out.push_back(batchOf(options_.rank, s));
  }
  return out;
}

std::vector<size_t> ElasticBatchPlan::batchOf(int rank, size_t step) const {
  std::vector<size_t> batch;
  if (step >= steps_.size() || rank < 0 || rank >= options_.numReplicas) {
    return batch;
  }
  const auto [lo, hi] = steps_[step];
  for (size_t i = lo + static_cast<size_t>(rank); i < hi;
       i += static_cast<size_t>(options_.numReplicas)) {
    batch.push_back(segment_[i]);
  }
  return batch;
}

Result<ElasticPosition> ElasticBatchPlan::position(size_t batchesConsumed) const {
  if (!planned_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "no epoch planned yet: call batchesForEpoch() (DataLoader::startEpoch) "
                       "before asking for the data position");
  }
  if (batchesConsumed > steps_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "%zu batches consumed, but epoch %llu's segment has %zu",
                       batchesConsumed, static_cast<unsigned long long>(epoch_), steps_.size());
  }
  ElasticPosition p;
  p.epoch = epoch_;
  p.datasetSize = datasetSize_;
  p.seed = options_.seed;
  p.numReplicas = static_cast<uint32_t>(options_.numReplicas);
  const size_t start = batchesConsumed == 0 ? 0 : steps_[batchesConsumed - 1].second;
  p.remaining.assign(segment_.begin() + static_cast<std::ptrdiff_t>(start), segment_.end());
  return p;
}

Status ElasticBatchPlan::resume(const ElasticPosition& position) {
  if (position.datasetSize != datasetSize_) {
    return BAGUA_ERROR(kInvalidArgument,
                       "the data position is for a dataset of %llu samples; this plan has %zu",
                       static_cast<unsigned long long>(position.datasetSize), datasetSize_);
  }
  if (position.seed != options_.seed) {
    return BAGUA_ERROR(kInvalidArgument,
                       "the data position was saved with seed %llu; this plan uses %llu",
                       static_cast<unsigned long long>(position.seed),
                       static_cast<unsigned long long>(options_.seed));
  }
  std::vector<bool> seen(datasetSize_, false);
  for (uint64_t i : position.remaining) {
    if (i >= datasetSize_) {
      return BAGUA_ERROR(kInvalidArgument,
                         "the data position names sample %llu of a dataset of %zu",
                         static_cast<unsigned long long>(i), datasetSize_);
    }
    if (seen[i]) {
      return BAGUA_ERROR(kInvalidArgument, "the data position names sample %llu twice",
                         static_cast<unsigned long long>(i));
    }
    seen[i] = true;
  }
  resumed_ = position;
  return Status::ok();
}

}  // namespace bagua::loader
