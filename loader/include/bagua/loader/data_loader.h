// DataLoader: reads the batches of a BatchPlan from a Dataset with worker threads, collates them
// into host buffers and hands them out in plan order.
//
//   auto sampler = LoadBalancingDistributedSampler::create(n, complexity, opts);
//   auto plan = LoadBalancingDistributedBatchSampler::create(**sampler, costBudgetBatchFn(...),
//   false); auto loader = DataLoader::create(dataset, **plan, concatCollate(), {}); for (uint64_t
//   epoch = 0; epoch < E; ++epoch) {
//     BAGUA_RETURN_IF_ERROR((*loader)->startEpoch(epoch));
//     while (true) {
//       BAGUA_ASSIGN_OR_RETURN(std::optional<Batch> b, (*loader)->next());
//       if (!b) break;
//       train(*b);
//     }
//   }
//
// Order: batches come out in the plan's order whatever the number of workers, so the sequence
// for a given seed and epoch is deterministic. Workers claim batches in order but finish out of
// order; a ring of prefetchBatches slots puts them back in order.
//
// Bounded prefetch: a worker starts batch k only when k < (batches consumed) + prefetchBatches,
// so at most prefetchBatches batches are ready or in flight.
//
// Errors: a failing dataset get() or collate makes next() return that error for that batch
// (with the epoch, batch number and sample index as context); the following next() moves on to
// the next batch. next() fails with DeadlineExceeded if a batch is not ready within the timeout.
//
// Thread model: one consumer thread calls startEpoch()/next()/numBatches(); the loader's
// numWorkers threads ("bagua-loader-N") call Dataset::get and the collate function
// concurrently, so both must be thread-safe. One mutex (mu_) guards the epoch state and the
// ring; it is never held while reading samples or collating, nor while calling the progress
// meter. Workers wait on workCv_, the consumer on readyCv_; every wait has a deadline. The
// destructor requests stop, wakes and joins the workers (a worker finishes the batch it is
// reading first, so shutdown takes as long as one dataset read at most).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <thread>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/loader/batch_sampler.h"
#include "bagua/loader/dataset.h"
#include "bagua/loader/host_buffer.h"
#include "bagua/loader/progress.h"

namespace bagua::loader {

struct Batch {
  uint64_t epoch = 0;
  size_t step = 0;              // position in the epoch's plan
  std::vector<size_t> indices;  // dataset indices, in the plan's order
  HostBuffer data;              // the collated bytes
  // Sample i occupies [offsets[i], offsets[i+1]) of data for concatCollate; a custom collate
  // may use it differently.
  std::vector<size_t> offsets;
};

// Packs `samples` (batch.indices.size() of them) into batch.data / batch.offsets, allocating
// from `allocator`. Called concurrently from the worker threads: must be thread-safe.
using CollateFn =
    std::function<Status(std::span<const Sample> samples, HostAllocator& allocator, Batch& batch)>;

// Concatenates the samples; offsets has samples.size() + 1 entries.
CollateFn concatCollate();
// Pads every sample with `pad` to the longest one in the batch (a [batch, maxLen] byte matrix);
// offsets[i] is sample i's unpadded length, offsets.back() the row length.
CollateFn padCollate(uint8_t pad);

struct LoaderOptions {
  // Unset: from loaderParams() (BAGUA_LOADER_*), see params.h.
  std::optional<int> numWorkers;
  std::optional<int> prefetchBatches;
  std::optional<bool> pinMemory;
  std::optional<double> timeoutSeconds;
  std::optional<bool> progress;
  // Where the progress line goes (default stderr) and how.
  FILE* progressOut = nullptr;
  ProgressOptions progressOptions;
  // Overrides pinMemory's choice; borrowed, must outlive the loader and every Batch it made.
  // (The default and pinned allocators live for the whole process, so batches may outlive
  // the loader.)
  HostAllocator* allocator = nullptr;
};

struct LoaderPosition {
  uint64_t epoch = 0;
  size_t batchesConsumed = 0;
};

class DataLoader {
 public:
  // Borrows `dataset` and `plan` (both must outlive the loader). InvalidArgument for an empty
  // collate function or an invalid option / BAGUA_LOADER_* value. Starts the workers idle.
  static Result<std::unique_ptr<DataLoader>> create(const Dataset& dataset, BatchPlan& plan,
                                                    CollateFn collate, LoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Asks the plan for `epoch`'s batches and starts loading them from batch `firstBatch` (0, or
  // a saved position's batchesConsumed to resume mid-epoch; InvalidArgument past the epoch's
  // batch count). Abandons what is left of the previous epoch (in-flight batches are discarded).
  [[nodiscard]] Status startEpoch(uint64_t epoch, size_t firstBatch = 0);
  // Where the consumer is (what a checkpoint saves): the epoch and how many of its
  // batches next() has handed out. Batches prefetched but not yet taken are not counted, so a
  // resume at this position reads each of the epoch's remaining batches exactly once.
  LoaderPosition position() const;
  // The next batch in plan order; nullopt after the last one. FailedPrecondition before
  // startEpoch().
  [[nodiscard]] Result<std::optional<Batch>> next();

  size_t numBatches() const;
  int numWorkers() const { return numWorkers_; }
  int prefetchBatches() const { return prefetch_; }
  const HostAllocator& allocator() const { return *allocator_; }
  // Samples per second of the current epoch so far (from the progress meter's clock).
  double samplesPerSecond() const;

 private:
  DataLoader(const Dataset& dataset, BatchPlan& plan, CollateFn collate);
  void workerLoop(std::stop_token stop, int id);
  Result<Batch> loadBatch(uint64_t epoch, size_t step, const std::vector<size_t>& indices,
                          std::vector<Sample>& scratch);

  const Dataset& dataset_;
  BatchPlan& plan_;
  CollateFn collate_;
  int numWorkers_ = 0;
  int prefetch_ = 1;
  double timeoutSeconds_ = 0;
  HostAllocator* allocator_ = nullptr;
  bool progress_ = false;
  FILE* progressOut_ = nullptr;
  ProgressOptions progressOptions_;
  std::unique_ptr<ProgressMeter> meter_;  // consumer thread only

  mutable std::mutex mu_;
  std::condition_variable_any workCv_;              // workers: a batch can be claimed, or stop
  std::condition_variable readyCv_;                 // consumer: a slot became ready
  bool started_ = false;                            // guarded by mu_
  uint64_t epoch_ = 0;                              // guarded by mu_
  uint64_t generation_ = 0;                         // guarded by mu_; bumped by startEpoch
  Batches batches_;                                 // guarded by mu_
  size_t nextClaim_ = 0;                            // guarded by mu_
  size_t nextConsume_ = 0;                          // guarded by mu_
  std::vector<std::optional<Result<Batch>>> ring_;  // guarded by mu_; prefetch_ slots
  std::vector<Sample> syncScratch_;                 // consumer thread only (numWorkers == 0)

  std::vector<std::jthread> workers_;  // last member: joined first on destruction
};

}  // namespace bagua::loader
