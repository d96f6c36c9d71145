#include "bagua/optimizer/params.h"

namespace bagua::optim {

OptimizerParams& optimizerParams() {
  static OptimizerParams params;
  return params;
}

}  // namespace bagua::optim
