// FusedOptimizer: creation (slots, partitions, initial states) and the accessors. The rest of the
// class is in fused_layout.cc, fused_step.cc and fused_state_io.cc (fused_parts.h).
#include "bagua/optimizer/fused_optimizer.h"

#include <algorithm>
#include <map>
#include <thread>
#include <tuple>

#include "bagua/optimizer/cuda.h"
#include "bagua/optimizer/params.h"
#include "cuda_ops.h"
#include "fused_parts.h"

namespace bagua::optim {

using core::DataType;
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

FusedOptimizer::FusedOptimizer(std::vector<core::Parameter>& params,
                               std::vector<std::vector<int>> groups,
                               const OptimizerOptions& options)
    : params_(params), groupParams_(std::move(groups)), options_(options) {}

FusedOptimizer::~FusedOptimizer() {
  for (size_t dev = 0; dev < bwStreams_.size(); ++dev) {
    cudaDestroyStream(static_cast<int>(dev), bwStreams_[dev]);
  }
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
      if (p.device.type == DeviceType::kCuda) {
        // Loads the CUDA half on the first CUDA parameter; its error names what is missing.
        const Result<detail::CudaOps*> cuda = detail::cudaOps();
        if (!cuda.isOk() || !hasCudaKernel()) {
          return BAGUA_ERROR(
              kInvalidArgument, "%s: parameter '%s' is on cuda:%d but %s", ruleName(),
              p.name.c_str(), p.device.index,
              cuda.isOk() ? "this rule has no CUDA kernel" : cuda.status().message().c_str());
        }
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
      const size_t es = detail::stateElemSize(*st);
      for (int k = 0; k < numStates(); ++k) {
        if (((mask >> k) & 1u) == 0) {
          continue;
        }
        BAGUA_ASSIGN_OR_RETURN(slot->own[k], Buffer::make(p.device, p.numel * es));
        slot->state[k] = slot->own[k]->ptr;
        BAGUA_RETURN_IF_ERROR(detail::fillState(p.device, slot->state[k], p.numel, *st,
                                                initialState(static_cast<int>(gi), k)));
      }
      if (detail::isHalfLike(*st) && options_.masterWeights) {
        BAGUA_ASSIGN_OR_RETURN(slot->ownMaster, Buffer::make(p.device, p.numel * 4));
        slot->master = static_cast<float*>(slot->ownMaster->ptr);
        BAGUA_RETURN_IF_ERROR(detail::initMaster(p.device, slot->master, p.data, p.numel, *st));
      }
      slotOfParam_[pi] = static_cast<int>(slots_.size());
      partitions_[slot->partition]->slots.push_back(static_cast<int>(slots_.size()));
      slots_.push_back(std::move(slot));
    }
  }
  return Status::ok();
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

}  // namespace bagua::optim
