// The autotune library's parameter catalogue. The first four keys are Bagua's (launcher flags
// --autotune_level, --autotune_max_samples, --autotune_warmup_time,
// --autotune_sampling_confidence_time); the rest are ours. Dump them with `bagua-params`.
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/logging.h"
#include "bagua/base/params.h"

namespace bagua::autotune {

// The library's knobs, each declared once (bagua/base/params.h): read them as
// autotuneParams().level.get().
struct AutotuneParams : ParamCatalogue {
  AutotuneParams()
      : ParamCatalogue("autotune",
                       "Bayesian optimisation of the reducer's bucket layout and knobs") {}

  IntParam level{*this,
                 "BAGUA_AUTOTUNE",
                 0,
                 {0, 9},
                 "autotune level (Bagua's --autotune_level): 0 off, >= 1 tune the bucket "
                 "size, bucket order and the registered knobs while training runs"};
  IntParam maxSamples{*this,
                      "BAGUA_AUTOTUNE_MAX_SAMPLES",
                      60,
                      {1, 10000},
                      "settings measured before the best one is kept for the rest of the run"};
  DoubleParam warmupTimeS{*this,
                          "BAGUA_AUTOTUNE_WARMUP_TIME_S",
                          30.0,
                          {0.0, 1e6},
                          "seconds of training before the first measurement (caches, "
                          "allocator and the one-time bucket rebuild settle)"};
  DoubleParam samplingConfidenceTimeS{
      *this,
      "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S",
      5.0,
      {0.0, 1e6},
      "seconds each setting is measured for (its throughput window)"};
  IntParam checkInterval{*this,
                         "BAGUA_AUTOTUNE_CHECK_INTERVAL",
                         10,
                         {1, 1000000},
                         "iterations between throughput reports through the store (each "
                         "report is one store round trip per rank; Bagua: 100)"};
  IntParam initialSamples{*this,
                          "BAGUA_AUTOTUNE_INITIAL_SAMPLES",
                          0,
                          {0, 10000},
                          "quasi-random (scrambled Halton) settings before the Gaussian "
                          "process picks them (0: 2 x knobs + 2, at least 3)"};
  IntParam seed{*this,
                "BAGUA_AUTOTUNE_SEED",
                0,
                {0, INT64_MAX},
                "seed of the quasi-random start and the acquisition search"};
  DoubleParam serverWaitTimeS{*this,
                              "BAGUA_AUTOTUNE_SERVER_WAIT_TIME",
                              300.0,
                              {1.0, 86400.0},
                              "how long a rank waits for the others' reports or rank 0's "
                              "decision in the store before failing"};
  StringParam logFile{*this, "BAGUA_AUTOTUNE_LOG_FILE", "",
                      "CSV log of every trial written by rank 0 (empty: none)", "a path"};
  StringParam saveFile{*this, "BAGUA_AUTOTUNE_SAVE_FILE", "",
                       "where rank 0 writes the best setting when tuning ends (empty: "
                       "nowhere)",
                       "a path"};
  StringParam loadFile{*this, "BAGUA_AUTOTUNE_LOAD_FILE", "",
                       "a best-setting file of an earlier run: rank 0 reads it and every "
                       "rank starts from it (tuning or not)",
                       "a path"};
};
AutotuneParams& autotuneParams();

// The autotuner's log category (BAGUA_LOG_SUBSYS name "tune").
inline const LogCategory kLogTune{"tune"};

}  // namespace bagua::autotune
