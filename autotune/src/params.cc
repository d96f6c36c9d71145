#include "bagua/autotune/params.h"

namespace bagua::autotune {

namespace {

struct Entries {
  Param<int64_t>* level;
  Param<int64_t>* maxSamples;
  Param<double>* warmupTimeS;
  Param<double>* samplingConfidenceTimeS;
  Param<int64_t>* checkInterval;
  Param<int64_t>* initialSamples;
  Param<int64_t>* seed;
  Param<double>* serverWaitTimeS;
  Param<std::string>* logFile;
  Param<std::string>* saveFile;
  Param<std::string>* loadFile;
};

ParamCatalogue& rawCatalogue() {
  static ParamCatalogue catalogue("autotune",
                                  "Bayesian optimisation of the reducer's bucket layout and knobs");
  return catalogue;
}

Entries& e() {
  static Entries x = [] {
    ParamCatalogue& c = rawCatalogue();
    Entries n{};
    n.level = &c.addInt("BAGUA_AUTOTUNE", 0, 0, 9,
                        "autotune level (Bagua's --autotune_level): 0 off, >= 1 tune the bucket "
                        "size, bucket order and the registered knobs while training runs");
    n.maxSamples =
        &c.addInt("BAGUA_AUTOTUNE_MAX_SAMPLES", 60, 1, 10000,
                  "settings measured before the best one is kept for the rest of the run");
    n.warmupTimeS = &c.addDouble("BAGUA_AUTOTUNE_WARMUP_TIME_S", 30.0, 0.0, 1e6,
                                 "seconds of training before the first measurement (caches, "
                                 "allocator and the one-time bucket rebuild settle)");
    n.samplingConfidenceTimeS =
        &c.addDouble("BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S", 5.0, 0.0, 1e6,
                     "seconds each setting is measured for (its throughput window)");
    n.checkInterval = &c.addInt("BAGUA_AUTOTUNE_CHECK_INTERVAL", 10, 1, 1000000,
                                "iterations between throughput reports through the store (each "
                                "report is one store round trip per rank)");
    n.initialSamples = &c.addInt("BAGUA_AUTOTUNE_INITIAL_SAMPLES", 0, 0, 10000,
                                 "quasi-random (scrambled Halton) settings before the Gaussian "
                                 "process picks them (0: 2 x knobs + 2, at least 3)");
    n.seed = &c.addInt("BAGUA_AUTOTUNE_SEED", 0, 0, INT64_MAX,
                       "seed of the quasi-random start and the acquisition search");
    n.serverWaitTimeS = &c.addDouble("BAGUA_AUTOTUNE_SERVER_WAIT_TIME", 300.0, 1.0, 86400.0,
                                     "how long a rank waits for the others' reports or rank 0's "
                                     "decision in the store before failing");
    n.logFile = &c.addString("BAGUA_AUTOTUNE_LOG_FILE", "",
                             "CSV log of every trial written by rank 0 (empty: none)", "a path");
    n.saveFile = &c.addString("BAGUA_AUTOTUNE_SAVE_FILE", "",
                              "where rank 0 writes the best setting when tuning ends (empty: "
                              "nowhere)",
                              "a path");
    n.loadFile = &c.addString("BAGUA_AUTOTUNE_LOAD_FILE", "",
                              "a best-setting file of an earlier run: rank 0 reads it and every "
                              "rank starts from it (tuning or not)",
                              "a path");
    return n;
  }();
  return x;
}

}  // namespace

ParamCatalogue& autotuneParams() {
  e();
  return rawCatalogue();
}

Param<int64_t>& AutotuneParams::level() {
  return *e().level;
}
Param<int64_t>& AutotuneParams::maxSamples() {
  return *e().maxSamples;
}
Param<double>& AutotuneParams::warmupTimeS() {
  return *e().warmupTimeS;
}
Param<double>& AutotuneParams::samplingConfidenceTimeS() {
  return *e().samplingConfidenceTimeS;
}
Param<int64_t>& AutotuneParams::checkInterval() {
  return *e().checkInterval;
}
Param<int64_t>& AutotuneParams::initialSamples() {
  return *e().initialSamples;
}
Param<int64_t>& AutotuneParams::seed() {
  return *e().seed;
}
Param<double>& AutotuneParams::serverWaitTimeS() {
  return *e().serverWaitTimeS;
}
Param<std::string>& AutotuneParams::logFile() {
  return *e().logFile;
}
Param<std::string>& AutotuneParams::saveFile() {
  return *e().saveFile;
}
Param<std::string>& AutotuneParams::loadFile() {
  return *e().loadFile;
}

}  // namespace bagua::autotune
