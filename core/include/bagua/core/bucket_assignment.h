// Bucket assignment: which communicated tensors share a bucket. PyTorch DDP's
// compute_bucket_assignment_by_size, in the two forms the reducer uses: on registration order
// (the initial buckets) and on an observed order (the one-time rebuild from the order in which
// gradients became ready).
//
// Contract: pure functions of their arguments (no state, no I/O, any thread). They return
// positions into `tensors`, every position of the walked order exactly once, grouped into
// buckets of one (dtype, device) each. A position outside [0, tensors.size()) in `order` is a
// caller bug (undefined behaviour), not an error.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bagua/core/types.h"

namespace bagua::core {

// A communicated tensor: the "effective tensor" of a parameter (its gradient by default).
struct TensorRef {
  std::string name;
  int paramIndex = -1;  // index in DistributedDataParallel::parameters()
  size_t numel = 0;
  DataType dtype = DataType::kF32;
  Device device;
  size_t bytes() const { return numel * dataTypeSize(dtype); }
};

struct BucketOptions {
  size_t firstBucketBytes = 1 << 20;
  size_t bucketCapBytes = 25 << 20;
};

// A model whose gradients fit in the first bucket would be reduced in one collective after its
// whole backward pass, with nothing to overlap. For a model of `totalBytes` smaller than
// kMinBuckets first buckets, both limits come down to a kMinBuckets-th of it (at least
// kMinBucketBytes), so its first gradients are on the wire while the rest are computed; larger
// models keep `options` as they are.
inline constexpr size_t kMinBuckets = 4;
inline constexpr size_t kMinBucketBytes = 64 << 10;
BucketOptions limitsForModel(const BucketOptions& options, size_t totalBytes);

// PyTorch DDP's compute_bucket_assignment_by_size: groups by (dtype, device) in the given
// order; a bucket closes once its bytes reach the current limit; the limits advance per key
// (limits[0] for the first bucket, then limits[1], ...); leftovers close at the end; buckets
// are sorted by their smallest tensor position. Returns positions into `tensors`.
std::vector<std::vector<int>> computeBucketAssignmentBySize(const std::vector<TensorRef>& tensors,
                                                            const std::vector<size_t>& limits);

// The same grouping over the tensors taken in `order` (positions into `tensors`), with the
// buckets kept in the order they closed: DDP does not sort when it is given tensor indices, as in
// its rebuild from the gradient-ready order. The reducer's rebuild and the default
// AlgorithmImpl::tensorsToBuckets use it.
std::vector<std::vector<int>> computeBucketAssignmentInOrder(const std::vector<TensorRef>& tensors,
                                                             const std::vector<int>& order,
                                                             const std::vector<size_t>& limits);

}  // namespace bagua::core
