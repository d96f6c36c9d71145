#include "bagua/optimizer/fused_optimizer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>

#include "bagua/base/logging.h"
#include "bagua/core/ddp.h"
#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/grad_scaler.h"
#include "bagua/optimizer/params.h"

namespace bagua::optim {

using core::DataType;
using core::Device;
using core::DeviceType;

Result<StorageType> storageTypeOf(DataType dtype) {
  switch (dtype) {
  case DataType::kF32:
    return StorageType::kF32;
  case DataType::kF64:
    return StorageType::kF64;
  case DataType::kF16:
    return StorageType::kF16;
  case DataType::kBF16:
    return StorageType::kBF16;
  default:
    return BAGUA_ERROR(kInvalidArgument,
                       "optimizer: parameters must be f32, f64, f16 or bf16, not %s",
                       core::dataTypeName(dtype));
  }
}

namespace {

size_t stateElemSize(StorageType s) {
  return s == StorageType::kF64 ? 8 : 4;
}

bool isHalfLike(StorageType s) {
  return s == StorageType::kF16 || s == StorageType::kBF16;
}

// ---- Device memory (CPU: 64-byte aligned heap; CUDA: through cuda.h) ---------------------------

Result<void*> deviceAlloc(const Device& d, size_t bytes) {
  const size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (d.type == DeviceType::kCpu) {
    void* p = std::aligned_alloc(64, n);
    if (p == nullptr) {
      return BAGUA_ERROR(kResourceExhausted, "optimizer: cannot allocate %zu bytes", n);
    }
    std::memset(p, 0, n);
    return p;
  }
  void* p = nullptr;
  BAGUA_RETURN_IF_ERROR(cudaAllocZeroed(d.index, n, &p));
  return p;
}

void deviceFree(const Device& d, void* p) {
  if (p == nullptr) {
    return;
  }
  if (d.type == DeviceType::kCpu) {
    std::free(p);
  } else {
    cudaRelease(d.index, p);
  }
}

Status copyOn(const Device& d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memmove(dst, src, bytes);
    return Status::ok();
  }
  return cudaCopy(d.index, dst, src, bytes, 0);
}

Status toHost(const Device& d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  return cudaCopy(d.index, dst, src, bytes, 2);
}

Status fromHost(const Device& d, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  return cudaCopy(d.index, dst, src, bytes, 1);
}

Status zeroOn(const Device& d, void* p, size_t bytes) {
  if (bytes == 0 || p == nullptr) {
    return Status::ok();
  }
  if (d.type == DeviceType::kCpu) {
    std::memset(p, 0, bytes);
    return Status::ok();
  }
  return cudaZero(d.index, p, bytes);
}

// Fills `numel` state elements with `value` (f32 or f64).
Status fillState(const Device& d, void* p, size_t numel, StorageType s, double value) {
  if (value == 0.0) {
    return zeroOn(d, p, numel * stateElemSize(s));
  }
  std::vector<uint8_t> host(numel * stateElemSize(s));
  if (s == StorageType::kF64) {
    std::fill_n(reinterpret_cast<double*>(host.data()), numel, value);
  } else {
    std::fill_n(reinterpret_cast<float*>(host.data()), numel, static_cast<float>(value));
  }
  return fromHost(d, p, host.data(), host.size());
}

// 16-bit parameter values as f32 master weights.
Status initMaster(const Device& d, float* master, const void* param, size_t numel, StorageType s) {
  std::vector<uint16_t> bits(numel);
  BAGUA_RETURN_IF_ERROR(toHost(d, bits.data(), param, numel * 2));
  std::vector<float> f(numel);
  for (size_t i = 0; i < numel; ++i) {
    f[i] = s == StorageType::kF16 ? fromHalfBits(bits[i]) : fromBf16Bits(bits[i]);
  }
  return fromHost(d, master, f.data(), numel * 4);
}

std::string deviceString(const Device& d) {
  return d.type == DeviceType::kCpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

}  // namespace

struct FusedOptimizer::Buffer {
  Device device;
  void* ptr = nullptr;
  Buffer(const Device& d, void* p) : device(d), ptr(p) {}
  ~Buffer() { deviceFree(device, ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  static Result<std::unique_ptr<Buffer>> make(const Device& d, size_t bytes) {
    BAGUA_ASSIGN_OR_RETURN(void* p, deviceAlloc(d, bytes));
    return std::make_unique<Buffer>(d, p);
  }
};

struct FusedOptimizer::Slot {
  int param = -1;
  int group = 0;
  int partition = 0;
  int64_t step = 0;
  size_t numel = 0;
  StorageType storage = StorageType::kF32;
  Device device;
  void* state[kMaxStates] = {};
  float* master = nullptr;
  std::unique_ptr<Buffer> own[kMaxStates];
  std::unique_ptr<Buffer> ownMaster;
  int run = -1;  // index into the current plan's runs, or -1
};

struct FusedOptimizer::Partition {
  int group = 0;
  DataType dtype = DataType::kF32;
  StorageType storage = StorageType::kF32;
  Device device;
  std::vector<int> slots;  // in layout order
  std::unique_ptr<Buffer> params, grads, master, states[kMaxStates];
  bool flattened = false;
  bool gradsFlattened = false;
};

// One fused run of the plan. Its slots have equal step counts; the steps it takes while the plan
// stands are counted here (`pending`) and folded into the slots by dropPlan(), so a step touches
// O(runs) counters, not O(tensors).
struct FusedOptimizer::PlanRun {
  int partition = 0;
  int first = 0;  // first slot in address order
  size_t numel = 0;
  size_t segBegin = 0, segCount = 0;    // into Plan::segments
  size_t slotBegin = 0, slotCount = 0;  // into Plan::runSlots
  int64_t pending = 0;
};

// Everything a step needs that depends only on where the tensors are: built by buildPlan() in
// O(n log n), checked by planCurrent() in O(n) pointer compares per step.
struct FusedOptimizer::Plan {
  bool valid = false;
  size_t numParams = 0;
  struct Watch {
    size_t param;
    const void* data;
    const void* grad;
  };
  std::vector<Watch> watch;     // every managed parameter, in parameter order
  size_t cursor = 0;            // next watch entry of the rotating window
  std::vector<unsigned> masks;  // stateMask per group when built
  std::vector<PlanRun> runs;
  std::vector<int> runSlots;
  std::vector<size_t> segments;
  std::vector<int> singles;  // slots with a gradient in no run (stepped per tensor)
  int64_t groupsFused = 0;   // groups with at least one run
  bool intact = true;        // flattenIntact() when built
  // Mixed precision: gradient ranges merged where byte-adjacent, their CPU chunks and results.
  struct Scan {
    KernelArgs args;
    Device device;
  };
  struct Chunk {
    size_t scan, begin, end;
  };
  std::vector<Scan> scans;
  std::vector<Chunk> chunks;
  std::vector<uint8_t> bad;
};

FusedOptimizer::FusedOptimizer(std::vector<core::Parameter>& params,
                               std::vector<std::vector<int>> groups,
                               const OptimizerOptions& options)
    : params_(params), groupParams_(std::move(groups)), options_(options) {}

FusedOptimizer::~FusedOptimizer() = default;

int64_t FusedOptimizer::effectiveStep(const Slot& s) const {
  if (s.run >= 0 && plan_ && plan_->valid) {
    return s.step + plan_->runs[s.run].pending;
  }
  return s.step;
}

void FusedOptimizer::dropPlan() {
  if (!plan_) {
    return;
  }
  for (PlanRun& r : plan_->runs) {
    for (size_t i = r.slotBegin; i < r.slotBegin + r.slotCount; ++i) {
      Slot& s = *slots_[plan_->runSlots[i]];
      s.step += r.pending;
      s.run = -1;
    }
    r.pending = 0;
  }
  plan_->valid = false;
}

bool FusedOptimizer::planCurrent(bool full) {
  if (!plan_ || !plan_->valid || plan_->numParams != params_.size()) {
    return false;
  }
  for (size_t g = 0; g < groupParams_.size(); ++g) {
    if (stateMask(static_cast<int>(g)) != plan_->masks[g]) {
      return false;
    }
  }
  // The only per-tensor work of a planned step: branch-free, so it streams through the list.
  bool same = true;
  const size_t n = plan_->watch.size();
  if (full || n <= kWatchWindow) {
    for (const Plan::Watch& w : plan_->watch) {
      const core::Parameter& p = params_[w.param];
      same &= (p.data == w.data) & (p.grad == w.grad);
    }
    return same;
  }
  size_t c = plan_->cursor;
  for (size_t k = 0; k < kWatchWindow; ++k) {
    const Plan::Watch& w = plan_->watch[c];
    const core::Parameter& p = params_[w.param];
    same &= (p.data == w.data) & (p.grad == w.grad);
    c = c + 1 == n ? 0 : c + 1;
  }
  plan_->cursor = c;
  return same;
}

Status FusedOptimizer::ensurePlan(bool full) {
  if (planCurrent(full)) {
    return Status::ok();
  }
  dropPlan();
  buildPlan();
  return Status::ok();
}

Status FusedOptimizer::init() {
  int threads = options_.threads;
  if (threads <= 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t t, optimizerParams().threads.get());
    threads = static_cast<int>(t);
    if (threads <= 0) {
      threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 32u));
    }
  }
  chunkElements_ = options_.chunkElements;
  if (chunkElements_ == 0) {
    BAGUA_ASSIGN_OR_RETURN(int64_t c, optimizerParams().chunkElements.get());
    chunkElements_ = static_cast<size_t>(c);
  }
  BAGUA_ASSIGN_OR_RETURN(int64_t timeoutMs, optimizerParams().waitTimeoutMs.get());
  pool_ = std::make_unique<ThreadPool>(threads, std::chrono::milliseconds(timeoutMs));

  slotOfParam_.assign(params_.size(), -1);
  allocMask_.assign(groupParams_.size(), 0);
  for (size_t gi = 0; gi < groupParams_.size(); ++gi) {
    allocMask_[gi] = stateMask(static_cast<int>(gi)) & ((1u << numStates()) - 1u);
  }
  std::map<std::tuple<int, int, int, int>, int> partOf;
  for (size_t gi = 0; gi < groupParams_.size(); ++gi) {
    const unsigned mask = stateMask(static_cast<int>(gi));
    for (int pi : groupParams_[gi]) {
      if (pi < 0 || static_cast<size_t>(pi) >= params_.size()) {
        return BAGUA_ERROR(kInvalidArgument, "%s: group %zu names parameter %d of %zu", ruleName(),
                           gi, pi, params_.size());
      }
      if (slotOfParam_[pi] >= 0) {
        return BAGUA_ERROR(kInvalidArgument, "%s: parameter '%s' is in two groups", ruleName(),
                           params_[pi].name.c_str());
      }
      const core::Parameter& p = params_[pi];
      auto st = storageTypeOf(p.dtype);
      if (!st.isOk()) {
        return Status(st.status()).withContext(p.name);
      }
      if (p.device.type == DeviceType::kCuda && !(cudaKernelsAvailable() && hasCudaKernel())) {
        return BAGUA_ERROR(kInvalidArgument, "%s: parameter '%s' is on cuda:%d but %s", ruleName(),
                           p.name.c_str(), p.device.index,
                           cudaKernelsAvailable() ? "this rule has no CUDA kernel"
                                                  : "bagua was built without CUDA");
      }
      if (p.data == nullptr && p.numel > 0) {
        return BAGUA_ERROR(kInvalidArgument, "%s: parameter '%s' has no data", ruleName(),
                           p.name.c_str());
      }
      auto slot = std::make_unique<Slot>();
      slot->param = pi;
      slot->group = static_cast<int>(gi);
      slot->numel = p.numel;
      slot->storage = *st;
      slot->device = p.device;
      const auto key = std::make_tuple(static_cast<int>(gi), static_cast<int>(p.dtype),
                                       static_cast<int>(p.device.type), p.device.index);
      auto it = partOf.find(key);
      if (it == partOf.end()) {
        auto part = std::make_unique<Partition>();
        part->group = static_cast<int>(gi);
        part->dtype = p.dtype;
        part->storage = *st;
        part->device = p.device;
        it = partOf.emplace(key, static_cast<int>(partitions_.size())).first;
        partitions_.push_back(std::move(part));
      }
      slot->partition = it->second;
      const size_t es = stateElemSize(*st);
      for (int k = 0; k < numStates(); ++k) {
        if (((mask >> k) & 1u) == 0) {
          continue;
        }
        BAGUA_ASSIGN_OR_RETURN(slot->own[k], Buffer::make(p.device, p.numel * es));
        slot->state[k] = slot->own[k]->ptr;
        BAGUA_RETURN_IF_ERROR(fillState(p.device, slot->state[k], p.numel, *st,
                                        initialState(static_cast<int>(gi), k)));
      }
      if (isHalfLike(*st) && options_.masterWeights) {
        BAGUA_ASSIGN_OR_RETURN(slot->ownMaster, Buffer::make(p.device, p.numel * 4));
        slot->master = static_cast<float*>(slot->ownMaster->ptr);
        BAGUA_RETURN_IF_ERROR(initMaster(p.device, slot->master, p.data, p.numel, *st));
      }
      slotOfParam_[pi] = static_cast<int>(slots_.size());
      partitions_[slot->partition]->slots.push_back(static_cast<int>(slots_.size()));
      slots_.push_back(std::move(slot));
    }
  }
  return Status::ok();
}

// ---- Layout
// --------------------------------------------------------------------------------------

Status FusedOptimizer::fuse(const FuseOptions& options) {
  if (fused_) {
    return BAGUA_ERROR(kFailedPrecondition, "%s: the optimizer is already fused", ruleName());
  }
  fuseOptions_ = options;
  if (options.doFlatten) {
    const bool reducerOwnsGrads = ddp_ != nullptr && ddp_->options().gradientAsBucketView;
    BAGUA_RETURN_IF_ERROR(layOut(!reducerOwnsGrads));
  }
  fused_ = true;
  return Status::ok();
}

Status FusedOptimizer::attachReducer(core::DistributedDataParallel& ddp) {
  ddp_ = &ddp;
  if (fused_ && fuseOptions_.doFlatten) {
    return refreshReducerLayout();
  }
  return Status::ok();
}

Status FusedOptimizer::refreshReducerLayout() {
  ddpFlats_.clear();
  for (const core::Bucket& b : ddp_->buckets()) {
    ddpFlats_.push_back(b.flat);
  }
  return layOut(!ddp_->options().gradientAsBucketView);
}

Status FusedOptimizer::layOut(bool moveGrads) {
  dropPlan();
  // Order: the reducer's bucket order when it owns the gradients (so parameter runs line up with
  // gradient runs), else registration order.
  std::vector<size_t> rank(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    rank[i] = i;
  }
  if (ddp_ != nullptr && ddp_->options().gradientAsBucketView) {
    size_t r = 0;
    std::vector<size_t> byBucket(params_.size(), SIZE_MAX);
    for (const core::Bucket& b : ddp_->buckets()) {
      for (int t : b.tensors) {
        const int pi = ddp_->tensors()[t].paramIndex;
        if (pi >= 0 && static_cast<size_t>(pi) < params_.size()) {
          byBucket[pi] = r++;
        }
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      rank[i] = byBucket[i] == SIZE_MAX ? r + i : byBucket[i];
    }
  }
  for (auto& partPtr : partitions_) {
    Partition& part = *partPtr;
    std::stable_sort(part.slots.begin(), part.slots.end(),
                     [&](int a, int b) { return rank[slots_[a]->param] < rank[slots_[b]->param]; });
    size_t total = 0;
    for (int si : part.slots) {
      total += slots_[si]->numel;
    }
    const size_t pes = core::dataTypeSize(part.dtype);
    const size_t ses = stateElemSize(part.storage);
    const unsigned mask = stateMask(part.group);
    const bool master = isHalfLike(part.storage) && options_.masterWeights;
    std::unique_ptr<Buffer> nparams, ngrads, nmaster, nstates[kMaxStates];
    BAGUA_ASSIGN_OR_RETURN(nparams, Buffer::make(part.device, total * pes));
    if (moveGrads) {
      BAGUA_ASSIGN_OR_RETURN(ngrads, Buffer::make(part.device, total * pes));
    }
    if (master) {
      BAGUA_ASSIGN_OR_RETURN(nmaster, Buffer::make(part.device, total * 4));
    }
    for (int k = 0; k < numStates(); ++k) {
      if ((mask >> k) & 1u) {
        BAGUA_ASSIGN_OR_RETURN(nstates[k], Buffer::make(part.device, total * ses));
      }
    }
    if (moveGrads) {
      for (int si : part.slots) {
        const core::Parameter& p = params_[slots_[si]->param];
        if (p.grad != nullptr && !p.setGrad && p.numel > 0) {
          BAGUA_LOG_WARN(kLogOptim,
                         "%s: parameter '%s' has no setGrad; its gradient moves only in the "
                         "parameter list (trainers must read gradients through it)",
                         ruleName(), p.name.c_str());
          break;
        }
      }
    }
    size_t off = 0;
    for (int si : part.slots) {
      Slot& s = *slots_[si];
      core::Parameter& p = params_[s.param];
      uint8_t* pdst = static_cast<uint8_t*>(nparams->ptr) + off * pes;
      BAGUA_RETURN_IF_ERROR(copyOn(part.device, pdst, p.data, s.numel * pes));
      if (moveGrads) {
        uint8_t* gdst = static_cast<uint8_t*>(ngrads->ptr) + off * pes;
        if (p.grad != nullptr) {
          BAGUA_RETURN_IF_ERROR(copyOn(part.device, gdst, p.grad, s.numel * pes));
        }
      }
      if (master) {
        float* mdst = static_cast<float*>(nmaster->ptr) + off;
        BAGUA_RETURN_IF_ERROR(copyOn(part.device, mdst, s.master, s.numel * 4));
      }
      for (int k = 0; k < numStates(); ++k) {
        if (nstates[k]) {
          uint8_t* sdst = static_cast<uint8_t*>(nstates[k]->ptr) + off * ses;
          BAGUA_RETURN_IF_ERROR(copyOn(part.device, sdst, s.state[k], s.numel * ses));
        }
      }
      off += s.numel;
    }
    // All copies done: re-point everything at the new storage, then free the old.
    off = 0;
    for (int si : part.slots) {
      Slot& s = *slots_[si];
      core::Parameter& p = params_[s.param];
      p.data = static_cast<uint8_t*>(nparams->ptr) + off * pes;
      if (moveGrads) {
        void* g = static_cast<uint8_t*>(ngrads->ptr) + off * pes;
        p.grad = g;
        if (p.setGrad) {
          p.setGrad(g);
        }
      }
      if (master) {
        s.master = static_cast<float*>(nmaster->ptr) + off;
        s.ownMaster.reset();
      }
      for (int k = 0; k < numStates(); ++k) {
        if (nstates[k]) {
          s.state[k] = static_cast<uint8_t*>(nstates[k]->ptr) + off * ses;
          s.own[k].reset();
        }
      }
      off += s.numel;
    }
    part.params = std::move(nparams);
    if (moveGrads) {
      part.grads = std::move(ngrads);
    }
    if (master) {
      part.master = std::move(nmaster);
    }
    for (int k = 0; k < kMaxStates; ++k) {
      if (nstates[k]) {
        part.states[k] = std::move(nstates[k]);
      }
    }
    part.flattened = true;
    part.gradsFlattened = moveGrads;
    BAGUA_LOG_DEBUG(kLogOptim, "%s: flattened group %d %s on %s: %zu tensors, %zu elements%s",
                    ruleName(), part.group, core::dataTypeName(part.dtype),
                    deviceString(part.device).c_str(), part.slots.size(), total,
                    moveGrads ? "" : " (gradients stay in the reducer's buckets)");
  }
  warnedMoved_ = false;
  return Status::ok();
}

bool FusedOptimizer::flattenIntact() const {
  for (const auto& partPtr : partitions_) {
    const Partition& part = *partPtr;
    if (!part.flattened) {
      continue;
    }
    const size_t pes = core::dataTypeSize(part.dtype);
    size_t off = 0;
    for (int si : part.slots) {
      const Slot& s = *slots_[si];
      const core::Parameter& p = params_[s.param];
      if (p.data != static_cast<uint8_t*>(part.params->ptr) + off * pes) {
        return false;
      }
      if (part.gradsFlattened && p.grad != static_cast<uint8_t*>(part.grads->ptr) + off * pes) {
        return false;
      }
      off += s.numel;
    }
  }
  return true;
}

// ---- Runs
// ----------------------------------------------------------------------------------------

std::vector<std::vector<int>> FusedOptimizer::mutualRuns(
    const std::vector<std::vector<Span>>& lists) {
  if (lists.empty()) {
    return {};
  }
  const size_t n = lists[0].size();
  for (const auto& l : lists) {
    if (l.size() != n) {
      return {};
    }
  }
  // Address order of the first list; a run continues while the next tensor follows the previous
  // one byte for byte in every list. (Bagua keeps only runs that are identical in every list, so
  // one tensor moved in one list loses the whole run; this keeps the parts that still line up.)
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) {
    order[i] = static_cast<int>(i);
  }
  const auto& first = lists[0];
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return first[a].address < first[b].address; });
  auto adjacent = [&](int a, int b) {
    for (const auto& l : lists) {
      if (l[a].address + l[a].bytes != l[b].address) {
        return false;
      }
    }
    return true;
  };
  std::vector<std::vector<int>> runs;
  std::vector<int> cur;
  for (int i : order) {
    if (!cur.empty() && adjacent(cur.back(), i)) {
      cur.push_back(i);
      continue;
    }
    if (cur.size() >= 2) {
      runs.push_back(cur);
    }
    cur.assign(1, i);
  }
  if (cur.size() >= 2) {
    runs.push_back(std::move(cur));
  }
  return runs;
}

std::vector<std::vector<int>> FusedOptimizer::runsOf(const Partition& part) const {
  // Candidates: slots with a gradient and at least one element.
  std::vector<int> cand;
  for (int si : part.slots) {
    const Slot& s = *slots_[si];
    if (s.numel > 0 && params_[s.param].grad != nullptr) {
      cand.push_back(si);
    }
  }
  const unsigned mask = stateMask(part.group);
  const size_t pes = core::dataTypeSize(part.dtype);
  const size_t ses = stateElemSize(part.storage);
  std::vector<std::vector<Span>> lists(2);
  const bool master = cand.empty() ? false : slots_[cand[0]]->master != nullptr;
  if (master) {
    lists.emplace_back();
  }
  for (int k = 0; k < numStates(); ++k) {
    if ((mask >> k) & 1u) {
      lists.emplace_back();
    }
  }
  for (int si : cand) {
    const Slot& s = *slots_[si];
    const core::Parameter& p = params_[s.param];
    size_t li = 0;
    lists[li++].push_back({reinterpret_cast<uintptr_t>(p.data), s.numel * pes});
    lists[li++].push_back({reinterpret_cast<uintptr_t>(p.grad), s.numel * pes});
    if (master) {
      lists[li++].push_back({reinterpret_cast<uintptr_t>(s.master), s.numel * 4});
    }
    for (int k = 0; k < numStates(); ++k) {
      if ((mask >> k) & 1u) {
        lists[li++].push_back({reinterpret_cast<uintptr_t>(s.state[k]), s.numel * ses});
      }
    }
  }
  // Split where step counts differ (Bagua skips fusing tensors whose scalar states differ).
  std::vector<std::vector<int>> out;
  for (const auto& r : mutualRuns(lists)) {
    std::vector<int> cur;
    for (int i : r) {
      const int si = cand[i];
      if (!cur.empty() && slots_[cur.back()]->step != slots_[si]->step) {
        if (cur.size() >= 2) {
          out.push_back(cur);
        }
        cur.clear();
      }
      cur.push_back(si);
    }
    if (cur.size() >= 2) {
      out.push_back(std::move(cur));
    }
  }
  return out;
}

void FusedOptimizer::buildPlan() {
  if (!plan_) {
    plan_ = std::make_unique<Plan>();
  }
  Plan& plan = *plan_;
  plan = Plan();
  plan.numParams = params_.size();
  for (size_t g = 0; g < groupParams_.size(); ++g) {
    plan.masks.push_back(stateMask(static_cast<int>(g)));
  }
  // Parameters appended to the trainer's list after creation are not managed (and not watched).
  for (size_t pi = 0; pi < std::min(params_.size(), slotOfParam_.size()); ++pi) {
    if (slotOfParam_[pi] >= 0) {
      plan.watch.push_back({pi, params_[pi].data, params_[pi].grad});
    }
  }
  std::vector<uint8_t> inRun(slots_.size(), 0);
  std::vector<uint8_t> groupFused(groupParams_.size(), 0);
  for (size_t pi = 0; pi < partitions_.size(); ++pi) {
    for (auto& run : runsOf(*partitions_[pi])) {
      PlanRun r;
      r.partition = static_cast<int>(pi);
      r.first = run.front();
      r.segBegin = plan.segments.size();
      r.slotBegin = plan.runSlots.size();
      for (int si : run) {
        slots_[si]->run = static_cast<int>(plan.runs.size());
        plan.segments.push_back(slots_[si]->numel);
        plan.runSlots.push_back(si);
        r.numel += slots_[si]->numel;
        inRun[si] = 1;
      }
      r.segCount = run.size();
      r.slotCount = run.size();
      plan.runs.push_back(r);
      groupFused[partitions_[pi]->group] = 1;
    }
  }
  for (size_t si = 0; si < slots_.size(); ++si) {
    if (inRun[si] == 0 && params_[slots_[si]->param].grad != nullptr) {
      plan.singles.push_back(static_cast<int>(si));
    }
  }
  for (uint8_t g : groupFused) {
    plan.groupsFused += g;
  }
  plan.intact = flattenIntact();
  // Gradient ranges for the inf/NaN check, merged where byte-adjacent (flat storage scans as one).
  for (const auto& partPtr : partitions_) {
    const Partition& part = *partPtr;
    const size_t pes = core::dataTypeSize(part.dtype);
    std::vector<std::pair<uintptr_t, size_t>> ranges;
    for (int si : part.slots) {
      const Slot& s = *slots_[si];
      const void* g = params_[s.param].grad;
      if (g != nullptr && s.numel > 0) {
        ranges.emplace_back(reinterpret_cast<uintptr_t>(g), s.numel);
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 0; i < ranges.size();) {
      size_t j = i + 1;
      size_t n = ranges[i].second;
      while (j < ranges.size() && ranges[i].first + n * pes == ranges[j].first) {
        n += ranges[j].second;
        ++j;
      }
      Plan::Scan sc;
      sc.args.storage = part.storage;
      sc.args.grad = reinterpret_cast<const void*>(ranges[i].first);
      sc.args.numel = n;
      sc.device = part.device;
      plan.scans.push_back(sc);
      i = j;
    }
  }
  for (size_t i = 0; i < plan.scans.size(); ++i) {
    if (plan.scans[i].device.type == DeviceType::kCuda) {
      continue;
    }
    for (size_t b = 0; b < plan.scans[i].args.numel; b += chunkElements_) {
      plan.chunks.push_back({i, b, std::min(plan.scans[i].args.numel, b + chunkElements_)});
    }
  }
  plan.bad.assign(plan.chunks.size(), 0);
  plan.valid = true;
}

// ---- Steps
// ---------------------------------------------------------------------------------------

KernelArgs FusedOptimizer::argsOf(const Slot& s) const {
  KernelArgs a;
  const core::Parameter& p = params_[s.param];
  a.storage = s.storage;
  a.param = p.data;
  a.grad = p.grad;
  a.master = s.master;
  for (int k = 0; k < kMaxStates; ++k) {
    a.states[k] = s.state[k];
  }
  a.numel = s.numel;
  a.mask = stateMask(s.group);
  return a;
}

Status FusedOptimizer::stepSlot(Slot& s, double invScale) {
  Range r;
  r.group = s.group;
  r.device = s.device;
  r.args = argsOf(s);
  r.args.invScale = invScale;
  segments_.assign(1, s.numel);
  r.segments = segments_.data();
  r.numSegments = 1;
  r.step = s.step + 1;
  BAGUA_RETURN_IF_ERROR(applyRange(r));
  s.step += 1;
  return Status::ok();
}

Status FusedOptimizer::stepRun(PlanRun& run, double invScale) {
  const Slot& first = *slots_[run.first];
  const Partition& part = *partitions_[run.partition];
  Range r;
  r.group = part.group;
  r.device = part.device;
  r.args = argsOf(first);
  r.args.invScale = invScale;
  r.args.numel = run.numel;
  r.segments = plan_->segments.data() + run.segBegin;
  r.numSegments = run.segCount;
  r.step = first.step + run.pending + 1;
  BAGUA_RETURN_IF_ERROR(applyRange(r));
  run.pending += 1;
  return Status::ok();
}

Status FusedOptimizer::checkNonFinite(double invScale, bool* found) {
  *found = false;
  Plan& plan = *plan_;
  // CUDA: every range of a device with one flag and one read-back.
  for (size_t i = 0; i < plan.scans.size(); ++i) {
    Plan::Scan& sc = plan.scans[i];
    sc.args.invScale = invScale;
    if (sc.device.type != DeviceType::kCuda) {
      continue;
    }
    const int dev = sc.device.index;
    if (dev < 0) {
      return BAGUA_ERROR(kInvalidArgument, "%s: bad CUDA device index %d", ruleName(), dev);
    }
    if (cudaFlags_.size() <= static_cast<size_t>(dev)) {
      cudaFlags_.resize(static_cast<size_t>(dev) + 1);
    }
    if (!cudaFlags_[dev]) {
      BAGUA_ASSIGN_OR_RETURN(cudaFlags_[dev], Buffer::make(sc.device, sizeof(int)));
    }
    bool f = false;
    BAGUA_RETURN_IF_ERROR(cudaNonFinite(sc.args, dev, static_cast<int*>(cudaFlags_[dev]->ptr), &f));
    *found = *found || f;
  }
  // CPU ranges are split into chunks and scanned in parallel.
  BAGUA_RETURN_IF_ERROR(pool_->parallelFor(plan.chunks.size(), [&](size_t c) {
    const Plan::Chunk& ch = plan.chunks[c];
    const KernelArgs& a = plan.scans[ch.scan].args;
    bool any = false;
    switch (a.storage) {
    case StorageType::kF32: {
      const float* g = static_cast<const float*>(a.grad);
      const float inv = static_cast<float>(a.invScale);
      for (size_t i = ch.begin; i < ch.end; ++i) {
        any |= !std::isfinite(g[i] * inv);
      }
      break;
    }
    case StorageType::kF64: {
      const double* g = static_cast<const double*>(a.grad);
      for (size_t i = ch.begin; i < ch.end; ++i) {
        any |= !std::isfinite(g[i] * a.invScale);
      }
      break;
    }
    case StorageType::kF16:
    case StorageType::kBF16: {
      const uint16_t* g = static_cast<const uint16_t*>(a.grad);
      const float inv = static_cast<float>(a.invScale);
      const bool half = a.storage == StorageType::kF16;
      for (size_t i = ch.begin; i < ch.end; ++i) {
        const float v = half ? fromHalfBits(g[i]) : fromBf16Bits(g[i]);
        any |= !std::isfinite(v * inv);
      }
      break;
    }
    }
    plan.bad[c] = any ? 1 : 0;
  }));
  for (uint8_t b : plan.bad) {
    *found = *found || b != 0;
  }
  return Status::ok();
}

Status FusedOptimizer::runStep(bool fused) {
  // O(groups): every slot of a group got the group's states at creation.
  for (size_t gi = 0; gi < groupParams_.size(); ++gi) {
    const unsigned missing = stateMask(static_cast<int>(gi)) & ~allocMask_[gi];
    if (missing != 0 && !groupParams_[gi].empty()) {
      int k = 0;
      while (((missing >> k) & 1u) == 0) {
        ++k;
      }
      return BAGUA_ERROR(kFailedPrecondition,
                         "%s: group %zu now needs state '%s', which was not allocated at "
                         "creation (set such hyper-parameters before creating the optimizer)",
                         ruleName(), gi, stateName(k));
    }
  }
  if (ddp_ != nullptr && fused_ && fuseOptions_.doFlatten && ddp_->options().gradientAsBucketView) {
    bool changed = ddpFlats_.size() != ddp_->buckets().size();
    for (size_t b = 0; !changed && b < ddpFlats_.size(); ++b) {
      changed = ddpFlats_[b] != ddp_->buckets()[b].flat;
    }
    if (changed) {
      BAGUA_LOG_INFO(kLogOptim, "%s: the reducer's buckets changed; laying parameters out again",
                     ruleName());
      BAGUA_RETURN_IF_ERROR(refreshReducerLayout());
    }
  }
  BAGUA_RETURN_IF_ERROR(ensurePlan(!fused || fuseOptions_.checkFlatten));
  if (fused && fuseOptions_.checkFlatten && !warnedMoved_ && !plan_->intact) {
    BAGUA_LOG_WARN(kLogOptim,
                   "%s: tensors flattened by fuse() have moved; only the runs that are still "
                   "contiguous are fused",
                   ruleName());
    warnedMoved_ = true;
  }
  double invScale = 1.0;
  lastSkipped_ = false;
  if (scaler_ != nullptr && scaler_->enabled()) {
    invScale = static_cast<double>(scaler_->invScale());
    bool found = false;
    BAGUA_RETURN_IF_ERROR(checkNonFinite(invScale, &found));
    if (found) {
      lastSkipped_ = true;
      scaler_->update(true);
      BAGUA_LOG_DEBUG(kLogOptim, "%s: inf/NaN gradients, step skipped, scale now %g", ruleName(),
                      static_cast<double>(scaler_->scale()));
      return Status::ok();
    }
  }
  lastFusedRuns_ = 0;
  lastFusedTensors_ = 0;
  if (fused) {
    for (PlanRun& run : plan_->runs) {
      BAGUA_RETURN_IF_ERROR(stepRun(run, invScale));
    }
    for (int si : plan_->singles) {
      BAGUA_RETURN_IF_ERROR(stepSlot(*slots_[si], invScale));
    }
    lastFusedRuns_ = plan_->runs.size();
    lastFusedTensors_ = plan_->runSlots.size();
    fusedCount_ += plan_->groupsFused;
  } else {
    // Per tensor: fold the runs' steps into the slots first. Every slot of a run has a gradient,
    // so they all step again here and stay equal: the plan stands.
    for (PlanRun& r : plan_->runs) {
      for (size_t i = r.slotBegin; i < r.slotBegin + r.slotCount; ++i) {
        slots_[plan_->runSlots[i]]->step += r.pending;
      }
      r.pending = 0;
    }
    for (const auto& s : slots_) {
      if (params_[s->param].grad != nullptr) {
        BAGUA_RETURN_IF_ERROR(stepSlot(*s, invScale));
      }
    }
  }
  if (scaler_ != nullptr) {
    scaler_->update(false);
  }
  return Status::ok();
}

Status FusedOptimizer::fuseStep() {
  return runStep(true);
}

Status FusedOptimizer::plainStep() {
  return runStep(false);
}

Status FusedOptimizer::step() {
  return runStep(fused_);
}

void FusedOptimizer::zeroGrad() {
  for (const auto& s : slots_) {
    const core::Parameter& p = params_[s->param];
    if (p.grad != nullptr) {
      zeroOn(p.device, p.grad, p.bytes()).ignore();
    }
  }
}

std::vector<core::Parameter> FusedOptimizer::stateTensors() {
  std::vector<core::Parameter> out;
  for (const auto& s : slots_) {
    const core::Parameter& p = params_[s->param];
    for (int k = 0; k < numStates(); ++k) {
      if (s->state[k] == nullptr) {
        continue;
      }
      core::Parameter t;
      t.name = p.name + "." + stateName(k);
      t.data = s->state[k];
      t.numel = s->numel;
      t.dtype = s->storage == StorageType::kF64 ? DataType::kF64 : DataType::kF32;
      t.device = s->device;
      t.requiresGrad = false;
      out.push_back(std::move(t));
    }
    if (s->master != nullptr) {
      core::Parameter t;
      t.name = p.name + ".master";
      t.data = s->master;
      t.numel = s->numel;
      t.dtype = DataType::kF32;
      t.device = s->device;
      t.requiresGrad = false;
      out.push_back(std::move(t));
    }
  }
  return out;
}

int64_t FusedOptimizer::stepCount(int param) const {
  if (param < 0 || static_cast<size_t>(param) >= slotOfParam_.size() || slotOfParam_[param] < 0) {
    return -1;
  }
  return effectiveStep(*slots_[slotOfParam_[param]]);
}

void* FusedOptimizer::stateData(int param, int k) const {
  if (param < 0 || static_cast<size_t>(param) >= slotOfParam_.size() || slotOfParam_[param] < 0 ||
      k < 0 || k >= kMaxStates) {
    return nullptr;
  }
  return slots_[slotOfParam_[param]]->state[k];
}

float* FusedOptimizer::masterData(int param) const {
  if (param < 0 || static_cast<size_t>(param) >= slotOfParam_.size() || slotOfParam_[param] < 0) {
    return nullptr;
  }
  return slots_[slotOfParam_[param]]->master;
}

// ---- Save / load
// ---------------------------------------------------------------------------------

namespace {

constexpr char kMagic[8] = {'B', 'A', 'G', 'U', 'A', 'O', 'P', 'T'};
constexpr uint32_t kFormatVersion = 1;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), b, b + sizeof v);
}

void putString(std::vector<uint8_t>& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <class T>
  Status get(T* v, const char* what) {
    if (b_.size() - pos_ < sizeof(T)) {
      return BAGUA_ERROR(kInvalidArgument, "optimizer state: truncated at %s (offset %zu)", what,
                         pos_);
    }
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }
  Status bytes(void* dst, size_t n, const char* what) {
    if (b_.size() - pos_ < n) {
      return BAGUA_ERROR(kInvalidArgument, "optimizer state: truncated in %s (need %zu bytes)",
                         what, n);
    }
    std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
    return Status::ok();
  }
  Status string(std::string* s, const char* what) {
    uint32_t n = 0;
    BAGUA_RETURN_IF_ERROR(get(&n, what));
    s->resize(n);
    return bytes(s->data(), n, what);
  }
  bool atEnd() const { return pos_ == b_.size(); }
  const uint8_t* here() const { return b_.data() + pos_; }
  Status skip(size_t n, const char* what) {
    if (b_.size() - pos_ < n) {
      return BAGUA_ERROR(kInvalidArgument, "optimizer state: truncated in %s", what);
    }
    pos_ += n;
    return Status::ok();
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::vector<uint8_t>> FusedOptimizer::saveState() const {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof kMagic);
  put<uint32_t>(out, kFormatVersion);
  putString(out, ruleName());
  put<uint32_t>(out, static_cast<uint32_t>(numStates()));
  put<uint64_t>(out, slots_.size());
  for (const auto& s : slots_) {
    putString(out, params_[s->param].name);
    put<uint64_t>(out, s->numel);
    put<uint32_t>(out, static_cast<uint32_t>(s->storage));
    put<int64_t>(out, effectiveStep(*s));
    unsigned mask = 0;
    for (int k = 0; k < numStates(); ++k) {
      mask |= s->state[k] != nullptr ? (1u << k) : 0u;
    }
    put<uint32_t>(out, mask);
    put<uint8_t>(out, s->master != nullptr ? 1 : 0);
    const size_t ses = stateElemSize(s->storage);
    for (int k = 0; k < numStates(); ++k) {
      if (s->state[k] != nullptr) {
        const size_t at = out.size();
        out.resize(at + s->numel * ses);
        BAGUA_RETURN_IF_ERROR(toHost(s->device, out.data() + at, s->state[k], s->numel * ses));
      }
    }
    if (s->master != nullptr) {
      const size_t at = out.size();
      out.resize(at + s->numel * 4);
      BAGUA_RETURN_IF_ERROR(toHost(s->device, out.data() + at, s->master, s->numel * 4));
    }
  }
  return out;
}

Status FusedOptimizer::loadState(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  char magic[sizeof kMagic];
  BAGUA_RETURN_IF_ERROR(r.bytes(magic, sizeof magic, "magic"));
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: not a bagua optimizer state");
  }
  uint32_t version = 0;
  BAGUA_RETURN_IF_ERROR(r.get(&version, "version"));
  if (version != kFormatVersion) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: format version %u, expected %u", version,
                       kFormatVersion);
  }
  std::string rule;
  BAGUA_RETURN_IF_ERROR(r.string(&rule, "rule"));
  if (rule != ruleName()) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: saved by '%s', loading into '%s'",
                       rule.c_str(), ruleName());
  }
  uint32_t nstates = 0;
  uint64_t nslots = 0;
  BAGUA_RETURN_IF_ERROR(r.get(&nstates, "state count"));
  BAGUA_RETURN_IF_ERROR(r.get(&nslots, "parameter count"));
  if (nstates != static_cast<uint32_t>(numStates()) || nslots != slots_.size()) {
    return BAGUA_ERROR(kInvalidArgument,
                       "optimizer state: %llu parameters with %u states saved, this optimizer "
                       "has %zu with %d",
                       static_cast<unsigned long long>(nslots), nstates, slots_.size(),
                       numStates());
  }
  // Validate everything before changing anything.
  struct Pending {
    int64_t step;
    std::vector<const uint8_t*> states;
    const uint8_t* master;
  };
  std::vector<Pending> pending;
  for (const auto& s : slots_) {
    std::string name;
    uint64_t numel = 0;
    uint32_t storage = 0, mask = 0;
    int64_t step = 0;
    uint8_t hasMaster = 0;
    BAGUA_RETURN_IF_ERROR(r.string(&name, "name"));
    BAGUA_RETURN_IF_ERROR(r.get(&numel, "numel"));
    BAGUA_RETURN_IF_ERROR(r.get(&storage, "dtype"));
    BAGUA_RETURN_IF_ERROR(r.get(&step, "step"));
    BAGUA_RETURN_IF_ERROR(r.get(&mask, "mask"));
    BAGUA_RETURN_IF_ERROR(r.get(&hasMaster, "master flag"));
    const std::string& want = params_[s->param].name;
    unsigned haveMask = 0;
    for (int k = 0; k < numStates(); ++k) {
      haveMask |= s->state[k] != nullptr ? (1u << k) : 0u;
    }
    if (name != want || numel != s->numel || storage != static_cast<uint32_t>(s->storage) ||
        mask != haveMask || (hasMaster != 0) != (s->master != nullptr) || step < 0) {
      return BAGUA_ERROR(kInvalidArgument,
                         "optimizer state: entry '%s' (%llu elements, dtype %u, states 0x%x) "
                         "does not match parameter '%s' (%zu elements, dtype %d, states 0x%x)",
                         name.c_str(), static_cast<unsigned long long>(numel), storage, mask,
                         want.c_str(), s->numel, static_cast<int>(s->storage), haveMask);
    }
    Pending p{step, std::vector<const uint8_t*>(kMaxStates, nullptr), nullptr};
    const size_t ses = stateElemSize(s->storage);
    for (int k = 0; k < numStates(); ++k) {
      if (s->state[k] != nullptr) {
        p.states[k] = r.here();
        BAGUA_RETURN_IF_ERROR(r.skip(s->numel * ses, "state"));
      }
    }
    if (s->master != nullptr) {
      p.master = r.here();
      BAGUA_RETURN_IF_ERROR(r.skip(s->numel * 4, "master weights"));
    }
    pending.push_back(std::move(p));
  }
  if (!r.atEnd()) {
    return BAGUA_ERROR(kInvalidArgument, "optimizer state: trailing bytes");
  }
  dropPlan();  // the step counts change: runs are split by them
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    s.step = pending[i].step;
    const size_t ses = stateElemSize(s.storage);
    for (int k = 0; k < numStates(); ++k) {
      if (s.state[k] != nullptr) {
        BAGUA_RETURN_IF_ERROR(fromHost(s.device, s.state[k], pending[i].states[k], s.numel * ses));
      }
    }
    if (s.master != nullptr) {
      BAGUA_RETURN_IF_ERROR(fromHost(s.device, s.master, pending[i].master, s.numel * 4));
    }
  }
  return Status::ok();
}

}  // namespace bagua::optim
