#include <algorithm>
#include <cstring>
#include <map>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/compression.h"
#include "bytegrad_op.h"

namespace bagua::algo {

namespace detail {

namespace {

// The exchange on one communicator (Bagua's steps 1-6). Device steps are synced before each
// collective reads their output; a collective's Work completed before steps use its output.
Status exchange(const Exec& x, float* data, size_t numel, core::Communicator& comm,
                size_t padMultiple, bool average, std::chrono::milliseconds timeout,
                ByteGradScratch& s) {
  const size_t n = static_cast<size_t>(comm.size());
  const size_t r = static_cast<size_t>(comm.rank());
  const size_t padded = (numel + padMultiple - 1) / padMultiple * padMultiple;
  const size_t c = padded / n;
  const size_t seg = minMaxSegmentBytes(c);
  const size_t total = n * seg;
  BAGUA_RETURN_IF_ERROR(s.padded.ensure(x, padded * sizeof(float)));
  BAGUA_RETURN_IF_ERROR(s.chunks.ensure(x, padded * sizeof(float)));
  BAGUA_RETURN_IF_ERROR(s.send.ensure(x, total));
  BAGUA_RETURN_IF_ERROR(s.recv.ensure(x, total));
  float* pad = s.padded.f32();
  BAGUA_RETURN_IF_ERROR(copyBytes(x, pad, data, numel * sizeof(float)));
  BAGUA_RETURN_IF_ERROR(zeroBytes(x, pad + numel, (padded - numel) * sizeof(float)));

  // 1-2: compress every chunk with its own min/max; chunk j goes to rank j.
  BAGUA_RETURN_IF_ERROR(compress(x, pad, padded, n, s.send.u8(), total, s.workspace));
  BAGUA_RETURN_IF_ERROR(sync(x, timeout));
  BAGUA_RETURN_IF_ERROR(
      comm.allToAll(s.send.u8(), s.recv.u8(), seg, core::DataType::kU8)->wait(timeout));
  // 3: chunk j of `chunks` is sender j's version of my chunk r.
  BAGUA_RETURN_IF_ERROR(decompress(x, s.recv.u8(), total, padded, n, s.chunks.f32()));
  // 4: reduce into chunk r (float32, senders in rank order, then / n).
  BAGUA_RETURN_IF_ERROR(reduceChunks(x, s.chunks.f32(), n, c, average, pad + r * c));
  // 5-6: compress my chunk, all-gather the compressed chunks, everyone decompresses all.
  BAGUA_RETURN_IF_ERROR(
      compress(x, pad, padded, n, s.send.u8(), total, s.workspace, static_cast<int>(r)));
  BAGUA_RETURN_IF_ERROR(sync(x, timeout));
  BAGUA_RETURN_IF_ERROR(
      comm.allGather(s.send.u8() + r * seg, s.recv.u8(), seg, core::DataType::kU8)->wait(timeout));
  BAGUA_RETURN_IF_ERROR(decompress(x, s.recv.u8(), total, padded, n, pad));
  BAGUA_RETURN_IF_ERROR(copyBytes(x, data, pad, numel * sizeof(float)));
  return sync(x, timeout);
}

}  // namespace

Status byteGradAllReduce(const Exec& exec, float* data, size_t numel, core::ProcessGroup& group,
                         bool hierarchical, bool average, ByteGradScratch& scratch) {
  const auto timeout = group.options().collectiveTimeout;
  // Bagua pads every bucket to a multiple of the global size, also in hierarchical mode.
  const size_t padMultiple = static_cast<size_t>(group.size());
  if (!hierarchical) {
    return exchange(exec, data, numel, group.global(), padMultiple, average, timeout, scratch);
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
    BAGUA_RETURN_IF_ERROR(
        exchange(exec, data, numel, *inter, padMultiple, average, timeout, scratch));
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
    BAGUA_ASSIGN_OR_RETURN(detail::Exec exec, detail::execFor(bucket.device, "bytegrad"));
    scratch_.try_emplace(bucket.index);  // created here, on the trainer's thread
    exec_[bucket.index] = exec;
    return Status::ok();
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    auto it = scratch_.find(b.index);
    if (it == scratch_.end()) {
      return BAGUA_ERROR(kInternal, "bytegrad: bucket %d was not initialised", b.index);
    }
    return detail::byteGradAllReduce(exec_.at(b.index), static_cast<float*>(b.flat), b.numel, g,
                                     hierarchical_, average_, it->second);
  }
  // The decompressed average is final once a bucket is reduced (every rank holds the same
  // values): the optimizer may step it then.
  bool reducedBucketIsFinal() const override { return true; }

 private:
  bool hierarchical_;
  bool average_;
  std::map<int, detail::ByteGradScratch> scratch_;
  std::map<int, detail::Exec> exec_;
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
