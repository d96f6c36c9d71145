#include <optional>
#include <set>

#include "bagua/algorithms/algorithms.h"
#include "bagua/algorithms/auto_select.h"
#include "bagua/algorithms/params.h"
#include "bagua/algorithms/qadam.h"

namespace bagua::algo {

namespace {

// Strict kwargs: each getter consumes its key; leftovers are an error.
class Args {
 public:
  Args(const std::string& algorithm, const AlgorithmArgs& args)
      : algorithm_(algorithm), args_(args) {}

  Result<bool> getBool(const std::string& key, bool fallback) {
    accepted_.insert(key);
    auto it = args_.find(key);
    if (it == args_.end()) {
      return fallback;
    }
    const std::string& v = it->second;
    if (v == "true" || v == "True" || v == "1") {
      return true;
    }
    if (v == "false" || v == "False" || v == "0") {
      return false;
    }
    return BAGUA_ERROR(kInvalidArgument, "%s: %s='%s' is not a boolean (true/false/1/0)",
                       algorithm_.c_str(), key.c_str(), v.c_str());
  }

  Result<int> getInt(const std::string& key, int fallback, int min) {
    accepted_.insert(key);
    auto it = args_.find(key);
    if (it == args_.end()) {
      return fallback;
    }
    const std::string& v = it->second;
    size_t used = 0;
    long long value = 0;
    bool ok = !v.empty();
    if (ok) {
      try {
        value = std::stoll(v, &used, 10);
      } catch (...) {
        ok = false;
      }
    }
    if (!ok || used != v.size() || value < min || value > 1000000000LL) {
      return BAGUA_ERROR(kInvalidArgument, "%s: %s='%s' is not an integer in [%d, 1e9]",
                         algorithm_.c_str(), key.c_str(), v.c_str(), min);
    }
    return static_cast<int>(value);
  }

  Result<std::string> getEnum(const std::string& key, const std::string& fallback,
                              const std::vector<std::string>& allowed) {
    accepted_.insert(key);
    auto it = args_.find(key);
    const std::string v = it == args_.end() ? fallback : it->second;
    for (const std::string& a : allowed) {
      if (a == v) {
        return v;
      }
    }
    std::string list;
    for (const std::string& a : allowed) {
      list += (list.empty() ? "" : ", ") + a;
    }
    return BAGUA_ERROR(kInvalidArgument, "%s: %s='%s' is not one of: %s", algorithm_.c_str(),
                       key.c_str(), v.c_str(), list.c_str());
  }

  // The text of `key`, or nullopt when it is absent.
  std::optional<std::string> getString(const std::string& key) {
    accepted_.insert(key);
    auto it = args_.find(key);
    return it == args_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }

  Status checkNoneLeft() const {
    for (const auto& [k, v] : args_) {
      if (accepted_.count(k) == 0) {
        std::string list;
        for (const std::string& a : accepted_) {
          list += (list.empty() ? "" : ", ") + a;
        }
        return BAGUA_ERROR(kInvalidArgument, "%s: unknown parameter '%s' (accepted: %s)",
                           algorithm_.c_str(), k.c_str(), list.empty() ? "none" : list.c_str());
      }
    }
    return Status::ok();
  }

 private:
  std::string algorithm_;
  const AlgorithmArgs& args_;
  std::set<std::string> accepted_;
};

}  // namespace

std::vector<std::string> algorithmNames() {
  return {"gradient_allreduce",
          "bytegrad",
          "decentralized",
          "low_precision_decentralized",
          "qadam",
          "async",
          "powersgd",
          "auto"};
}

Result<std::shared_ptr<core::Algorithm>> createAlgorithm(const std::string& name,
                                                         const AlgorithmArgs& args,
                                                         QAdamOptimizer* qadamOptimizer) {
  Args a(name, args);
  std::shared_ptr<core::Algorithm> out;
  if (name == "gradient_allreduce") {
    BAGUA_ASSIGN_OR_RETURN(bool hierarchical, a.getBool("hierarchical", false));
    BAGUA_ASSIGN_OR_RETURN(bool average, a.getBool("average", true));
    out = std::make_shared<GradientAllReduce>(hierarchical, average);
  } else if (name == "bytegrad") {
    BAGUA_ASSIGN_OR_RETURN(bool hierarchical, a.getBool("hierarchical", true));
    BAGUA_ASSIGN_OR_RETURN(bool average, a.getBool("average", true));
    out = std::make_shared<ByteGrad>(hierarchical, average);
  } else if (name == "decentralized") {
    BAGUA_ASSIGN_OR_RETURN(bool hierarchical, a.getBool("hierarchical", true));
    BAGUA_ASSIGN_OR_RETURN(std::string mode,
                           a.getEnum("peer_selection_mode", "all", {"all", "shift_one"}));
    BAGUA_ASSIGN_OR_RETURN(int interval, a.getInt("communication_interval", 1, 1));
    out = std::make_shared<Decentralized>(
        hierarchical, mode == "all" ? PeerSelection::kAll : PeerSelection::kShiftOne, interval);
  } else if (name == "low_precision_decentralized") {
    BAGUA_ASSIGN_OR_RETURN(bool hierarchical, a.getBool("hierarchical", true));
    BAGUA_ASSIGN_OR_RETURN(int interval, a.getInt("communication_interval", 1, 1));
    out = std::make_shared<LowPrecisionDecentralized>(hierarchical, interval);
  } else if (name == "qadam") {
    BAGUA_ASSIGN_OR_RETURN(bool hierarchical, a.getBool("hierarchical", true));
    if (qadamOptimizer == nullptr) {
      return BAGUA_ERROR(kInvalidArgument,
                         "qadam: pass the QAdamOptimizer that steps the model (qadam.h)");
    }
    // An optimizer option (QAdamOptions::holdZeroVariance), settable here so that the demos'
    // --algo_arg and string-configured front ends reach it; absent: the optimizer's own setting.
    const bool holdGiven = args.count("hold_zero_variance") != 0;
    BAGUA_ASSIGN_OR_RETURN(bool hold, a.getBool("hold_zero_variance", true));
    BAGUA_RETURN_IF_ERROR(a.checkNoneLeft());
    if (holdGiven) {
      qadamOptimizer->setHoldZeroVariance(hold);
    }
    out = std::make_shared<QAdam>(qadamOptimizer, hierarchical);
  } else if (name == "async") {
    BAGUA_ASSIGN_OR_RETURN(std::string mode, a.getEnum("peer_selection_mode", "all", {"all"}));
    BAGUA_ASSIGN_OR_RETURN(int interval, a.getInt("sync_interval_ms", 500, 0));
    BAGUA_ASSIGN_OR_RETURN(int warmup, a.getInt("warmup_steps", 0, 0));
    out = std::make_shared<AsyncModelAverage>(interval, warmup);
  } else if (name == "powersgd") {
    // Its own strict parser (floats, 64-bit seed; unknown keys listed).
    BAGUA_ASSIGN_OR_RETURN(PowerSgdOptions o, parsePowerSgdArgs(args));
    return std::shared_ptr<core::Algorithm>(std::make_shared<PowerSgd>(o));
  } else if (name == "auto") {
    // pin: the argument, else BAGUA_ALGORITHM (empty: measure and choose).
    std::optional<std::string> pin = a.getString("pin");
    std::string source = "pin";
    if (!pin) {
      BAGUA_ASSIGN_OR_RETURN(pin, algorithmsParams().pinnedAlgorithm.get());
      source = "BAGUA_ALGORITHM";
    }
    BAGUA_ASSIGN_OR_RETURN(int64_t probeDefault, algorithmsParams().autoProbeSteps.get());
    BAGUA_ASSIGN_OR_RETURN(int probe, a.getInt("probe_steps", static_cast<int>(probeDefault), 1));
    BAGUA_ASSIGN_OR_RETURN(int startIter, a.getInt("start_iter", -1, 0));
    BAGUA_RETURN_IF_ERROR(a.checkNoneLeft());
    BAGUA_ASSIGN_OR_RETURN(out, AutoSelect::create(*pin, source, probe, startIter));
  } else {
    std::string list;
    for (const std::string& n : algorithmNames()) {
      list += (list.empty() ? "" : ", ") + n;
    }
    return BAGUA_ERROR(kInvalidArgument, "unknown algorithm '%s' (known: %s)", name.c_str(),
                       list.c_str());
  }
  BAGUA_RETURN_IF_ERROR(a.checkNoneLeft());
  return out;
}

}  // namespace bagua::algo
