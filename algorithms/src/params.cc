#include "bagua/algorithms/params.h"

namespace bagua::algo {

AlgorithmsParams& algorithmsParams() {
  static AlgorithmsParams params;
  return params;
}

}  // namespace bagua::algo
