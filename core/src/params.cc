#include "bagua/core/params.h"

namespace bagua::core {

CoreParams& coreParams() {
  static CoreParams params;
  return params;
}

}  // namespace bagua::core
