#include "bagua/autotune/params.h"

namespace bagua::autotune {

AutotuneParams& autotuneParams() {
  static AutotuneParams params;
  return params;
}

}  // namespace bagua::autotune
