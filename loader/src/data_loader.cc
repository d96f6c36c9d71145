#include "bagua/loader/data_loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "bagua/base/logging.h"
#include "bagua/base/thread.h"
#include "bagua/loader/params.h"

namespace bagua::loader {
namespace {

// Workers re-check their stop token at least this often even without a notification.
constexpr auto kWorkerPoll = std::chrono::milliseconds(500);

// An API option beats the environment, which beats the default.
template <typename O, typename T>
Result<T> optionOrParam(const std::optional<O>& option, Param<T>& param) {
  if (option.has_value()) {
    return static_cast<T>(*option);
  }
  return param.get();
}

// Pinned allocation is slow (page faults, a system call, for CUDA a driver call), so freed
// batch buffers are kept for reuse. One process-wide cache, never destroyed, so a Batch may
// outlive the loader that made it and several loaders share the cached blocks.
HostAllocator& pinnedBatchAllocator() {
  static auto* caching = new CachingHostAllocator(pinnedHostAllocator(), size_t{1} << 30);
  return *caching;
}

}  // namespace

// --- Collate functions ------------------------------------------------------------------------

CollateFn concatCollate() {
  return [](std::span<const Sample> samples, HostAllocator& allocator, Batch& batch) -> Status {
    size_t total = 0;
    for (const Sample& s : samples) {
      total += s.size();
    }
    BAGUA_ASSIGN_OR_RETURN(batch.data, HostBuffer::allocate(allocator, total));
    batch.offsets.resize(samples.size() + 1);
    size_t at = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      batch.offsets[i] = at;
      if (!samples[i].empty()) {
        std::memcpy(batch.data.data() + at, samples[i].data(), samples[i].size());
      }
      at += samples[i].size();
    }
    batch.offsets[samples.size()] = at;
    return Status::ok();
  };
}

CollateFn padCollate(uint8_t pad) {
  return [pad](std::span<const Sample> samples, HostAllocator& allocator, Batch& batch) -> Status {
    size_t width = 0;
    for (const Sample& s : samples) {
      width = std::max(width, s.size());
    }
    BAGUA_ASSIGN_OR_RETURN(batch.data, HostBuffer::allocate(allocator, width * samples.size()));
    batch.offsets.resize(samples.size() + 1);
    for (size_t i = 0; i < samples.size(); ++i) {
      uint8_t* row = batch.data.data() + i * width;
      if (!samples[i].empty()) {
        std::memcpy(row, samples[i].data(), samples[i].size());
      }
      std::memset(row + samples[i].size(), pad, width - samples[i].size());
      batch.offsets[i] = samples[i].size();
    }
    batch.offsets[samples.size()] = width;
    return Status::ok();
  };
}

// --- DataLoader -------------------------------------------------------------------------------

DataLoader::DataLoader(const Dataset& dataset, BatchPlan& plan, CollateFn collate)
    : dataset_(dataset), plan_(plan), collate_(std::move(collate)) {}

Result<std::unique_ptr<DataLoader>> DataLoader::create(const Dataset& dataset, BatchPlan& plan,
                                                       CollateFn collate, LoaderOptions options) {
  if (!collate) {
    return BAGUA_ERROR(kInvalidArgument, "the collate function is empty (use concatCollate())");
  }
  if (dataset.size() == 0) {
    return BAGUA_ERROR(kInvalidArgument, "the dataset is empty: nothing to load");
  }
  std::unique_ptr<DataLoader> l(new DataLoader(dataset, plan, std::move(collate)));

  int64_t workers = 0;
  BAGUA_ASSIGN_OR_RETURN(workers, optionOrParam(options.numWorkers, loaderParams().numWorkers));
  if (workers < 0 || workers > 256) {
    return BAGUA_ERROR(kInvalidArgument, "numWorkers is %lld; it must be in [0, 256]",
                       static_cast<long long>(workers));
  }
  int64_t prefetch = 0;
  BAGUA_ASSIGN_OR_RETURN(prefetch,
                         optionOrParam(options.prefetchBatches, loaderParams().prefetchBatches));
  if (prefetch < 1 || prefetch > 4096) {
    return BAGUA_ERROR(kInvalidArgument, "prefetchBatches is %lld; it must be in [1, 4096]",
                       static_cast<long long>(prefetch));
  }
  bool pin = false;
  BAGUA_ASSIGN_OR_RETURN(pin, optionOrParam(options.pinMemory, loaderParams().pinMemory));
  double timeout = 0;
  BAGUA_ASSIGN_OR_RETURN(timeout, optionOrParam(options.timeoutSeconds, loaderParams().timeout));
  if (!(timeout > 0 && timeout <= 86400.0)) {
    return BAGUA_ERROR(kInvalidArgument, "timeoutSeconds is %g; it must be in (0, 86400]", timeout);
  }
  bool progress = false;
  BAGUA_ASSIGN_OR_RETURN(progress, optionOrParam(options.progress, loaderParams().progress));

  l->numWorkers_ = static_cast<int>(workers);
  l->prefetch_ = static_cast<int>(prefetch);
  l->timeoutSeconds_ = timeout;
  l->progress_ = progress;
  l->progressOut_ = options.progressOut != nullptr ? options.progressOut : stderr;
  l->progressOptions_ = options.progressOptions;
  if (options.allocator != nullptr) {
    l->allocator_ = options.allocator;
  } else if (pin) {
    l->allocator_ = &pinnedBatchAllocator();
  } else {
    l->allocator_ = &defaultHostAllocator();
  }
  l->ring_.resize(static_cast<size_t>(l->prefetch_));
  for (int i = 0; i < l->numWorkers_; ++i) {
    l->workers_.emplace_back([raw = l.get(), i](std::stop_token st) { raw->workerLoop(st, i); });
  }
  BAGUA_LOG_INFO(kLogLoader, "data loader: %d workers, prefetch %d batches, %s memory",
                 l->numWorkers_, l->prefetch_, l->allocator_->name());
  return l;
}

DataLoader::~DataLoader() {
  for (std::jthread& w : workers_) {
    w.request_stop();
  }
  workCv_.notify_all();
  for (std::jthread& w : workers_) {
    if (w.joinable()) {
      w.join();
    }
  }
  ring_.clear();
}

Status DataLoader::startEpoch(uint64_t epoch, size_t firstBatch) {
  Result<Batches> b = plan_.batchesForEpoch(epoch);
  if (!b.isOk()) {
    Status s = b.takeStatus();
    s.withContext(strPrintf("batch plan for epoch %llu", static_cast<unsigned long long>(epoch)));
    return std::move(s.addFrame(__FILE__, __LINE__));
  }
  if (firstBatch > b->size()) {
    return BAGUA_ERROR(kInvalidArgument,
                       "startEpoch: resuming epoch %llu at batch %zu, but it has %zu batches (a "
                       "position saved with another plan, dataset or world size?)",
                       static_cast<unsigned long long>(epoch), firstBatch, b->size());
  }
  uint64_t samples = 0;
  for (size_t k = firstBatch; k < b->size(); ++k) {
    samples += (*b)[k].size();
  }
  // Batches of the abandoned epoch are freed after unlocking: no allocator call under mu_.
  std::vector<std::optional<Result<Batch>>> abandoned(ring_.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    epoch_ = epoch;
    ++generation_;
    batches_ = std::move(*b);
    nextClaim_ = firstBatch;
    nextConsume_ = firstBatch;
    ring_.swap(abandoned);
  }
  workCv_.notify_all();
  meter_.reset();
  meter_ = std::make_unique<ProgressMeter>(
      progress_ ? progressOut_ : nullptr,
      strPrintf("epoch %llu", static_cast<unsigned long long>(epoch)), samples, progressOptions_);
  return Status::ok();
}

LoaderPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {epoch_, nextConsume_};
}

size_t DataLoader::numBatches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_.size();
}

double DataLoader::samplesPerSecond() const {
  return meter_ ? meter_->rate() : 0.0;
}

Result<Batch> DataLoader::loadBatch(uint64_t epoch, size_t step, const std::vector<size_t>& indices,
                                    std::vector<Sample>& scratch) {
  if (scratch.size() < indices.size()) {
    scratch.resize(indices.size());
  }
  for (size_t i = 0; i < indices.size(); ++i) {
    Status s = dataset_.get(indices[i], scratch[i]);
    if (!s.isOk()) {
      s.withContext(strPrintf("epoch %llu batch %zu: reading sample %zu",
                              static_cast<unsigned long long>(epoch), step, indices[i]));
      return std::move(s.addFrame(__FILE__, __LINE__));
    }
  }
  Batch batch;
  batch.epoch = epoch;
  batch.step = step;
  batch.indices = indices;
  Status s = collate_(std::span<const Sample>(scratch.data(), indices.size()), *allocator_, batch);
  if (!s.isOk()) {
    s.withContext(strPrintf("epoch %llu batch %zu: collate of %zu samples",
                            static_cast<unsigned long long>(epoch), step, indices.size()));
    return std::move(s.addFrame(__FILE__, __LINE__));
  }
  return batch;
}

void DataLoader::workerLoop(std::stop_token stop, int id) {
  setThreadName(strPrintf("bagua-loader-%d", id));
  std::vector<Sample> scratch;
  std::vector<size_t> indices;
  while (!stop.stop_requested()) {
    std::unique_lock<std::mutex> lock(mu_);
    bool ready = workCv_.wait_for(lock, stop, kWorkerPoll, [this] {
      return nextClaim_ < batches_.size() &&
             nextClaim_ < nextConsume_ + static_cast<size_t>(prefetch_);
    });
    if (!ready) {
      continue;  // poll deadline or stop; the loop condition decides
    }
    const size_t step = nextClaim_++;
    const uint64_t generation = generation_;
    const uint64_t epoch = epoch_;
    indices = batches_[step];
    lock.unlock();

    Result<Batch> batch = loadBatch(epoch, step, indices, scratch);

    lock.lock();
    if (generation != generation_) {
      lock.unlock();  // the batch is freed at the end of this iteration, outside mu_
      continue;       // startEpoch() abandoned this epoch; drop the batch
    }
    ring_[step % ring_.size()].emplace(std::move(batch));
    lock.unlock();
    readyCv_.notify_one();
  }
}

Result<std::optional<Batch>> DataLoader::next() {
  std::optional<Result<Batch>> got;
  size_t step = 0;
  if (numWorkers_ == 0) {
    uint64_t epoch = 0;
    std::vector<size_t> indices;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        return BAGUA_ERROR(kFailedPrecondition, "next() before startEpoch()");
      }
      if (nextConsume_ >= batches_.size()) {
        return std::optional<Batch>();
      }
      step = nextConsume_++;
      epoch = epoch_;
      indices = batches_[step];
    }
    got.emplace(loadBatch(epoch, step, indices, syncScratch_));
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    if (!started_) {
      return BAGUA_ERROR(kFailedPrecondition, "next() before startEpoch()");
    }
    if (nextConsume_ >= batches_.size()) {
      return std::optional<Batch>();
    }
    step = nextConsume_;
    auto& slot = ring_[step % ring_.size()];
    const auto timeout = std::chrono::duration<double>(timeoutSeconds_);
    if (!readyCv_.wait_for(lock, timeout, [&slot] { return slot.has_value(); })) {
      return BAGUA_ERROR(kDeadlineExceeded,
                         "batch %zu of epoch %llu was not ready after %.3f s (%d workers, "
                         "prefetch %d): a dataset read may be stuck; raise BAGUA_LOADER_TIMEOUT "
                         "if reads are this slow",
                         step, static_cast<unsigned long long>(epoch_), timeoutSeconds_,
                         numWorkers_, prefetch_);
    }
    got = std::move(slot);
    slot.reset();
    ++nextConsume_;
    lock.unlock();
    workCv_.notify_all();
  }
  Result<Batch>& r = *got;
  if (!r.isOk()) {
    Status s = r.takeStatus();
    return std::move(s.addFrame(__FILE__, __LINE__));
  }
  if (meter_) {
    meter_->add(r->indices.size());
    if (step + 1 == numBatches()) {
      meter_->finish();
    }
  }
  return std::optional<Batch>(std::move(*r));
}

}  // namespace bagua::loader
