"""``algorithm="auto"``: bagua measures the link and the gradient volume during the first steps
and picks the algorithm (the C++ ``AutoSelect``, algorithms/README.md "algorithm=auto").

    model = model.with_bagua([opt], Algorithm.init("auto"))
    model.bagua_algorithm.decision()   # after the probe: {"algorithm", "args", "reason", ...}

Steps 1-2 run gradient all-reduce untimed; the next two time it bucket by bucket, and the ranks
then check whether the rule's choice could depend on the compute-only step time, which is not
measured yet: where it cannot (the all-reduce is a small part of the step), that is the
decision. Else, where the timed steps agreed within 10% on every rank, one step runs with no
communication to time the compute alone, then the decision; else the timed steps go on to
``probe_steps`` (default 4, ``BAGUA_AUTO_PROBE_STEPS``) and ``max(1, probe_steps // 2)`` steps
without communication follow. In a step without communication the gradient is zeroed on every
rank, so the ranks stay identical (that step's batch is lost to training). Every rank makes the
same choice from the combined figures and logs it with its reason (log category ``algo``, rank 0
at INFO; ``decision()["probe_steps"]`` says how many steps the probe took), and training goes on
from rank 0's weights with the chosen algorithm.
``pin`` (or ``BAGUA_ALGORITHM``) skips the measurement: one of ``gradient_allreduce``,
``bytegrad``, ``powersgd``; another name fails at the wrap, naming the setting.
``start_iter``: the training step (counted from the first, the probe's included) from which a
chosen powersgd compresses, as ``PowerSGDAlgorithm(start_iter=...)``; the default (None) is
powersgd's own (10 steps after the choice). Set it past a learning-rate warm-up: compressing
while the rate still rises slows convergence (bench/RESULTS.md, "Time to accuracy").
"""

from .._ext import ext
from .base import Algorithm, _native_impl_class

#: The names auto chooses among and accepts as a pin.
CANDIDATES = ("gradient_allreduce", "bytegrad", "powersgd")


class AutoAlgorithm(Algorithm):
    """Picks gradient_allreduce, bytegrad or powersgd (and its rank) from measurements."""

    name = "auto"

    def __init__(self, pin: str = None, probe_steps: int = None, start_iter: int = None):
        super().__init__()
        if pin is not None and not isinstance(pin, str):
            raise TypeError("AutoAlgorithm: pin must be an algorithm name (str), got {!r}".format(
                pin))
        if probe_steps is not None and (not isinstance(probe_steps, int) or probe_steps < 1):
            raise ValueError("AutoAlgorithm: probe_steps={!r} must be an integer >= 1".format(
                probe_steps))
        if start_iter is not None and (not isinstance(start_iter, int) or start_iter < 0):
            raise ValueError("AutoAlgorithm: start_iter={!r} must be an integer >= 0".format(
                start_iter))
        self.pin = pin
        self.probe_steps = probe_steps
        self.start_iter = start_iter

    def _kwargs(self):
        kw = {}
        if self.pin is not None:
            kw["pin"] = self.pin
        if self.probe_steps is not None:
            kw["probe_steps"] = self.probe_steps
        if self.start_iter is not None:
            kw["start_iter"] = self.start_iter
        return kw

    def decision(self):
        """The choice of the current wrap: ``{"algorithm": name ("" until the probe is over),
        "args": {...}, "reason": str, "probe_steps": int, "candidates": [{"label", "step_s", "exposed_s", "score",
        ...}, ...]}``."""
        if self._ext_algorithm is None:
            return {"algorithm": "", "args": {}, "reason": "not wrapped yet", "candidates": []}
        return self._ext_algorithm.decision()

    @staticmethod
    def choose(world_size, buckets, compute_s, allreduce_step_s, latency_s, bandwidth,
               codec=None, registered=None, hierarchical=False, element_bytes=4, all_f32=True):
        """The rule on given figures (what-if tables, tests): ``buckets`` is a list of buckets,
        each a list of tensor element counts; times in seconds, ``bandwidth`` the all-reduce's
        bytes per second, ``codec`` the compression throughput (bytes per second; default the
        device figure), ``registered`` the algorithm names to choose among (default: every
        candidate). Returns the decision dict of ``decision()``."""
        kw = {}
        if codec is not None:
            kw["codec"] = float(codec)
        return ext.auto_choose(int(world_size), [[int(n) for n in b] for b in buckets],
                               float(compute_s), float(allreduce_step_s), float(latency_s),
                               float(bandwidth),
                               registered=list(registered if registered is not None
                                               else CANDIDATES),
                               hierarchical=bool(hierarchical), element_bytes=int(element_bytes),
                               all_f32=bool(all_f32), **kw)


#: The implementation ``AutoAlgorithm.reify`` returns (runs in the C++ reducer).
AutoAlgorithmImpl = _native_impl_class("auto")
