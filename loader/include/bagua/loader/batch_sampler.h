// Batch plans: how an epoch's indices for this rank are grouped into batches.
//
// The DataLoader asks a BatchPlan for the batches of an epoch. Two plans:
//  - FixedSizeBatchPlan: consecutive groups of batchSize from any Sampler (last one partial
//    unless dropLast). All ranks read the same number of samples, so they agree on the count.
//  - LoadBalancingDistributedBatchSampler: Bagua's batch sampler (bagua_behaviour.md 5.2). A
//    user batch function splits a rank's index list into variable-size batches (e.g. up to a
//    token budget); it is run for every rank so that all ranks agree on the number of batches:
//    max over ranks (ranks with fewer pad cyclically with their own batches) or, with dropLast,
//    min over ranks (ranks with more are truncated).
//    Bagua's drop_last bug is fixed here: it computed b + b[:total - len(b)], which for a rank
//    with more batches than the total appends b[:negative] and grows the list, so ranks
//    disagreed on the number of steps (and a shortfall larger than len(b) stayed short). We
//    truncate to the total and pad cyclically, so every rank yields exactly numBatches().
//
// Thread safety: not synchronised; call batchesForEpoch()/setEpoch() from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/loader/sampler.h"

namespace bagua::loader {

using Batches = std::vector<std::vector<size_t>>;

class BatchPlan {
 public:
  BatchPlan() = default;
  BatchPlan(const BatchPlan&) = delete;
  BatchPlan& operator=(const BatchPlan&) = delete;
  virtual ~BatchPlan() = default;

  // This rank's batches for `epoch` (reorders the underlying sampler). Every batch is
  // non-empty; every rank gets the same number of batches.
  virtual Result<Batches> batchesForEpoch(uint64_t epoch) = 0;
};

class FixedSizeBatchPlan final : public BatchPlan {
 public:
  // Borrows `sampler`, which must outlive the plan. InvalidArgument for batchSize 0.
  static Result<std::unique_ptr<FixedSizeBatchPlan>> create(Sampler& sampler, size_t batchSize,
                                                            bool dropLast);
  Result<Batches> batchesForEpoch(uint64_t epoch) override;

 private:
  FixedSizeBatchPlan(Sampler& sampler, size_t batchSize, bool dropLast)
      : sampler_(sampler), batchSize_(batchSize), dropLast_(dropLast) {}
  Sampler& sampler_;
  size_t batchSize_;
  bool dropLast_;
};

// Splits one rank's ordered index list into batches. Must be deterministic (it runs for every
// rank on every rank), return non-empty batches, and use only indices from its input.
using BatchFn = std::function<Result<Batches>(const std::vector<size_t>& indices)>;

// Consecutive groups of `batchSize` (the last one partial).
BatchFn fixedSizeBatchFn(size_t batchSize);
// Consecutive groups whose total cost stays within `budget` (a batch holds at least one sample,
// so a single sample above the budget forms its own batch). `cost` must outlive the function.
BatchFn costBudgetBatchFn(const std::vector<int64_t>& cost, int64_t budget);

class LoadBalancingDistributedBatchSampler final : public BatchPlan {
 public:
  // Borrows `sampler` (must outlive this object). Like Bagua, the sampler must not use
  // drop_last (FailedPrecondition otherwise): its padding is what keeps per-rank lists equal.
  // Generates the batches of the sampler's current epoch; errors of batchFn are returned with
  // the rank as context; a rank left with no batch while others have some is an error.
  static Result<std::unique_ptr<LoadBalancingDistributedBatchSampler>> create(
      LoadBalancingDistributedSampler& sampler, BatchFn batchFn, bool dropLast);

  // Reorders the sampler and regenerates the batches of every rank.
  Status setEpoch(uint64_t epoch);
  Result<Batches> batchesForEpoch(uint64_t epoch) override;

  // Batches per rank this epoch (identical on every rank).
  size_t numBatches() const { return total_; }
  // This rank's batches.
  const Batches& batches() const { return perRank_[static_cast<size_t>(sampler_.rank())]; }
  // Any rank's batches (rank in [0, numReplicas)).
  const Batches& batchesOf(int rank) const { return perRank_.at(static_cast<size_t>(rank)); }

 private:
  LoadBalancingDistributedBatchSampler(LoadBalancingDistributedSampler& sampler, BatchFn batchFn,
                                       bool dropLast)
      : sampler_(sampler), batchFn_(std::move(batchFn)), dropLast_(dropLast) {}
  Status generate();

  LoadBalancingDistributedSampler& sampler_;
  BatchFn batchFn_;
  bool dropLast_;
  size_t total_ = 0;
  std::vector<Batches> perRank_;
};

}  // namespace bagua::loader
