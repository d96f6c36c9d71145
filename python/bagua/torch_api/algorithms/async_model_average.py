from .base import Algorithm, _native_impl_class


class AsyncModelAverageAlgorithm(Algorithm):
    """Asynchronous model average: a background thread averages the weights every
    ``sync_interval_ms`` after ``warmup_steps`` of gradient all-reduce. Call ``abort(model)``
    on every rank after training and ``resume(model)`` before training again."""

    name = "async"

    def __init__(
        self,
        peer_selection_mode: str = "all",
        sync_interval_ms: int = 500,
        warmup_steps: int = 0,
    ):
        super().__init__()
        if peer_selection_mode != "all":
            raise ValueError(
                "AsyncModelAverageAlgorithm: peer_selection_mode must be 'all' (the only mode)"
            )
        self.peer_selection_mode = peer_selection_mode
        self.sync_interval_ms = sync_interval_ms
        self.warmup_steps = warmup_steps

    def _kwargs(self):
        return {
            "peer_selection_mode": self.peer_selection_mode,
            "sync_interval_ms": self.sync_interval_ms,
            "warmup_steps": self.warmup_steps,
        }

    def _live(self, what):
        if self._ext_algorithm is None:
            raise RuntimeError("{}(): wrap a model with this algorithm first".format(what))
        return self._ext_algorithm

    def abort(self, bagua_ddp=None):
        """Stops the averaging on every rank (collective)."""
        self._live("abort").abort()

    def resume(self, bagua_ddp=None):
        """Starts the averaging again (collective)."""
        self._live("resume").resume()

    def rounds(self):
        return self._live("rounds").rounds()


#: The implementation ``AsyncModelAverageAlgorithm.reify`` returns (runs in the C++ reducer).
AsyncModelAverageAlgorithmImpl = _native_impl_class("async")
