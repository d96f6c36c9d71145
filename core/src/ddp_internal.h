// What the reducer's three files (ddp.cc: the trainer's side; ddp_buckets.cc: tensors, buckets
// and their rebuild; ddp_comm.cc: the bucket thread) share besides ddp.h's class.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "bagua/base/status.h"
#include "bagua/core/algorithm.h"

namespace bagua::core::ddp_detail {

using Clock = std::chrono::steady_clock;

// Where tensor `k` of the bucket lives in its flat storage.
inline uint8_t* slotOf(const Bucket& b, size_t k) {
  return static_cast<uint8_t*>(b.flat) + b.offsets[k] * dataTypeSize(b.dtype);
}

inline int64_t nsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

inline Status homeWithBucketViews(const std::string& param) {
  return BAGUA_ERROR(kInvalidArgument,
                     "DistributedDataParallel: '%s' has a gradient home, and "
                     "gradient_as_bucket_view moves gradients into the reducer's buckets: use one "
                     "or the other",
                     param.c_str());
}

}  // namespace bagua::core::ddp_detail
