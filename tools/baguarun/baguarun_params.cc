#include "baguarun_params.h"

namespace bagua::baguarun {

BaguarunParams& baguarunParams() {
  static BaguarunParams params;
  return params;
}

}  // namespace bagua::baguarun
