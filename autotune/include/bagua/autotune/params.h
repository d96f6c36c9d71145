// The autotune library's parameter catalogue. The first four keys are Bagua's (launcher flags
// --autotune_level, --autotune_max_samples, --autotune_warmup_time,
// --autotune_sampling_confidence_time); the rest are ours. Dump them with `bagua-params`.
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/params.h"

namespace bagua::autotune {

ParamCatalogue& autotuneParams();

struct AutotuneParams {
  static Param<int64_t>& level();                   // BAGUA_AUTOTUNE (0 off, >= 1 on)
  static Param<int64_t>& maxSamples();              // BAGUA_AUTOTUNE_MAX_SAMPLES
  static Param<double>& warmupTimeS();              // BAGUA_AUTOTUNE_WARMUP_TIME_S
  static Param<double>& samplingConfidenceTimeS();  // BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S
  static Param<int64_t>& checkInterval();           // BAGUA_AUTOTUNE_CHECK_INTERVAL
  static Param<int64_t>& initialSamples();          // BAGUA_AUTOTUNE_INITIAL_SAMPLES
  static Param<int64_t>& seed();                    // BAGUA_AUTOTUNE_SEED
  static Param<double>& serverWaitTimeS();          // BAGUA_AUTOTUNE_SERVER_WAIT_TIME
  static Param<std::string>& logFile();             // BAGUA_AUTOTUNE_LOG_FILE
  static Param<std::string>& saveFile();            // BAGUA_AUTOTUNE_SAVE_FILE
  static Param<std::string>& loadFile();            // BAGUA_AUTOTUNE_LOAD_FILE
};

}  // namespace bagua::autotune
