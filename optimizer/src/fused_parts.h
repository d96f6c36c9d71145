// FusedOptimizer's private parts (declared in fused_optimizer.h, defined here): the buffers it
// owns, one slot per managed parameter, the partitions fuse() flattens, and the plan of fused
// runs a step follows. Shared by the fused_*.cc files, which split the class along its jobs:
//   fused_optimizer.cc  creation (init: slots, partitions, initial states) and accessors
//   fused_layout.cc     fuse(): flat storage per partition; the plan (runs, singles, AMP scans)
//   fused_step.cc       steps: per run / per tensor, the inf/NaN check, zeroGrad
//   fused_state_io.cc   saveState / loadState
// All of it runs on the thread that owns the optimizer. Private to optimizer/src.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "bagua/optimizer/fused_optimizer.h"
#include "device_memory.h"

namespace bagua::optim {

struct FusedOptimizer::Buffer {
  core::Device device;
  void* ptr = nullptr;
  Buffer(const core::Device& d, void* p) : device(d), ptr(p) {}
  ~Buffer() { detail::deviceFree(device, ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  static Result<std::unique_ptr<Buffer>> make(const core::Device& d, size_t bytes) {
    BAGUA_ASSIGN_OR_RETURN(void* p, detail::deviceAlloc(d, bytes));
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
  core::Device device;
  void* state[kMaxStates] = {};
  float* master = nullptr;
  std::unique_ptr<Buffer> own[kMaxStates];
  std::unique_ptr<Buffer> ownMaster;
  int run = -1;  // index into the current plan's runs, or -1
};

struct FusedOptimizer::Partition {
  int group = 0;
  core::DataType dtype = core::DataType::kF32;
  StorageType storage = StorageType::kF32;
  core::Device device;
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
  // Stepping inside the backward pass: the runs cut at the buckets of `bucketsOf` (the reducer,
  // at its layoutGeneration() `bucketsGeneration`; null: not cut) and listed per bucket
  // (indices into runs / slots), and those of the parameters in no bucket.
  const core::DistributedDataParallel* bucketsOf = nullptr;
  int64_t bucketsGeneration = -1;
  std::vector<std::vector<int>> bucketRuns, bucketSingles;
  std::vector<int> restRuns, restSingles;
  int64_t groupsFused = 0;  // groups with at least one run
  bool intact = true;       // flattenIntact() when built
  // Mixed precision: gradient ranges merged where byte-adjacent, their CPU chunks and results.
  struct Scan {
    KernelArgs args;
    core::Device device;
  };
  struct Chunk {
    size_t scan, begin, end;
  };
  std::vector<Scan> scans;
  std::vector<Chunk> chunks;
  std::vector<uint8_t> bad;
};

}  // namespace bagua::optim
