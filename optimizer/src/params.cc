#include "bagua/optimizer/params.h"

namespace bagua::optim {

namespace {

struct Catalogue {
  ParamCatalogue catalogue{"optimizer", "generic fused optimizer (CPU kernels)"};
  Param<int64_t>& threads = catalogue.addInt(
      "BAGUA_OPTIM_THREADS", 0, 0, 256,
      "CPU threads that run one optimizer step (the caller plus named bagua-optim-N workers); "
      "0 uses the hardware concurrency, at most 32. OptimizerOptions::threads overrides it.");
  Param<int64_t>& chunk =
      catalogue.addInt("BAGUA_OPTIM_CHUNK_ELEMENTS", 32768, 1024, int64_t{1} << 30,
                       "Elements per CPU work chunk: ranges shorter than this run on one thread. "
                       "OptimizerOptions::chunkElements overrides it.");
  Param<int64_t>& timeout = catalogue.addInt(
      "BAGUA_OPTIM_WAIT_TIMEOUT_MS", 120000, 100, int64_t{24} * 3600 * 1000,
      "Deadline for one parallel kernel on the CPU pool; running past it is reported as "
      "DeadlineExceeded (chunks are pure computation, so it means a starved machine or a bug).");
};

Catalogue& catalogue() {
  static Catalogue c;
  return c;
}

}  // namespace

ParamCatalogue& optimizerParams() {
  return catalogue().catalogue;
}
Param<int64_t>& optimThreads() {
  return catalogue().threads;
}
Param<int64_t>& optimChunkElements() {
  return catalogue().chunk;
}
Param<int64_t>& optimWaitTimeoutMs() {
  return catalogue().timeout;
}

}  // namespace bagua::optim
