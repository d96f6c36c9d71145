// ElasticBatchPlan: a resumable, world-size-elastic batch plan. Every sample of an
// epoch is read exactly once, across restarts and changes of the number of ranks: nothing is
// padded, nothing dropped.
//
// The plan of an epoch segment. The segment's global order G (a seeded permutation of the
// dataset, or, with complexities, a load-balancing order in which each run of R neighbours has
// similar cost) is cut into steps of R * batchSize samples; rank r reads G[lo + r], G[lo + r + R],
// ... of each step's block [lo, hi). A last block shorter than R joins the step before (a few
// ranks then read batchSize + 1 samples once), so every rank gets a non-empty batch at every step
// and all ranks run the same number of steps. Only a segment with fewer samples than ranks gives
// some ranks an empty last batch (such a rank still runs the step, with a zero gradient, so the
// collectives stay matched).
//
// Resume. position(batchesConsumed) is the epoch and the samples of the segment not consumed
// after that many steps (identical on every rank: the plan needs no communication). resume() on
// a plan of any world size makes them the next segment of that epoch, re-cut for the new R (with
// complexities: re-sorted by noisy cost and re-chunked into runs of the new R, so the balance
// holds after the change). serialize()/parse() carry a position through a checkpoint section.
//
// With complexities and R dividing the dataset size, a fresh epoch's order is exactly the
// LoadBalancingDistributedSampler's (Bagua's ordering, sampler.h); otherwise the same recipe
// without padding, its short run last.
//
// Deterministic: the order depends only on (dataset size, seed, epoch, complexities, world
// size) and, after a resume, on the saved remainder; random numbers come from loader::Rng, the
// same on every machine.
//
// Thread safety: not synchronised; call it from one thread (the DataLoader calls
// batchesForEpoch() from the thread calling startEpoch()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/sampler.h"

namespace bagua::loader {

struct ElasticPlanOptions {
  int numReplicas = 1;   // world size, >= 1
  int rank = 0;          // in [0, numReplicas)
  size_t batchSize = 1;  // samples per rank per step, >= 1
  bool shuffle = true;   // a new order every epoch (seeded by seed and epoch); false: 0, 1, 2, ...
  uint64_t seed = 0;     // must be the same on every rank
  // Optional per-sample costs in [0, LoadBalancingDistributedSampler::kMaxComplexity] (empty: no
  // load balancing); one per sample.
  std::vector<int64_t> complexities;
  double randomLevel = 0.0;  // the load-balancing noise, in [0, 1] (see sampler.h)
};

// Where an epoch stands: the samples not yet read. What a checkpoint saves.
struct ElasticPosition {
  uint64_t epoch = 0;
  uint64_t datasetSize = 0;
  uint64_t seed = 0;
  uint32_t numReplicas = 0;  // the world that saved it (informational)
  std::vector<uint64_t> remaining;

  // Little-endian, versioned; parse() refuses damaged or truncated bytes with a clear error.
  std::vector<uint8_t> serialize() const;
  static Result<ElasticPosition> parse(std::span<const uint8_t> bytes);
};

class ElasticBatchPlan final : public BatchPlan {
 public:
  // InvalidArgument naming the option for an empty dataset, numReplicas < 1, rank outside
  // [0, numReplicas), batchSize 0, a complexity count other than datasetSize or a value out of
  // range, randomLevel outside [0, 1].
  static Result<std::unique_ptr<ElasticBatchPlan>> create(size_t datasetSize,
                                                          ElasticPlanOptions options);

  // This rank's batches of `epoch`: the resumed remainder when resume() named this epoch,
  // else the whole epoch. May contain an empty batch only when the segment has fewer samples
  // than ranks (see the file comment). Same count on every rank.
  Result<Batches> batchesForEpoch(uint64_t epoch) override;

  // The data position after `batchesConsumed` steps of the last planned epoch (0 .. numSteps()).
  // FailedPrecondition before the first batchesForEpoch(); InvalidArgument past the segment's
  // steps.
  Result<ElasticPosition> position(size_t batchesConsumed) const;
  // The next batchesForEpoch(position.epoch) plans position.remaining, re-cut for this world.
  // InvalidArgument when the position is for another dataset size or seed, or names a sample
  // outside the dataset or one twice.
  Status resume(const ElasticPosition& position);

  // The current segment's global order and steps (every rank's share; for tests and tools).
  const std::vector<size_t>& segment() const { return segment_; }
  size_t numSteps() const { return steps_.size(); }
  // Rank `rank`'s batch at step `step` of the current segment.
  std::vector<size_t> batchOf(int rank, size_t step) const;

  size_t datasetSize() const { return datasetSize_; }
  const ElasticPlanOptions& options() const { return options_; }

 private:
  ElasticBatchPlan(size_t datasetSize, ElasticPlanOptions options)
      : datasetSize_(datasetSize), options_(std::move(options)) {}
  std::vector<size_t> fullOrder(uint64_t epoch);
  std::vector<size_t> rebalanced(std::vector<size_t> samples, uint64_t epoch, uint64_t tag) const;

  size_t datasetSize_;
  ElasticPlanOptions options_;
  std::unique_ptr<LoadBalancingDistributedSampler> balanced_;  // with complexities, R | N
  int64_t noiseRange_ = 1;
  std::optional<ElasticPosition> resumed_;
  bool planned_ = false;
  uint64_t epoch_ = 0;
  std::vector<size_t> segment_;
  std::vector<std::pair<size_t, size_t>> steps_;  // [lo, hi) of each step's block
};

}  // namespace bagua::loader
