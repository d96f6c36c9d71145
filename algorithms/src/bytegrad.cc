#include <algorithm>
#include <cstring>
#include <map>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/compression.h"
#include "bytegrad_op.h"

namespace bagua::algo {

namespace detail {

namespace {

// The exchange on one communicator (Bagua's steps 1-6).
Status exchange(float* data, size_t numel, core::Communicator& comm, size_t padMultiple,
                bool average, std::chrono::milliseconds timeout, ByteGradScratch& s) {
  const size_t n = static_cast<size_t>(comm.size());
  const size_t r = static_cast<size_t>(comm.rank());
  const size_t padded = (numel + padMultiple - 1) / padMultiple * padMultiple;
  const size_t c = padded / n;
  const size_t seg = minMaxSegmentBytes(c);
  s.padded.resize(padded);
  s.chunks.resize(padded);
  s.send.resize(n * seg);
  s.recv.resize(n * seg);
  std::memcpy(s.padded.data(), data, numel * sizeof(float));
  std::fill(s.padded.begin() + static_cast<ptrdiff_t>(numel), s.padded.end(), 0.0f);

  // 1-2: compress every chunk with its own min/max; chunk j goes to rank j.
  BAGUA_RETURN_IF_ERROR(minMaxCompress(s.padded.data(), padded, n, s.send.data(), s.send.size()));
  BAGUA_RETURN_IF_ERROR(
      comm.allToAll(s.send.data(), s.recv.data(), seg, core::DataType::kU8)->wait(timeout));
  // 3: chunk j of `chunks` is sender j's version of my chunk r.
  BAGUA_RETURN_IF_ERROR(minMaxDecompress(s.recv.data(), s.recv.size(), padded, n, s.chunks.data()));
  // 4: reduce into chunk r (float32, senders in rank order).
  float* mine = s.padded.data() + r * c;
  std::memcpy(mine, s.chunks.data(), c * sizeof(float));
  for (size_t j = 1; j < n; ++j) {
    const float* other = s.chunks.data() + j * c;
    for (size_t i = 0; i < c; ++i) {
      mine[i] += other[i];
    }
  }
  if (average) {
    const float fn = static_cast<float>(n);
    for (size_t i = 0; i < c; ++i) {
      mine[i] /= fn;
    }
  }
  // 5-6: compress my chunk, all-gather the compressed chunks, everyone decompresses all.
  BAGUA_RETURN_IF_ERROR(minMaxCompress(s.padded.data(), padded, n, s.send.data(), s.send.size(),
                                       static_cast<int>(r)));
  BAGUA_RETURN_IF_ERROR(
      comm.allGather(s.send.data() + r * seg, s.recv.data(), seg, core::DataType::kU8)
          ->wait(timeout));
  BAGUA_RETURN_IF_ERROR(minMaxDecompress(s.recv.data(), s.recv.size(), padded, n, s.padded.data()));
  std::memcpy(data, s.padded.data(), numel * sizeof(float));
  return Status::ok();
}

}  // namespace

Status byteGradAllReduce(float* data, size_t numel, core::ProcessGroup& group, bool hierarchical,
                         bool average, ByteGradScratch& scratch) {
  const auto timeout = group.options().collectiveTimeout;
  // Bagua pads every bucket to a multiple of the global size, also in hierarchical mode.
  const size_t padMultiple = static_cast<size_t>(group.size());
  if (!hierarchical) {
    return exchange(data, numel, group.global(), padMultiple, average, timeout, scratch);
  }
  core::Communicator* intra = group.intraNode();
  core::Communicator* inter = group.interNode();
  if (intra == nullptr || inter == nullptr) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "bytegrad(hierarchical=true) needs a process group with hierarchical "
                       "sub-groups");
  }
  const core::ReduceOp op = average ? core::ReduceOp::kAvg : core::ReduceOp::kSum;
  BAGUA_RETURN_IF_ERROR(
      intra->reduce(data, data, numel, core::DataType::kF32, op, 0)->wait(timeout));
  if (intra->rank() == 0) {
    BAGUA_RETURN_IF_ERROR(exchange(data, numel, *inter, padMultiple, average, timeout, scratch));
  }
  return intra->broadcast(data, numel, core::DataType::kF32, 0)->wait(timeout);
}

}  // namespace detail

namespace {

class ByteGradImpl final : public core::AlgorithmImpl {
 public:
  ByteGradImpl(bool hierarchical, bool average) : hierarchical_(hierarchical), average_(average) {}

  Status initOperations(core::Bucket& bucket) override {
    if (bucket.dtype != core::DataType::kF32) {
      return BAGUA_ERROR(kInvalidArgument,
                         "bytegrad: bucket %d holds %s; MinMaxUInt8 compression is implemented "
                         "for f32 only",
                         bucket.index, core::dataTypeName(bucket.dtype));
    }
    scratch_.try_emplace(bucket.index);  // created here, on the trainer's thread
    return Status::ok();
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    auto it = scratch_.find(b.index);
    if (it == scratch_.end()) {
      return BAGUA_ERROR(kInternal, "bytegrad: bucket %d was not initialised", b.index);
    }
    return detail::byteGradAllReduce(static_cast<float*>(b.flat), b.numel, g, hierarchical_,
                                     average_, it->second);
  }

 private:
  bool hierarchical_;
  bool average_;
  std::map<int, detail::ByteGradScratch> scratch_;
};

}  // namespace

Result<std::unique_ptr<core::AlgorithmImpl>> ByteGrad::reify(core::ProcessGroup& group) {
  if (hierarchical_ && group.intraNode() == nullptr) {
    return BAGUA_ERROR(kInvalidArgument,
                       "bytegrad(hierarchical=true) needs a process group created with "
                       "hierarchical sub-groups (ProcessGroupOptions::hierarchical), or pass "
                       "hierarchical=false");
  }
  return std::unique_ptr<core::AlgorithmImpl>(new ByteGradImpl(hierarchical_, average_));
}

}  // namespace bagua::algo
