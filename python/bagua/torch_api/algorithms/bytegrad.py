from .base import Algorithm, _native_impl_class


class ByteGradAlgorithm(Algorithm):
    """Gradients averaged with MinMaxUInt8 compression (scatter-reduce / all-gather)."""

    name = "bytegrad"

    def __init__(self, hierarchical: bool = True, average: bool = True):
        super().__init__()
        self.hierarchical = hierarchical
        self.average = average

    def _kwargs(self):
        return {"hierarchical": self.hierarchical, "average": self.average}


#: The implementation ``ByteGradAlgorithm.reify`` returns (runs in the C++ reducer).
ByteGradAlgorithmImpl = _native_impl_class("bytegrad")
