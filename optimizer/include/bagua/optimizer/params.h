// The optimizer library's parameter catalogue (bagua-params dumps it).
#pragma once

#include <cstdint>

#include "bagua/base/params.h"

namespace bagua::optim {

ParamCatalogue& optimizerParams();

// BAGUA_OPTIM_THREADS: CPU threads per optimizer (0: hardware concurrency, at most 32).
Param<int64_t>& optimThreads();
// BAGUA_OPTIM_CHUNK_ELEMENTS: elements per CPU work chunk.
Param<int64_t>& optimChunkElements();
// BAGUA_OPTIM_WAIT_TIMEOUT_MS: deadline of one parallel kernel on the CPU pool.
Param<int64_t>& optimWaitTimeoutMs();

}  // namespace bagua::optim
