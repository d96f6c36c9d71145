// The algorithms library's parameter catalogue (bagua-params dumps it).
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include <cstdint>
#include <string>

#include "bagua/base/params.h"

namespace bagua::algo {

// The library's knobs, each declared once (bagua/base/params.h): read them as
// algorithmsParams().pinnedAlgorithm.get().
struct AlgorithmsParams : ParamCatalogue {
  AlgorithmsParams()
      : ParamCatalogue("algorithms", "communication algorithms and the auto selection") {}

  StringParam pinnedAlgorithm{
      *this, "BAGUA_ALGORITHM", "",
      "Pins what algorithm=\"auto\" runs: empty lets auto measure the link and the gradient "
      "volume during its first steps and pick; a name (gradient_allreduce, bytegrad, powersgd) "
      "skips the measurement and runs that algorithm with its defaults. Set it to keep a choice "
      "auto logged once, or to compare against auto's pick. The algorithm's own `pin` argument "
      "overrides it.",
      "empty, or gradient_allreduce, bytegrad, powersgd (checked when auto is created)"};
  IntParam autoProbeSteps{
      *this,
      "BAGUA_AUTO_PROBE_STEPS",
      4,
      {1, 1000},
      "Most steps auto times with gradient all-reduce after two warm-up steps. After the first "
      "two it decides at once where its choice cannot depend on the compute time (the all-reduce "
      "is a small part of the step), or times one step without communication and decides where "
      "the timed steps agree within 10%; else it times them all, then half as many (at least "
      "one) without communication. More steps average out a noisy machine; each step without "
      "communication applies a zero gradient on every rank (its batch is lost to training). The "
      "algorithm's `probe_steps` argument overrides it."};
};
AlgorithmsParams& algorithmsParams();

}  // namespace bagua::algo
