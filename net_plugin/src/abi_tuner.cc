// The exported NCCL tuner tables ncclTunerPlugin_v6 ... ncclTunerPlugin_v3: thin adapters over
// tuner::Policy (tuner.h). NCCL finds them in libnccl-net.so when NCCL_TUNER_PLUGIN is unset and
// no libnccl-tuner.so exists. Each entry point is an exception firewall; a bad BAGUA_NET_TUNER*
// value fails init with the key and the accepted values (NCCL then fails the communicator's
// creation with that message rather than silently running untuned).
#include <exception>
#include <new>

#include "bagua/base/params.h"
#include "nccl_tuner_abi.h"
#include "plugin_api.h"
#include "tuner.h"

namespace bagua::net::tuner {
namespace {

struct Context {
  Policy policy;
  ncclDebugLogger_t logger;
};

void say(ncclDebugLogger_t logger, ncclDebugLogLevel level, const char* what,
         const std::string& text) {
  if (logger != nullptr) {
    logger(level, static_cast<unsigned long>(NCCL_INIT) | NCCL_TUNING, __FILE__, __LINE__,
           "TUNER/Bagua %s%s", what, text.c_str());
  }
}

ncclResult_t initCommon(size_t nRanks, size_t nNodes, ncclDebugLogger_t logger,
                        void** ctx) noexcept {
  try {
    if (ctx == nullptr) {
      return ncclInternalError;
    }
    *ctx = nullptr;
    Result<TunerConfig> config = TunerConfig::fromParams();
    if (!config.isOk()) {
      say(logger, NCCL_LOG_WARN, "init failed: ", config.status().message());
      return ncclInvalidUsage;
    }
    auto* c = new Context{Policy(*config, nRanks, nNodes), logger};
    say(logger, NCCL_LOG_INFO, "", c->policy.summary());
    *ctx = c;
    return ncclSuccess;
  } catch (const std::bad_alloc&) {
    return ncclSystemError;
  } catch (...) {
    return ncclInternalError;
  }
}

ncclResult_t getCollInfo(void* ctx, ncclFunc_t collType, size_t nBytes, int /*numPipeOps*/,
                         float** collCostTable, int numAlgo, int numProto, int /*regBuff*/,
                         int* nChannels) noexcept {
  if (ctx == nullptr || collCostTable == nullptr) {
    return ncclInternalError;  // NCCL falls back to its own choice for this collective
  }
  const auto* c = static_cast<const Context*>(ctx);
  // NCCL passes its float[numAlgo][numProto] array cast to float**.
  int cap = c->policy.apply(static_cast<int>(collType), nBytes,
                            reinterpret_cast<float*>(collCostTable), numAlgo, numProto);
  if (cap > 0 && nChannels != nullptr) {
    *nChannels = cap;
  }
  return ncclSuccess;
}

ncclResult_t getCollInfoV3(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                           float** collCostTable, int numAlgo, int numProto,
                           int* nChannels) noexcept {
  return getCollInfo(ctx, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, 0,
                     nChannels);
}

ncclResult_t initV5(void** ctx, uint64_t /*commId*/, size_t nRanks, size_t nNodes,
                    ncclDebugLogger_t logger, ncclNvlDomainInfo_v5_t* /*nvl*/,
                    ncclTunerConstants_v5_t* /*constants*/) noexcept {
  return initCommon(nRanks, nNodes, logger, ctx);
}

ncclResult_t initV3(size_t nRanks, size_t nNodes, ncclDebugLogger_t logger, void** ctx) noexcept {
  return initCommon(nRanks, nNodes, logger, ctx);
}

ncclResult_t finalize(void* ctx) noexcept {
  delete static_cast<Context*>(ctx);
  return ncclSuccess;
}

}  // namespace
}  // namespace bagua::net::tuner

using namespace bagua::net::tuner;  // NOLINT(google-build-using-namespace): adapter tables

extern "C" {

// getChunkSize NULL: our policy picks protocols and channel counts, NCCL keeps its chunk size.
__attribute__((visibility("default"))) ncclTuner_v6_t ncclTunerPlugin_v6 = {
    bagua::net::plugin::kPluginName, initV5, getCollInfo, finalize, nullptr};

__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {
    bagua::net::plugin::kPluginName, initV5, getCollInfo, finalize};

__attribute__((visibility("default"))) ncclTuner_v4_t ncclTunerPlugin_v4 = {
    bagua::net::plugin::kPluginName, initV3, getCollInfo, finalize};

__attribute__((visibility("default"))) ncclTuner_v3_t ncclTunerPlugin_v3 = {
    bagua::net::plugin::kPluginName, initV3, getCollInfoV3, finalize};

}  // extern "C"
