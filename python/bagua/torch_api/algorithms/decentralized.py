from .base import Algorithm, _native_impl_class


class DecentralizedAlgorithm(Algorithm):
    """Decentralized SGD: weights averaged with peers (``all`` or ``shift_one``) every
    ``communication_interval`` steps, overlapped with forward and backward."""

    name = "decentralized"

    def __init__(
        self,
        hierarchical: bool = True,
        peer_selection_mode: str = "all",
        communication_interval: int = 1,
    ):
        super().__init__()
        if peer_selection_mode not in ("all", "shift_one"):
            raise ValueError(
                "DecentralizedAlgorithm: peer_selection_mode must be 'all' or 'shift_one', "
                "got {!r}".format(peer_selection_mode)
            )
        self.hierarchical = hierarchical
        self.peer_selection_mode = peer_selection_mode
        self.communication_interval = communication_interval

    def _kwargs(self):
        return {
            "hierarchical": self.hierarchical,
            "peer_selection_mode": self.peer_selection_mode,
            "communication_interval": self.communication_interval,
        }


class LowPrecisionDecentralizedAlgorithm(Algorithm):
    """Low-precision decentralized SGD on a ring (compressed differences, after the step)."""

    name = "low_precision_decentralized"

    def __init__(self, hierarchical: bool = True, communication_interval: int = 1):
        super().__init__()
        self.hierarchical = hierarchical
        self.communication_interval = communication_interval

    def _kwargs(self):
        return {
            "hierarchical": self.hierarchical,
            "communication_interval": self.communication_interval,
        }

    def replicas(self):
        """My replica, my left and my right neighbour's (flattened), for tests."""
        if self._ext_algorithm is None:
            raise RuntimeError("replicas(): wrap a model with this algorithm first")
        return self._ext_algorithm.replicas()


#: The implementations the two classes' ``reify`` return (run in the C++ reducer).
DecentralizedAlgorithmImpl = _native_impl_class("decentralized")
LowPrecisionDecentralizedAlgorithmImpl = _native_impl_class("low_precision_decentralized")
