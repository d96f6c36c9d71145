"""Bagua's algorithm interface: ``Algorithm`` (the user's arguments) and ``AlgorithmImpl`` (what
``reify(process_group)`` returns, with the hooks), plus ``GlobalAlgorithmRegistry``.

A user-written algorithm derives from both, as in Bagua's tutorial, and runs on the Python
engine (``data_parallel/_python_engine.py``, ``bucket.py``). The built-in algorithms reify to
``_NativeImpl`` subclasses: the wrapper hands them to the C++ reducer (``algorithms/`` library,
built by name through ``createAlgorithm``); a later wrap of the same model with another
algorithm (Bagua's model switch) builds a fresh one.
"""

from .._ext import ext

__all__ = ["Algorithm", "AlgorithmImpl", "GlobalAlgorithmRegistry"]


def _arg(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class Algorithm:
    """The base of every algorithm. Subclasses implement ``reify(process_group)``."""

    #: The name the C++ factory knows (built-in algorithms only).
    name = None
    _ext_algorithm = None

    def reify(self, process_group):
        """The implementation of this algorithm on ``process_group`` (an ``AlgorithmImpl``).
        Built-in algorithms return their native implementation."""
        if self.name is None:
            raise NotImplementedError("{} must implement reify(process_group)".format(
                type(self).__name__))
        return _native_impl_class(self.name)(process_group, self)

    @classmethod
    def init(cls, name, **kwargs):
        """Builds a registered algorithm by name (Bagua's ``Algorithm.init``)."""
        return GlobalAlgorithmRegistry.get(name)(**kwargs)

    # -- built-in algorithms: the C++ side ------------------------------------------------------

    def _kwargs(self):
        return {}

    def _qadam(self):
        return None

    def _make_ext(self):
        """A fresh C++ algorithm for one wrap."""
        args = {k: _arg(v) for k, v in self._kwargs().items()}
        q = self._qadam()
        self._ext_algorithm = ext.Algorithm(self.name, args, q._ext if q is not None else None)
        return self._ext_algorithm

    def __repr__(self):
        return "{}({})".format(
            type(self).__name__, ", ".join("{}={!r}".format(k, v) for k, v in self._kwargs().items())
        )


class AlgorithmImpl:
    """An algorithm on a process group: the hooks the wrapper calls (Bagua's contract).

    Defaults (gradient all-reduce shaped, as Bagua's): ``init_tensors`` makes every trainable
    parameter a Bagua tensor whose effective tensor is its gradient (reverse order);
    ``tensors_to_buckets`` follows the suggested bucketing; ``init_backward_hook`` marks a
    parameter's tensor ready; ``init_post_backward_hook`` waits for the module's pending
    operations; the other hooks do nothing; ``init_operations`` registers none.
    """

    def __init__(self, process_group):
        self.process_group = process_group

    def need_reset(self):
        """True to run every initialisation again before the next training forward."""
        return False

    def init_tensors(self, bagua_ddp):
        """The Bagua tensors to communicate."""
        params = bagua_ddp.bagua_build_params()
        tensors = []
        for name, p in reversed(params):
            tensors.append(p.bagua_ensure_grad().ensure_bagua_tensor(
                name, bagua_ddp.bagua_module_name,
                getter_closure=lambda p: p.grad,
                setter_closure=lambda p, t: setattr(p, "grad", t)))
        self._communication_tensor_names = set(name for name, _ in params)
        if len(self._communication_tensor_names) != len(tensors):
            raise ValueError("bagua: tensor names must be unique")
        return tensors

    def tensors_to_buckets(self, tensors, do_flatten):
        """Buckets from the suggested grouping (a list of lists of Bagua tensors)."""
        from ..bucket import BaguaBucket

        return [BaguaBucket(b, flatten=do_flatten, name=str(i)) for i, b in enumerate(tensors)]

    def init_forward_pre_hook(self, bagua_ddp):
        """A function of the forward's inputs, run before each training forward."""

        def hook(input):
            pass

        return hook

    def init_backward_hook(self, bagua_ddp):
        """A function of (parameter name, parameter), run when its gradient is ready."""

        def hook(parameter_name, parameter):
            if parameter_name in self._communication_tensor_names:
                parameter.bagua_mark_communication_ready()

        return hook

    def init_post_backward_hook(self, bagua_ddp):
        """A function of no argument, run when backward is done."""

        def hook():
            bagua_ddp._bagua_backend.wait_pending_comm_ops()

        return hook

    def init_post_optimizer_step_hook(self, bagua_ddp):
        """A function of the optimizer, run after each ``optimizer.step()``."""

        def hook(optimizer):
            pass

        return hook

    def init_operations(self, bagua_ddp, bucket):
        """Registers the operations of ``bucket`` (``bucket.append_*_op``)."""


_HOOKS = ("need_reset", "init_tensors", "tensors_to_buckets", "init_forward_pre_hook",
          "init_backward_hook", "init_post_backward_hook", "init_post_optimizer_step_hook",
          "init_operations")


class _NativeImpl(AlgorithmImpl):
    """A built-in algorithm: runs in the C++ reducer. Its hooks are Bagua's defaults for the
    interface's sake; the reducer does the work."""

    _native_name = None

    def __init__(self, process_group, algorithm=None, **kwargs):
        super().__init__(process_group)
        if algorithm is None:  # built directly, as Bagua's XAlgorithmImpl(pg, **kwargs)
            algorithm = GlobalAlgorithmRegistry.get(self._native_name)(**kwargs)
        self._algorithm = algorithm
        for k, v in algorithm._kwargs().items():
            setattr(self, k, v)

    def _overrides_hooks(self):
        """True when a subclass replaced a hook (it would not run: refuse it)."""
        for h in _HOOKS:
            mine = getattr(type(self), h)
            if mine is not getattr(_native_impl_class(self._native_name), h, mine):
                return True
        return False

    def _qadam_optimizer(self):
        return self._algorithm._qadam()

    def __getattr__(self, name):
        # abort / resume / rounds / replicas and the like live on the algorithm object.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_algorithm"], name)


_IMPL_NAMES = {
    "gradient_allreduce": "GradientAllReduceAlgorithmImpl",
    "bytegrad": "ByteGradAlgorithmImpl",
    "decentralized": "DecentralizedAlgorithmImpl",
    "low_precision_decentralized": "LowPrecisionDecentralizedAlgorithmImpl",
    "qadam": "QAdamAlgorithmImpl",
    "async": "AsyncModelAverageAlgorithmImpl",
    "powersgd": "PowerSGDAlgorithmImpl",
    "auto": "AutoAlgorithmImpl",
}
_IMPLS = {}


def _native_impl_class(name):
    if name not in _IMPLS:
        _IMPLS[name] = type(_IMPL_NAMES.get(name, "NativeAlgorithmImpl"), (_NativeImpl,),
                            {"_native_name": name, "__module__": __name__})
    return _IMPLS[name]


class _UnknownAlgorithm(KeyError, ValueError):
    def __str__(self):
        return self.args[0]


class _AlgorithmRegistry(dict):
    """name -> {"algorithm": class, "description": str} (Bagua's registry)."""

    def register(self, name, algorithm, description=None):
        if not (name is None or isinstance(name, str)):
            raise TypeError("`name` must be a str, found {}".format(name))
        if name in self:
            raise ValueError("'{}' is already present in the registry.".format(name))
        self[name] = {"algorithm": algorithm, "description": description or ""}

    def get(self, name):
        """The class registered as ``name`` (KeyError naming the known ones otherwise)."""
        if name in self:
            return self[name]["algorithm"]
        raise _UnknownAlgorithm("'{}' not found in registry. Available names (known): {}".format(
            name, ", ".join(sorted(self.keys())) or "none"))

    def available_algorithms(self):
        return list(self.keys())

    def __str__(self):
        return "Registered Algorithms: {}".format(", ".join(self.keys()))


GlobalAlgorithmRegistry = _AlgorithmRegistry()
