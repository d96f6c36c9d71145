// The optimizer library's parameter catalogue (bagua-params dumps it).
#pragma once

#include <cstdint>

#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"

namespace bagua::optim {

// The library's knobs, each declared once (bagua/base/params.h): read them as
// optimizerParams().threads.get().
struct OptimizerParams : ParamCatalogue {
  OptimizerParams() : ParamCatalogue("optimizer", "generic fused optimizer (CPU kernels)") {}

  IntParam threads{
      *this,
      "BAGUA_OPTIM_THREADS",
      0,
      {0, 256},
      "CPU threads that run one optimizer step (the caller plus named bagua-optim-N workers); "
      "0 uses the hardware concurrency, at most 32. OptimizerOptions::threads overrides it."};
  IntParam chunkElements{*this,
                         "BAGUA_OPTIM_CHUNK_ELEMENTS",
                         32768,
                         {1024, int64_t{1} << 30},
                         "Elements per CPU work chunk: ranges shorter than this run on one thread. "
                         "OptimizerOptions::chunkElements overrides it."};
  IntParam waitTimeoutMs{
      *this,
      "BAGUA_OPTIM_WAIT_TIMEOUT_MS",
      120000,
      {100, int64_t{24} * 3600 * 1000},
      "Deadline for one parallel kernel on the CPU pool; running past it is reported as "
      "DeadlineExceeded (chunks are pure computation, so it means a starved machine or a bug)."};
  BoolParam stepInBackward{
      *this, "BAGUA_OPTIM_STEP_IN_BACKWARD", false,
      "On: with gradient all-reduce or ByteGrad and a fused optimizer (Python: fuse_optimizer on "
      "a with_bagua model; C++: FusedOptimizer beside the reducer), step each bucket's "
      "parameters as soon as that bucket is reduced, inside the backward pass, while later "
      "buckets still communicate; the weights are the same bits as stepping after backward. A "
      "step that needs every gradient first (a GradScaler, gradient clipping, gradient "
      "accumulation without no_sync) steps after backward with a logged reason. Off (the "
      "default): step after backward. The per-bucket steps add kernel launches beside the "
      "communication's; turn it on where the optimizer's step is a large share of a step that "
      "waits on a slow link, and keep it if the step time drops (bench/ddp/compare.py measures "
      "both: the _fused and _fused_after contestants)."};
};
OptimizerParams& optimizerParams();

// The fused optimizer's log category (BAGUA_LOG_SUBSYS name "optim").
inline const LogCategory kLogOptim{"optim"};

}  // namespace bagua::optim
