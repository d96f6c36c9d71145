from .base import Algorithm, _native_impl_class


class GradientAllReduceAlgorithm(Algorithm):
    """All-reduce the gradients bucket by bucket (``average``: mean, else sum)."""

    name = "gradient_allreduce"

    def __init__(self, hierarchical: bool = False, average: bool = True):
        super().__init__()
        self.hierarchical = hierarchical
        self.average = average

    def _kwargs(self):
        return {"hierarchical": self.hierarchical, "average": self.average}


#: The implementation ``GradientAllReduceAlgorithm.reify`` returns (runs in the C++ reducer).
GradientAllReduceAlgorithmImpl = _native_impl_class("gradient_allreduce")
