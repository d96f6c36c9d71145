// The built-in rules' optimizers, instantiated once here (so their kernels compile with this
// library's flags: -ffp-contract=off, -fno-trapping-math).
#include "bagua/optimizer/elementwise.h"

namespace bagua::optim {

template class ElementwiseOptimizer<SgdRule>;
template class ElementwiseOptimizer<AdamRule>;
template class ElementwiseOptimizer<AdamWRule>;
template class ElementwiseOptimizer<AdagradRule>;
template class ElementwiseOptimizer<RmspropRule>;
template class ElementwiseOptimizer<AdadeltaRule>;
template class ElementwiseOptimizer<AdamaxRule>;
template class ElementwiseOptimizer<LambRule>;

}  // namespace bagua::optim
