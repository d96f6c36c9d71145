// The ByteGrad communication (Bagua's centralized low-precision synchronous op), shared by
// ByteGrad and QAdam's compression stage. Private to algorithms/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/process_group.h"

namespace bagua::algo::detail {

// Per-bucket buffers, sized once (no allocation on the data path after the first call).
struct ByteGradScratch {
  std::vector<float> padded;  // the bucket, zero padded to a multiple of the global size
  std::vector<float> chunks;  // the n decompressed versions of my chunk
  std::vector<uint8_t> send;
  std::vector<uint8_t> recv;
};

// In place on data[0..numel): every rank ends with D(C(reduce_j D(C(chunk_r of rank j))))
// for every chunk, bitwise identical on all ranks. average: mean, else sum. hierarchical:
// intra-node reduce to the leader, the exchange among leaders, intra-node broadcast.
Status byteGradAllReduce(float* data, size_t numel, core::ProcessGroup& group, bool hierarchical,
                         bool average, ByteGradScratch& scratch);

}  // namespace bagua::algo::detail
