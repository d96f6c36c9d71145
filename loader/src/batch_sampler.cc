#include "bagua/loader/batch_sampler.h"

#include <algorithm>

namespace bagua::loader {

// --- FixedSizeBatchPlan -------------------------------------------------------------------------

Result<std::unique_ptr<FixedSizeBatchPlan>> FixedSizeBatchPlan::create(Sampler& sampler,
                                                                       size_t batchSize,
                                                                       bool dropLast) {
  if (batchSize == 0) {
    return BAGUA_ERROR(kInvalidArgument, "batch size is 0; it must be at least 1");
  }
  if (dropLast && sampler.numSamples() < batchSize) {
    return BAGUA_ERROR(kInvalidArgument,
                       "drop_last with batch size %zu leaves no batch: each rank reads only %zu "
                       "samples per epoch",
                       batchSize, sampler.numSamples());
  }
  return std::unique_ptr<FixedSizeBatchPlan>(new FixedSizeBatchPlan(sampler, batchSize, dropLast));
}

Result<Batches> FixedSizeBatchPlan::batchesForEpoch(uint64_t epoch) {
  sampler_.setEpoch(epoch);
  std::vector<size_t> idx = sampler_.indices();
  Batches out;
  for (size_t begin = 0; begin < idx.size(); begin += batchSize_) {
    size_t end = std::min(idx.size(), begin + batchSize_);
    if (dropLast_ && end - begin < batchSize_) {
      break;
    }
    out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(begin),
                     idx.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

// --- Batch functions
// ------------------------------------------------------------------------------

BatchFn fixedSizeBatchFn(size_t batchSize) {
  return [batchSize](const std::vector<size_t>& idx) -> Result<Batches> {
    if (batchSize == 0) {
      return BAGUA_ERROR(kInvalidArgument, "batch size is 0; it must be at least 1");
    }
    Batches out;
    for (size_t begin = 0; begin < idx.size(); begin += batchSize) {
      size_t end = std::min(idx.size(), begin + batchSize);
      out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(begin),
                       idx.begin() + static_cast<std::ptrdiff_t>(end));
    }
    return out;
  };
}

BatchFn costBudgetBatchFn(const std::vector<int64_t>& cost, int64_t budget) {
  return [&cost, budget](const std::vector<size_t>& idx) -> Result<Batches> {
    if (budget <= 0) {
      return BAGUA_ERROR(kInvalidArgument, "cost budget is %lld; it must be positive",
                         static_cast<long long>(budget));
    }
    Batches out;
    std::vector<size_t> cur;
    int64_t sum = 0;
    for (size_t i : idx) {
      if (i >= cost.size()) {
        return BAGUA_ERROR(kInvalidArgument, "index %zu has no cost (the cost table has %zu)", i,
                           cost.size());
      }
      if (!cur.empty() && sum + cost[i] > budget) {
        out.push_back(std::move(cur));
        cur.clear();
        sum = 0;
      }
      cur.push_back(i);
      sum += cost[i];
    }
    if (!cur.empty()) {
      out.push_back(std::move(cur));
    }
    return out;
  };
}

// --- LoadBalancingDistributedBatchSampler -------------------------------------------------------

Result<std::unique_ptr<LoadBalancingDistributedBatchSampler>>
LoadBalancingDistributedBatchSampler::create(LoadBalancingDistributedSampler& sampler,
                                             BatchFn batchFn, bool dropLast) {
  if (sampler.options().dropLast) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "the sampler uses drop_last; the batch sampler needs a sampler with "
                       "drop_last=false (set drop_last on the batch sampler instead)");
  }
  if (!batchFn) {
    return BAGUA_ERROR(kInvalidArgument, "the batch function is empty");
  }
  std::unique_ptr<LoadBalancingDistributedBatchSampler> b(
      new LoadBalancingDistributedBatchSampler(sampler, std::move(batchFn), dropLast));
  BAGUA_RETURN_IF_ERROR(b->generate());
  return b;
}

Status LoadBalancingDistributedBatchSampler::setEpoch(uint64_t epoch) {
  sampler_.setEpoch(epoch);
  return generate();
}

Result<Batches> LoadBalancingDistributedBatchSampler::batchesForEpoch(uint64_t epoch) {
  BAGUA_RETURN_IF_ERROR(setEpoch(epoch));
  return batches();
}

Status LoadBalancingDistributedBatchSampler::generate() {
  const int replicas = sampler_.numReplicas();
  std::vector<Batches> all(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    std::vector<size_t> idx = sampler_.indicesOf(r);
    Result<Batches> b = batchFn_(idx);
    if (!b.isOk()) {
      Status s = b.takeStatus();
      s.withContext(strPrintf("batch function failed for rank %d (%zu samples, epoch %llu)", r,
                              idx.size(), static_cast<unsigned long long>(sampler_.epoch())));
      return std::move(s.addFrame(__FILE__, __LINE__));
    }
    // Check the function's contract: non-empty batches of indices from its input.
    std::vector<size_t> sortedIdx = idx;
    std::sort(sortedIdx.begin(), sortedIdx.end());
    for (size_t k = 0; k < b->size(); ++k) {
      const std::vector<size_t>& batch = (*b)[k];
      if (batch.empty()) {
        return BAGUA_ERROR(kInvalidArgument,
                           "batch function returned an empty batch %zu for rank %d", k, r);
      }
      for (size_t i : batch) {
        if (!std::binary_search(sortedIdx.begin(), sortedIdx.end(), i)) {
          return BAGUA_ERROR(kInvalidArgument,
                             "batch function put index %zu in batch %zu of rank %d, but that "
                             "rank was not given it",
                             i, k, r);
        }
      }
    }
    all[static_cast<size_t>(r)] = std::move(*b);
  }
  size_t total = all[0].size();
  for (const Batches& b : all) {
    total = dropLast_ ? std::min(total, b.size()) : std::max(total, b.size());
  }
  for (int r = 0; r < replicas; ++r) {
    Batches& b = all[static_cast<size_t>(r)];
    if (b.size() > total) {
      b.resize(total);  // the fix: truncate, never grow
    } else if (b.size() < total) {
      if (b.empty()) {
        return BAGUA_ERROR(kInvalidArgument,
                           "rank %d got no batch while others got %zu: cannot pad an empty list", r,
                           total);
      }
      const size_t have = b.size();
      b.reserve(total);  // no reallocation while copying from b itself
      for (size_t k = have; k < total; ++k) {
        b.push_back(b[k % have]);  // cyclic padding covers any shortfall
      }
    }
  }
  perRank_ = std::move(all);
  total_ = total;
  return Status::ok();
}

}  // namespace bagua::loader
