// The ByteGrad communication (Bagua's centralized low-precision synchronous op), shared by
// ByteGrad and QAdam's compression stage. Private to algorithms/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/process_group.h"
#include "vec_ops.h"

namespace bagua::algo::detail {

// Per-bucket buffers on the bucket's side (host or device), sized once (no allocation on the
// data path after the first call).
struct ByteGradScratch {
  Buffer padded;  // the bucket, zero padded to a multiple of the global size
  Buffer chunks;  // the n decompressed versions of my chunk
  Buffer send;
  Buffer recv;
  Buffer workspace;  // the device compression kernel's partial min/max
};

// In place on data[0..numel): every rank ends with D(C(reduce_j D(C(chunk_r of rank j))))
// for every chunk, bitwise identical on all ranks. average: mean, else sum. hierarchical:
// intra-node reduce to the leader, the exchange among leaders, intra-node broadcast.
// `exec` says where data lives (device: NCCL communicators and the CUDA kernels).
Status byteGradAllReduce(const Exec& exec, float* data, size_t numel, core::ProcessGroup& group,
                         bool hierarchical, bool average, ByteGradScratch& scratch);

}  // namespace bagua::algo::detail
