// PowerSGD on the reducer's buckets (powersgd.h). Per bucket: its compressed matrices and its
// uncompressed segments (a Layout, built once per bucket layout), and the state that must
// survive a re-bucketing (the error and the warm-start Q of each matrix), which follows the
// tensors into their new buckets (Home). The step arithmetic is in powersgd_ops.cc.
#include "bagua/algorithms/powersgd.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "bagua/algorithms/algorithms.h"
#include "bagua/base/logging.h"
#include "bagua/core/ddp.h"
#include "bytegrad_op.h"
#include "powersgd_ops.h"

namespace bagua::algo {

namespace {

constexpr const char* kName = "powersgd";
// First word of the algorithm state in checkpoints ("PSGDst01").
constexpr uint64_t kStateMagic = 0x3130747344475350ull;
// ncclAvg arrived in NCCL 2.10.
constexpr int kNcclAvgVersion = 21000;

Result<bool> parseBool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "True" || v == "1") {
    return true;
  }
  if (v == "false" || v == "False" || v == "0") {
    return false;
  }
  return BAGUA_ERROR(kInvalidArgument, "powersgd: %s='%s' is not a boolean (true/false/1/0)",
                     key.c_str(), v.c_str());
}

Result<long long> parseInt(const std::string& key, const std::string& v, long long min,
                           long long max) {
  size_t used = 0;
  long long value = 0;
  bool ok = !v.empty();
  if (ok) {
    try {
      value = std::stoll(v, &used, 10);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != v.size() || value < min || value > max) {
    return BAGUA_ERROR(kInvalidArgument, "powersgd: %s='%s' is not an integer in [%lld, %lld]",
                       key.c_str(), v.c_str(), min, max);
  }
  return value;
}

Result<double> parseDouble(const std::string& key, const std::string& v) {
  size_t used = 0;
  double value = 0;
  bool ok = !v.empty();
  if (ok) {
    try {
      value = std::stod(v, &used);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != v.size() || !std::isfinite(value)) {
    return BAGUA_ERROR(kInvalidArgument, "powersgd: %s='%s' is not a finite number", key.c_str(),
                       v.c_str());
  }
  return value;
}

// A gradient seen as a matrix: the first dimension by the product of the others.
struct TensorInfo {
  std::string name;
  int paramIndex = -1;
  size_t numel = 0;
  size_t rows = 0;  // 0: not a matrix (fewer than two dimensions, or no shape given)
  size_t cols = 0;
};

// The approximation rank of a rows x cols matrix, 0 when it is not worth compressing.
int matrixRank(const PowerSgdOptions& o, size_t rows, size_t cols) {
  if (rows == 0 || cols == 0) {
    return 0;
  }
  const size_t r = std::min({static_cast<size_t>(o.rank), rows, cols});
  const double full = static_cast<double>(rows) * static_cast<double>(cols);
  const double sent = static_cast<double>(rows + cols) * static_cast<double>(r);
  return full > o.minCompressionRate * sent ? static_cast<int>(r) : 0;
}

}  // namespace

float powerSgdDraw(uint64_t seed, uint32_t key, uint64_t generation, uint64_t index) {
  return psgd::uniformDraw(seed, key, generation, index);
}

Status validatePowerSgdOptions(const PowerSgdOptions& o) {
  if (o.rank < 1) {
    return BAGUA_ERROR(kInvalidArgument,
                       "powersgd: rank=%d must be >= 1 (the rank of the low-rank approximation: "
                       "1 sends the fewest bytes; 2 or 4 if the loss falls behind all-reduce)",
                       o.rank);
  }
  if (o.startIter < 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "powersgd: start_iter=%lld must be >= 0 (steps of plain all-reduce before "
                       "compression starts)",
                       static_cast<long long>(o.startIter));
  }
  if (!std::isfinite(o.minCompressionRate) || o.minCompressionRate < 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "powersgd: min_compression_rate=%g must be a finite number >= 0 (a matrix "
                       "is compressed when rows*cols > min_compression_rate*(rows+cols)*rank)",
                       o.minCompressionRate);
  }
  if (!std::isfinite(o.orthogonalizationEpsilon) || o.orthogonalizationEpsilon < 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "powersgd: orthogonalization_epsilon=%g must be a finite number >= 0",
                       static_cast<double>(o.orthogonalizationEpsilon));
  }
  return Status::ok();
}

Result<PowerSgdOptions> parsePowerSgdArgs(const std::map<std::string, std::string>& args) {
  PowerSgdOptions o;
  static const std::vector<std::string> kKeys = {"error_feedback",
                                                 "hierarchical",
                                                 "min_compression_rate",
                                                 "orthogonalization_epsilon",
                                                 "quantize_factors",
                                                 "rank",
                                                 "seed",
                                                 "start_iter",
                                                 "warm_start"};
  for (const auto& [k, v] : args) {
    if (k == "rank") {
      BAGUA_ASSIGN_OR_RETURN(long long r, parseInt(k, v, 0, 1000000000LL));
      o.rank = static_cast<int>(r);
    } else if (k == "start_iter") {
      BAGUA_ASSIGN_OR_RETURN(long long s, parseInt(k, v, 0, std::numeric_limits<long long>::max()));
      o.startIter = s;
    } else if (k == "min_compression_rate") {
      BAGUA_ASSIGN_OR_RETURN(o.minCompressionRate, parseDouble(k, v));
    } else if (k == "error_feedback") {
      BAGUA_ASSIGN_OR_RETURN(o.errorFeedback, parseBool(k, v));
    } else if (k == "warm_start") {
      BAGUA_ASSIGN_OR_RETURN(o.warmStart, parseBool(k, v));
    } else if (k == "orthogonalization_epsilon") {
      BAGUA_ASSIGN_OR_RETURN(double e, parseDouble(k, v));
      o.orthogonalizationEpsilon = static_cast<float>(e);
    } else if (k == "seed") {
      BAGUA_ASSIGN_OR_RETURN(long long s, parseInt(k, v, 0, std::numeric_limits<long long>::max()));
      o.seed = static_cast<uint64_t>(s);
    } else if (k == "quantize_factors") {
      BAGUA_ASSIGN_OR_RETURN(o.quantizeFactors, parseBool(k, v));
    } else if (k == "hierarchical") {
      // Accepted for front ends that pass it to every algorithm (the demos); flat only.
      BAGUA_ASSIGN_OR_RETURN(bool h, parseBool(k, v));
      if (h) {
        return BAGUA_ERROR(kInvalidArgument,
                           "powersgd: hierarchical=true is not implemented (the factors are "
                           "all-reduced over the whole group); pass hierarchical=false");
      }
    } else {
      std::string list;
      for (const std::string& a : kKeys) {
        list += (list.empty() ? "" : ", ") + a;
      }
      return BAGUA_ERROR(kInvalidArgument, "powersgd: unknown parameter '%s' (accepted: %s)",
                         k.c_str(), list.c_str());
    }
  }
  BAGUA_RETURN_IF_ERROR(validatePowerSgdOptions(o));
  return o;
}

namespace {

// A bucket's buffers (on the bucket's side) and layout.
struct BucketState {
  detail::Exec exec;
  detail::psgd::Layout layout;
  size_t numel = 0;
  std::vector<std::string> names;  // of the matrices, in layout order
  detail::Buffer err;              // errElems (error feedback only)
  detail::Buffer q;                // qElems: the last step's averaged Q (warm start)
  detail::Buffer pack;             // [P | the uncompressed segments]
  detail::Buffer partials;         // device partial sums of M^T P
  detail::Buffer norms;            // column norms of the last averaged Q (quantised factors)
  detail::ByteGradScratch pScratch;
  detail::ByteGradScratch qScratch;
  bool qReady = false;      // q holds the last step's average of every matrix
  bool normsReady = false;  // norms hold its column norms
};

// Where a matrix's persistent state lives now.
struct Home {
  std::shared_ptr<BucketState> state;
  size_t matrix = 0;
};

}  // namespace

class PowerSgdImpl final : public core::AlgorithmImpl {
 public:
  PowerSgdImpl(PowerSgd* owner, const PowerSgdOptions& options, bool sumThenDivide)
      : owner_(owner), o_(options), sumThenDivide_(sumThenDivide) {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    owner_->live_ = this;
  }
  ~PowerSgdImpl() override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (owner_->live_ == this) {
      owner_->live_ = nullptr;
    }
  }
  PowerSgdImpl(const PowerSgdImpl&) = delete;
  PowerSgdImpl& operator=(const PowerSgdImpl&) = delete;

  std::vector<core::TensorRef> initTensors(core::DistributedDataParallel& ddp) override {
    std::vector<core::TensorRef> refs = core::AlgorithmImpl::initTensors(ddp);
    infos_.clear();
    setupError_ = Status::ok();
    size_t bestMin = 0;
    std::string bestName;
    bool anyMatrix = false;
    for (const core::TensorRef& t : refs) {
      const core::Parameter& p = ddp.parameters()[t.paramIndex];
      TensorInfo info;
      info.name = t.name;
      info.paramIndex = t.paramIndex;
      info.numel = t.numel;
      if (!p.shape.empty()) {
        size_t product = 1;
        for (size_t d : p.shape) {
          product *= d;
        }
        if (product != p.numel && setupError_.isOk()) {
          setupError_ = BAGUA_ERROR(kInvalidArgument,
                                    "powersgd: parameter '%s' has %zu elements but its shape "
                                    "(Parameter::shape) holds %zu",
                                    p.name.c_str(), p.numel, product);
        }
        if (p.shape.size() >= 2 && product == p.numel && p.numel > 0) {
          info.rows = p.shape[0];
          info.cols = p.numel / p.shape[0];
          anyMatrix = true;
          const size_t m = std::min(info.rows, info.cols);
          if (m > bestMin) {
            bestMin = m;
            bestName = strPrintf("'%s' (%zu x %zu)", p.name.c_str(), info.rows, info.cols);
          }
        }
      }
      infos_[static_cast<int>(infos_.size())] = info;
    }
    if (setupError_.isOk() && anyMatrix && static_cast<size_t>(o_.rank) > bestMin) {
      setupError_ = BAGUA_ERROR(kInvalidArgument,
                                "powersgd: rank=%d is larger than min(rows, cols) of every "
                                "matrix of the model (the largest is %zu, of %s): choose rank "
                                "<= %zu",
                                o_.rank, bestMin, bestName.c_str(), bestMin);
    }
    if (!anyMatrix && !refs.empty()) {
      BAGUA_LOG_WARN(kLogAlgo,
                     "powersgd: no gradient has two or more dimensions (core::Parameter::shape "
                     "is empty or 1-D everywhere): every gradient is all-reduced uncompressed");
    }
    return refs;
  }

  Status initOperations(core::Bucket& b) override {
    BAGUA_RETURN_IF_ERROR(setupError_);
    if (b.dtype != core::DataType::kF32) {
      return BAGUA_ERROR(kInvalidArgument,
                         "powersgd: bucket %d holds %s; PowerSGD is implemented for f32 "
                         "gradients only",
                         b.index, core::dataTypeName(b.dtype));
    }
    BAGUA_ASSIGN_OR_RETURN(detail::Exec exec, detail::execFor(b.device, kName));
    if (b.index == 0) {
      buckets_.clear();  // a new layout; the old states live on through homes_ until migrated
    }
    auto st = std::make_shared<BucketState>();
    st->exec = exec;
    st->numel = b.numel;
    detail::psgd::Layout& l = st->layout;
    std::vector<int> keys;
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      const int t = b.tensors[k];
      const auto it = infos_.find(t);
      const TensorInfo info = it != infos_.end() ? it->second : TensorInfo{};
      const size_t numel = (k + 1 < b.offsets.size() ? b.offsets[k + 1] : b.numel) - b.offsets[k];
      const int r = matrixRank(o_, info.rows, info.cols);
      if (r > 0) {
        detail::psgd::Matrix m;
        m.offset = static_cast<int64_t>(b.offsets[k]);
        m.errOffset = static_cast<int64_t>(l.errElems);
        m.pOffset = static_cast<int64_t>(l.pElems);
        m.qOffset = static_cast<int64_t>(l.qElems);
        m.rows = static_cast<int32_t>(info.rows);
        m.cols = static_cast<int32_t>(info.cols);
        m.rank = r;
        m.normOffset = static_cast<int32_t>(l.normElems);
        m.key = static_cast<uint32_t>(info.paramIndex);
        if (info.rows > INT32_MAX || info.cols > INT32_MAX) {
          return BAGUA_ERROR(kInvalidArgument,
                             "powersgd: '%s' has %zu x %zu elements (at most "
                             "2^31 - 1 rows and columns)",
                             info.name.c_str(), info.rows, info.cols);
        }
        l.matrices.push_back(m);
        l.errElems += info.rows * info.cols;
        l.pElems += info.rows * static_cast<size_t>(r);
        l.qElems += info.cols * static_cast<size_t>(r);
        l.normElems += static_cast<size_t>(r);
        st->names.push_back(info.name);
        keys.push_back(info.paramIndex);
      } else if (numel > 0) {
        const auto src = static_cast<int64_t>(b.offsets[k]);
        if (!l.segments.empty() && l.segments.back().src + l.segments.back().len == src) {
          l.segments.back().len += static_cast<int64_t>(numel);
        } else {
          l.segments.push_back(
              {src, static_cast<int64_t>(l.uncompressedElems), static_cast<int64_t>(numel)});
        }
        l.uncompressedElems += numel;
      }
    }
    for (detail::psgd::Segment& s : l.segments) {
      s.dst += static_cast<int64_t>(l.pElems);
    }
    BAGUA_RETURN_IF_ERROR(l.upload(exec));
    const auto bytes = [](size_t n) { return std::max<size_t>(n, 1) * sizeof(float); };
    if (!l.matrices.empty()) {
      if (o_.errorFeedback) {
        BAGUA_RETURN_IF_ERROR(st->err.ensure(exec, bytes(l.errElems)));
      }
      BAGUA_RETURN_IF_ERROR(st->q.ensure(exec, bytes(l.qElems)));
      BAGUA_RETURN_IF_ERROR(st->pack.ensure(exec, bytes(l.pElems + l.uncompressedElems)));
      if (exec.device) {
        BAGUA_RETURN_IF_ERROR(st->partials.ensure(exec, bytes(l.partElems)));
      }
      if (o_.quantizeFactors) {
        BAGUA_RETURN_IF_ERROR(st->norms.ensure(exec, bytes(l.normElems)));
      }
    }
    // Carry each matrix's error and Q over from where it lived before (a re-bucketing).
    bool allQ = !l.matrices.empty();
    bool allNorms = allQ;
    for (size_t d = 0; d < l.matrices.size(); ++d) {
      const detail::psgd::Matrix& m = l.matrices[d];
      auto h = homes_.find(keys[d]);
      if (h == homes_.end()) {
        allQ = allNorms = false;
        continue;
      }
      BucketState& old = *h->second.state;
      const detail::psgd::Matrix& om = old.layout.matrices[h->second.matrix];
      if (om.rows != m.rows || om.cols != m.cols || om.rank != m.rank) {
        allQ = allNorms = false;
        continue;
      }
      if (o_.errorFeedback) {
        BAGUA_RETURN_IF_ERROR(detail::copyBytes(exec, st->err.f32() + m.errOffset,
                                                old.err.f32() + om.errOffset,
                                                static_cast<size_t>(m.rows) * m.cols * 4));
      }
      BAGUA_RETURN_IF_ERROR(detail::copyBytes(exec, st->q.f32() + m.qOffset,
                                              old.q.f32() + om.qOffset,
                                              static_cast<size_t>(m.cols) * m.rank * 4));
      if (o_.quantizeFactors) {
        BAGUA_RETURN_IF_ERROR(detail::copyBytes(exec, st->norms.f32() + m.normOffset,
                                                old.norms.f32() + om.normOffset,
                                                static_cast<size_t>(m.rank) * 4));
      }
      allQ = allQ && old.qReady;
      allNorms = allNorms && old.normsReady;
    }
    BAGUA_RETURN_IF_ERROR(detail::sync(exec, std::chrono::milliseconds(60000)));
    st->qReady = allQ;
    st->normsReady = allNorms;
    for (size_t d = 0; d < l.matrices.size(); ++d) {
      homes_[keys[d]] = Home{st, d};
    }
    buckets_[b.index] = st;
    return Status::ok();
  }

  // Before compression starts (and for buckets without a compressed matrix), the bucket is one
  // all-reduce the reducer may start without waiting.
  Result<core::WorkPtr> launchBucket(core::Bucket& b, core::ProcessGroup& g) override {
    auto it = buckets_.find(b.index);
    if (it == buckets_.end() || sumThenDivide_) {
      return core::WorkPtr();
    }
    if (steps_.load(std::memory_order_acquire) >= o_.startIter &&
        !it->second->layout.matrices.empty()) {
      return core::WorkPtr();
    }
    return g.global().allReduce(b.flat, b.flat, b.numel, b.dtype, core::ReduceOp::kAvg);
  }

  Status runBucket(core::Bucket& b, core::ProcessGroup& g) override {
    auto it = buckets_.find(b.index);
    if (it == buckets_.end() || it->second->numel != b.numel) {
      return BAGUA_ERROR(kInternal, "powersgd: bucket %d was not initialised", b.index);
    }
    BucketState& st = *it->second;
    const int64_t step = steps_.load(std::memory_order_acquire);
    if (step < o_.startIter || st.layout.matrices.empty()) {
      return plainAllReduce(st, b, g);
    }
    return compressedStep(st, b, g, step);
  }

  Status onPostBackward(core::DistributedDataParallel& /*ddp*/) override {
    const int64_t done = steps_.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (done == o_.startIter) {
      const PowerSgd::Snapshot s = totals();
      BAGUA_LOG_INFO(kLogAlgo,
                     "powersgd: compression starts after %lld steps: %zu matrices at rank <= %d, "
                     "%zu elements all-reduced per step instead of %zu (%.1fx less)",
                     static_cast<long long>(done), s.compressedMatrices, o_.rank, s.elementsPerStep,
                     s.uncompressedElements,
                     s.elementsPerStep > 0 ? static_cast<double>(s.uncompressedElements) /
                                                 static_cast<double>(s.elementsPerStep)
                                           : 0.0);
    }
    return Status::ok();
  }

  // Exact resume: the communicating-step count and each compressed matrix's error, Q and
  // column norms, which decide every later step (fresh zeros and draws would not). Layout
  // (native byte order): u64 kStateMagic, i64 steps, u64 matrices, then per matrix u32
  // parameter index, rows, cols, rank, ready flags (bit 0: Q, bit 1: norms), and its floats:
  // error (rows x cols, error feedback only), Q (cols x rank), norms (rank, quantised factors).
  Result<std::vector<uint8_t>> saveState(core::DistributedDataParallel& /*ddp*/) override {
    std::vector<uint8_t> out;
    auto put = [&out](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    const uint64_t magic = kStateMagic;
    const int64_t steps = steps_.load(std::memory_order_acquire);
    const uint64_t count = homes_.size();
    put(&magic, 8);
    put(&steps, 8);
    put(&count, 8);
    for (const auto& [key, home] : homes_) {
      BucketState& st = *home.state;
      const detail::psgd::Matrix& m = st.layout.matrices[home.matrix];
      const uint32_t head[5] = {static_cast<uint32_t>(key), static_cast<uint32_t>(m.rows),
                                static_cast<uint32_t>(m.cols), static_cast<uint32_t>(m.rank),
                                (st.qReady ? 1u : 0u) | (st.normsReady ? 2u : 0u)};
      put(head, sizeof(head));
      for (const auto& [buf, offset, n] : stateParts(st, m)) {
        const size_t at = out.size();
        out.resize(at + n * sizeof(float));
        BAGUA_RETURN_IF_ERROR(
            detail::copyToHost(st.exec, out.data() + at, buf->f32() + offset, n * sizeof(float)));
      }
    }
    return out;
  }

  Status restoreState(core::DistributedDataParallel& /*ddp*/,
                      std::span<const uint8_t> state) override {
    size_t at = 0;
    auto take = [&](void* dst, size_t n) -> Status {
      if (state.size() - at < n) {
        return BAGUA_ERROR(kInvalidArgument,
                           "powersgd: the checkpoint's algorithm state ends early (%zu bytes)",
                           state.size());
      }
      std::memcpy(dst, state.data() + at, n);
      at += n;
      return Status::ok();
    };
    uint64_t magic = 0, count = 0;
    int64_t steps = 0;
    BAGUA_RETURN_IF_ERROR(take(&magic, 8));
    if (magic != kStateMagic) {
      return BAGUA_ERROR(kInvalidArgument,
                         "powersgd: the checkpoint's algorithm state is not PowerSGD's (saved "
                         "with another algorithm?)");
    }
    BAGUA_RETURN_IF_ERROR(take(&steps, 8));
    BAGUA_RETURN_IF_ERROR(take(&count, 8));
    if (count != homes_.size()) {
      return BAGUA_ERROR(kInvalidArgument,
                         "powersgd: the checkpoint holds the state of %llu compressed matrices, "
                         "this model has %zu (another model, rank or min_compression_rate?)",
                         static_cast<unsigned long long>(count), homes_.size());
    }
    std::map<const BucketState*, bool> qReady, normsReady;
    for (uint64_t i = 0; i < count; ++i) {
      uint32_t head[5] = {};
      BAGUA_RETURN_IF_ERROR(take(head, sizeof(head)));
      auto h = homes_.find(static_cast<int>(head[0]));
      if (h == homes_.end()) {
        return BAGUA_ERROR(kInvalidArgument,
                           "powersgd: the checkpoint holds a matrix for parameter %u, which this "
                           "model does not compress",
                           head[0]);
      }
      BucketState& st = *h->second.state;
      const detail::psgd::Matrix& m = st.layout.matrices[h->second.matrix];
      if (head[1] != static_cast<uint32_t>(m.rows) || head[2] != static_cast<uint32_t>(m.cols) ||
          head[3] != static_cast<uint32_t>(m.rank)) {
        return BAGUA_ERROR(kInvalidArgument,
                           "powersgd: parameter %u is %u x %u at rank %u in the checkpoint, %d x "
                           "%d at rank %d here",
                           head[0], head[1], head[2], head[3], m.rows, m.cols, m.rank);
      }
      for (const auto& [buf, offset, n] : stateParts(st, m)) {
        if (state.size() - at < n * sizeof(float)) {
          return BAGUA_ERROR(kInvalidArgument,
                             "powersgd: the checkpoint's algorithm state ends early");
        }
        BAGUA_RETURN_IF_ERROR(detail::copyFromHost(st.exec, buf->f32() + offset, state.data() + at,
                                                   n * sizeof(float)));
        at += n * sizeof(float);
      }
      auto q = qReady.try_emplace(&st, true).first;
      q->second = q->second && (head[4] & 1u) != 0;
      auto nr = normsReady.try_emplace(&st, true).first;
      nr->second = nr->second && (head[4] & 2u) != 0;
    }
    if (at != state.size()) {
      return BAGUA_ERROR(kInvalidArgument,
                         "powersgd: %zu bytes after the checkpoint's algorithm state",
                         state.size() - at);
    }
    for (auto& [index, st] : buckets_) {
      st->qReady = qReady.count(st.get()) != 0 && qReady[st.get()];
      st->normsReady = normsReady.count(st.get()) != 0 && normsReady[st.get()];
    }
    steps_.store(steps, std::memory_order_release);
    return Status::ok();
  }

  Result<PowerSgd::Snapshot> snapshot() {
    PowerSgd::Snapshot s = totals();
    for (const auto& [index, st] : buckets_) {
      const detail::psgd::Layout& l = st->layout;
      for (size_t d = 0; d < l.matrices.size(); ++d) {
        const detail::psgd::Matrix& m = l.matrices[d];
        PowerSgd::TensorState t;
        t.rows = static_cast<size_t>(m.rows);
        t.cols = static_cast<size_t>(m.cols);
        t.rank = m.rank;
        if (o_.errorFeedback) {
          t.error.resize(t.rows * t.cols);
          BAGUA_RETURN_IF_ERROR(detail::copyToHost(st->exec, t.error.data(),
                                                   st->err.f32() + m.errOffset,
                                                   t.error.size() * sizeof(float)));
        }
        t.q.resize(t.cols * static_cast<size_t>(m.rank));
        BAGUA_RETURN_IF_ERROR(detail::copyToHost(st->exec, t.q.data(), st->q.f32() + m.qOffset,
                                                 t.q.size() * sizeof(float)));
        s.tensors[st->names[d]] = std::move(t);
      }
    }
    return s;
  }

 private:
  struct Part {
    detail::Buffer* buf;
    int64_t offset;
    size_t n;
  };
  // The pieces of a matrix's persistent state, in checkpoint order.
  std::vector<Part> stateParts(BucketState& st, const detail::psgd::Matrix& m) const {
    std::vector<Part> parts;
    if (o_.errorFeedback) {
      parts.push_back({&st.err, m.errOffset, static_cast<size_t>(m.rows) * m.cols});
    }
    parts.push_back({&st.q, m.qOffset, static_cast<size_t>(m.cols) * m.rank});
    if (o_.quantizeFactors) {
      parts.push_back({&st.norms, m.normOffset, static_cast<size_t>(m.rank)});
    }
    return parts;
  }

  PowerSgd::Snapshot totals() const {
    PowerSgd::Snapshot s;
    s.steps = steps_.load(std::memory_order_acquire);
    s.compressing = s.steps >= o_.startIter;
    for (const auto& [index, st] : buckets_) {
      const detail::psgd::Layout& l = st->layout;
      s.compressedMatrices += l.matrices.size();
      s.uncompressedElements += st->numel;
      s.elementsPerStep +=
          l.matrices.empty() ? st->numel : l.pElems + l.qElems + l.uncompressedElems;
    }
    return s;
  }

  Status plainAllReduce(BucketState& st, core::Bucket& b, core::ProcessGroup& g) {
    const auto timeout = g.options().collectiveTimeout;
    core::Communicator& c = g.global();
    if (!sumThenDivide_) {
      return c.allReduce(b.flat, b.flat, b.numel, b.dtype, core::ReduceOp::kAvg)->wait(timeout);
    }
    BAGUA_RETURN_IF_ERROR(
        c.allReduce(b.flat, b.flat, b.numel, b.dtype, core::ReduceOp::kSum)->wait(timeout));
    BAGUA_RETURN_IF_ERROR(detail::divideInPlace(st.exec, static_cast<float*>(b.flat),
                                                static_cast<float>(c.size()), b.numel));
    return detail::sync(st.exec, timeout);
  }

  Status compressedStep(BucketState& st, core::Bucket& b, core::ProcessGroup& g, int64_t step) {
    namespace ps = detail::psgd;
    const auto timeout = g.options().collectiveTimeout;
    core::Communicator& c = g.global();
    const detail::Exec& x = st.exec;
    const ps::Layout& l = st.layout;
    const auto n = static_cast<float>(c.size());
    const auto gen = static_cast<uint64_t>(step);
    auto* flat = static_cast<float*>(b.flat);
    float* err = o_.errorFeedback ? st.err.f32() : nullptr;
    float* q = st.q.f32();
    float* p = st.pack.f32();
    float* rest = p + l.pElems;

    // Q: last step's average (warm start), else fresh draws; orthogonal columns either way.
    if (!o_.warmStart || !st.qReady) {
      BAGUA_RETURN_IF_ERROR(ps::fillRandom(x, l, q, o_.seed, gen));
    }
    BAGUA_RETURN_IF_ERROR(ps::orthogonalize(x, l, q, ps::Factor::kQ, o_.orthogonalizationEpsilon,
                                            true, o_.seed, gen));
    BAGUA_RETURN_IF_ERROR(ps::project(x, l, flat, err, q, p));
    BAGUA_RETURN_IF_ERROR(ps::segments(x, l, flat, p, true, 1.0f));

    // All-reduce P (sum: it is orthogonalised next) with the uncompressed tensors, or, with
    // quantised factors (from the second compressed step, once there are column norms to
    // scale by), P through ByteGrad's exchange and the rest in full precision.
    const bool quantised = o_.quantizeFactors && st.normsReady;
    pending_.clear();
    if (!quantised) {
      BAGUA_RETURN_IF_ERROR(beforeCollective(x, c, timeout));
      BAGUA_RETURN_IF_ERROR(afterCollective(x, c,
                                            c.allReduce(p, p, l.pElems + l.uncompressedElems,
                                                        core::DataType::kF32, core::ReduceOp::kSum),
                                            timeout));
    } else {
      if (l.uncompressedElems > 0) {
        BAGUA_RETURN_IF_ERROR(detail::sync(x, timeout));
        BAGUA_RETURN_IF_ERROR(
            c.allReduce(rest, rest, l.uncompressedElems, core::DataType::kF32, core::ReduceOp::kSum)
                ->wait(timeout));
      }
      BAGUA_RETURN_IF_ERROR(ps::scaleColumns(x, l, p, st.norms.f32(), ps::Factor::kP, false));
      BAGUA_RETURN_IF_ERROR(
          detail::byteGradAllReduce(x, p, l.pElems, g, false, false, st.pScratch));
    }
    BAGUA_RETURN_IF_ERROR(ps::segments(x, l, flat, p, false, n));

    BAGUA_RETURN_IF_ERROR(ps::orthogonalize(x, l, p, ps::Factor::kP, o_.orthogonalizationEpsilon,
                                            false, o_.seed, gen));
    BAGUA_RETURN_IF_ERROR(ps::backProject(x, l, flat, p, st.partials.f32(), q));
    if (!quantised) {
      BAGUA_RETURN_IF_ERROR(beforeCollective(x, c, timeout));
      BAGUA_RETURN_IF_ERROR(afterCollective(
          x, c, c.allReduce(q, q, l.qElems, core::DataType::kF32, core::ReduceOp::kSum), timeout));
      BAGUA_RETURN_IF_ERROR(detail::divideInPlace(x, q, n, l.qElems));
    } else {
      BAGUA_RETURN_IF_ERROR(ps::scaleColumns(x, l, q, st.norms.f32(), ps::Factor::kQ, false));
      BAGUA_RETURN_IF_ERROR(detail::byteGradAllReduce(x, q, l.qElems, g, false, true, st.qScratch));
      BAGUA_RETURN_IF_ERROR(ps::scaleColumns(x, l, q, st.norms.f32(), ps::Factor::kQ, true));
    }
    if (o_.quantizeFactors) {
      BAGUA_RETURN_IF_ERROR(ps::columnNorms(x, l, q, st.norms.f32()));
      st.normsReady = true;
    }
    BAGUA_RETURN_IF_ERROR(ps::reconstruct(x, l, flat, err, p, q));
    st.qReady = true;
    for (core::WorkPtr& w : pending_) {  // device-ordered collectives: their status
      BAGUA_RETURN_IF_ERROR(w->wait(timeout));
    }
    pending_.clear();
    return detail::sync(x, timeout);
  }

  // Before a collective reads what this thread's device work wrote: ordered on the device when
  // the communicator has a stream (NCCL: no host wait between the kernels and the collective),
  // else waited for on the host. Bucket thread only.
  Status beforeCollective(const detail::Exec& x, core::Communicator& c,
                          std::chrono::milliseconds timeout) {
    if (x.device && deviceOrdered_) {
      Status s = detail::psgd::streamBefore(x, c);
      if (s.code() != StatusCode::kFailedPrecondition) {
        return s;
      }
      deviceOrdered_ = false;  // a communicator without a stream: host waits from now on
    }
    return detail::sync(x, timeout);
  }

  // After issuing collective `w`: device-ordered, this thread's later kernels wait for it on the
  // device and its status is collected at the end of the step; else it is waited for now.
  Status afterCollective(const detail::Exec& x, core::Communicator& c, core::WorkPtr w,
                         std::chrono::milliseconds timeout) {
    if (x.device && deviceOrdered_) {
      BAGUA_RETURN_IF_ERROR(detail::psgd::streamAfter(x, c));
      pending_.push_back(std::move(w));
      return Status::ok();
    }
    return w->wait(timeout);
  }

  PowerSgd* owner_;
  PowerSgdOptions o_;
  bool sumThenDivide_;
  Status setupError_;
  std::map<int, TensorInfo> infos_;  // by position in the reducer's tensor list
  std::map<int, std::shared_ptr<BucketState>> buckets_;
  std::map<int, Home> homes_;  // by parameter index
  std::atomic<int64_t> steps_{0};
  bool deviceOrdered_ = true;           // bucket thread: see beforeCollective
  std::vector<core::WorkPtr> pending_;  // bucket thread: this step's device-ordered collectives
};

Result<std::unique_ptr<core::AlgorithmImpl>> PowerSgd::reify(core::ProcessGroup& group) {
  BAGUA_RETURN_IF_ERROR(validatePowerSgdOptions(options_));
  bool sumThenDivide = false;
  if (group.global().backendName() == "nccl") {
    const int v = GradientAllReduce::ncclVersion();
    sumThenDivide = v > 0 && v < kNcclAvgVersion;
  }
  return std::unique_ptr<core::AlgorithmImpl>(new PowerSgdImpl(this, options_, sumThenDivide));
}

Result<PowerSgd::Snapshot> PowerSgd::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_ == nullptr) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "powersgd: no state before the reducer is created (withBagua)");
  }
  return live_->snapshot();
}

}  // namespace bagua::algo
