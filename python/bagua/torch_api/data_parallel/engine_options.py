"""``EngineOptions``: how the engine (bagua_distributed.py) runs a wrap."""


class EngineOptions:
    """How the engine runs a wrap, given at the wrap (``with_bagua(..., _engine_options=...)``,
    ``DistributedDataParallel(..., _engine_options=...)``); the defaults are the product. The
    other values are the comparison points the benchmarks (bench/ddp) and tests measure against.

    ``autotune``: autotuning of the C++ reducer's buckets (gradient_allreduce and bytegrad only):
    None follows BAGUA_AUTOTUNE (>= 1: on), True / False force it.
    ``launch_without_waiting``: False runs each bucket's collective to completion before the
    next starts (the sequential reducer; bench/ddp's gradient_allreduce_sync).
    ``in_place_device_buckets``: do_flatten's laid-out CUDA gradients as the reducer's bucket
    storage (no copy in or out; see the module docstring); False copies every bucket in and
    back. Host gradients always run in place.
    ``native_hooks``: the C++ reducer's gradient hooks in C++ (``_bagua_ext.GradReadyHook``, no
    Python per gradient); False: a Python hook per gradient (bench/ddp/hook_cost.py).
    ``step_in_backward``: None follows BAGUA_OPTIM_STEP_IN_BACKWARD; True / False force it.
    """

    __slots__ = ("autotune", "launch_without_waiting", "in_place_device_buckets", "native_hooks",
                 "step_in_backward")

    def __init__(self, *, autotune=None, launch_without_waiting=True,
                 in_place_device_buckets=True, native_hooks=True,
                 step_in_backward=None):
        self.autotune = autotune
        self.launch_without_waiting = bool(launch_without_waiting)
        self.in_place_device_buckets = bool(in_place_device_buckets)
        self.native_hooks = bool(native_hooks)
        self.step_in_backward = step_in_backward


