"""The engine behind ``with_bagua`` and ``DistributedDataParallel`` (Bagua's
``BaguaDistributedDataParallel``).

``algorithm.reify(process_group)`` gives the algorithm implementation. The built-in ones
(``algorithms/*``: ``_NativeImpl``) run in the C++ reducer; any other ``AlgorithmImpl`` (a
user-written algorithm) runs on Bagua's hook protocol in Python (``_PythonEngine``).

C++ reducer, CPU models: core::DistributedDataParallel with the C++ algorithm. Python
registers autograd hooks that mark each gradient ready (post-accumulate-grad hooks where torch
has them, the AccumulateGrad node's hook otherwise), queues an end-of-backward callback that
waits for the buckets, patches ``optimizer.step`` to run the post-step hook, and runs the
forward-pre hook from a module forward-pre hook (training mode with grad enabled only).
CUDA models: the same C++ reducer on the NCCL group (device buckets; gradient copies ordered
after torch's current stream with CUDA events). ``EngineOptions(cuda_reducer="python")`` selects
``DeviceReducer`` instead (gradient_allreduce only, in Python over the NCCL communicator; kept
as a comparison point for the benchmark).

Autotuning (``BAGUA_AUTOTUNE`` >= 1, Bagua's variable, and the other ``BAGUA_AUTOTUNE_*``):
gradient_allreduce and bytegrad wraps get the C++ ``autotune`` library's tuner, which searches
the bucket size and order while training runs (rank 0's Bayesian optimiser, decisions through
the group's store) and switches every rank's buckets at the same iteration, starting from the
wrap's bucket size; it runs after each optimizer step.

Parameter memory: the reducer holds the parameters' (and buffers') data pointers, and keeps a
reference to each tensor it was given so that memory stays alive. When a parameter's memory is
replaced after the wrap (``fuse_optimizer`` after ``with_bagua``, Bagua's documented order;
``p.data = ...``; ``.half()``; ``.to()``), the next forward or optimizer step rebuilds the
reducer on the new memory (a collective: every rank does the same replacement, so every rank
rebuilds at the same step; rank 0's weights are broadcast again, as at the wrap). A parameter
that changed shape is an error that names it.

``do_flatten`` (``gradient_as_bucket_view``) lays out at the wrap what Bagua's flattened
buckets hold, in bucket order (the reverse of registration order), one buffer per (dtype,
device): the gradients for the gradient algorithms (gradient_allreduce, bytegrad, qadam), the
weights for those that communicate weights (decentralized, low_precision_decentralized, async).
A laid-out gradient is remembered on its parameter (``_bagua_grad_view``, also set by
``fuse_optimizer(do_flatten=True)``, the latest layout wins). The views the wrap laid out are
given to the C++ reducer as the gradients' homes while they are still the parameters'
``_bagua_grad_view`` (kept alive as long as the reducer): a bucket whose tensors' homes lie back
to back in its order runs in place there, with no copy of its gradients into reducer storage
and none back. When the reducer's layout changes (the rebuild in gradient-ready order after the
first iteration, an autotune switch) and a bucket no longer lines up, the wrap's gradients are
laid out again as Bagua flattens them, one buffer per bucket in its order (values kept, a None
gradient left None). A ``fuse_optimizer`` layout made after the wrap is never re-laid: those
buckets are copied. A gradient autograd allocates after ``zero_grad(set_to_none=True)``
(torch 2's default) is copied to its home when ready, and the parameter's ``.grad`` is
re-pointed at the home when backward ends, as torch DDP's gradient_as_bucket_view does. CUDA
buckets do the same unless ``EngineOptions.in_place_device_buckets`` is turned off. What the layout also
changes is what code that looks at the memory sees (``fuse_optimizer`` fuses only runs adjacent
in its own order in weights and gradients, as in Bagua).
"""

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
    ``cuda_reducer``: "core" (the C++ reducer) or "python" (``device_reducer.DeviceReducer``)
    for CUDA models.
    ``step_in_backward``: None follows BAGUA_OPTIM_STEP_IN_BACKWARD; True / False force it.
    """

    __slots__ = ("autotune", "launch_without_waiting", "in_place_device_buckets", "native_hooks",
                 "cuda_reducer", "step_in_backward")

    def __init__(self, *, autotune=None, launch_without_waiting=True,
                 in_place_device_buckets=True, native_hooks=True, cuda_reducer="core",
                 step_in_backward=None):
        if cuda_reducer not in ("core", "python"):
            raise ValueError("EngineOptions: cuda_reducer={!r} must be 'core' or 'python'".format(
                cuda_reducer))
        self.autotune = autotune
        self.launch_without_waiting = bool(launch_without_waiting)
        self.in_place_device_buckets = bool(in_place_device_buckets)
        self.native_hooks = bool(native_hooks)
        self.cuda_reducer = cuda_reducer
        self.step_in_backward = step_in_backward


_reducers_made = 0  # names each reducer's tuner (store keys), equal across ranks

import contextlib
import struct
import weakref

import torch

from .._ext import ext
from .. import communication as comm
from .. import env
from ..algorithms import Algorithm, AlgorithmImpl, GradientAllReduceAlgorithm
from ..algorithms.base import _NativeImpl
from ..utils import _lay_out, _lay_out_grads, _lay_out_weights


def _autotune_arg(autotune):
    """The reducer's autotune argument: -1 follows BAGUA_AUTOTUNE, 1 / 0 force it."""
    return -1 if autotune is None else int(bool(autotune))


def _ignored_names(module):
    names = []
    for attr in ("_bagua_params_and_buffers_to_ignore", "_ddp_params_and_buffers_to_ignore"):
        names.extend(getattr(module, attr, []) or [])
    return names


def _spec(name, t, grad_ptr=0):
    dev_type = 1 if t.is_cuda else 0
    dev_index = t.device.index if t.is_cuda else 0
    return (name, t.data_ptr(), grad_ptr, t.numel(), comm.dtype_code(t.dtype), dev_type,
            dev_index or 0, t.requires_grad)


def _broadcast_optimizer_state(optimizers, group):
    """Every rank takes rank 0's optimizer state (tensors directly, other values pickled)."""
    from ..algorithms.q_adam import QAdamOptimizer

    for opt in optimizers:
        if isinstance(opt, QAdamOptimizer):
            continue  # its state lives in the core; the reducer broadcasts it
        state = getattr(opt, "state", {})
        scalars = {}
        for gi, g in enumerate(opt.param_groups):
            for pi, p in enumerate(g["params"]):
                st = state.get(p, {})
                for k in sorted(st):
                    v = st[k]
                    if isinstance(v, torch.Tensor):
                        if v.is_contiguous() and not v.is_cuda:
                            comm.broadcast(v, 0, group)
                        else:
                            tmp = v.detach().contiguous()
                            comm.broadcast(tmp, 0, group)
                            v.copy_(tmp)
                    else:
                        scalars[(gi, pi, k)] = v
        if scalars:
            got = comm.broadcast_object(scalars, 0, group)
            for (gi, pi, k), v in got.items():
                p = opt.param_groups[gi]["params"][pi]
                state.setdefault(p, {})[k] = v


def _raw_step(opt, func, held):
    """A no-argument callable running ``opt``'s own step (``func`` unbound, or ``held``),
    holding ``opt`` weakly."""
    if func is None:
        return held
    ref = weakref.ref(opt)
    return lambda: func(ref())


class _PatchedStep:
    """``optimizer.step`` after the wrap: the original step, then the algorithm's post-step
    hook. Shaped like a bound method (``__self__``, ``__func__``) because torch's LR schedulers
    re-wrap ``optimizer.step`` through them (a scheduler made after ``with_bagua``, as in
    Bagua's examples), but it holds the optimizer weakly: a bound method stored on the optimizer
    would be a cycle keeping the optimizer's state until the garbage collector runs."""

    def __init__(self, func, opt):
        self.__func__ = func
        self._opt = weakref.ref(opt)
        self.__name__ = self.__qualname__ = "step"
        self.__doc__ = func.__doc__

    @property
    def __self__(self):
        return self._opt()

    def __call__(self, *args, **kwargs):
        return self.__func__(self._opt(), *args, **kwargs)


def _check_devices(named_params, stream):
    """CUDA parameters must live on the device of the group's NCCL communicator (its stream's):
    NCCL would read another device's memory (an illegal memory access that kills the process).
    Both engines call it before their first collective (and the native one at every rebuild)."""
    want = getattr(stream, "device", None)
    if want is None:
        return
    for n, p in named_params:
        if p.is_cuda and p.device != want:
            raise RuntimeError(
                "bagua: parameter {!r} is on {} but the process group communicates on {} (the "
                "device selected at init_process_group: the script's torch.cuda.set_device() "
                "before it, else LOCAL_RANK's); move the model there (model.to({!r})) or call "
                "torch.cuda.set_device() before bagua.init_process_group()".format(
                    n, p.device, want, str(want)))


def _grad_hook(p, fn):
    """Calls ``fn()`` once p's gradient is accumulated (returns (handle, keep-alive)). ``fn``
    must not hold ``p`` strongly: from torch 2.1 the hook lives on ``p`` itself (a cycle would
    keep the parameter until the garbage collector runs)."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(lambda *_: fn()), None
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    return acc.register_hook(lambda *_: fn()), acc


def _native_grad_hook(p, state, index):
    """The C++ hook (``_bagua_ext.GradReadyHook``) that hands p's gradient to the reducer when it
    is accumulated, running no Python (python/src/ext_hooks.cc); returns (handle, keep-alive).
    From torch 2.1 torch passes the parameter to it; before, the AccumulateGrad node's hook gets
    gradients only, so the hook holds the parameter weakly."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(ext.GradReadyHook(state, index)), None
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    return acc.register_hook(ext.GradReadyHook(state, index, weakref.ref(p))), acc


class BaguaDistributedDataParallel:
    """One wrap of ``module`` with ``algorithm`` (see the module docstring).

    Bagua's attributes: ``module``, ``bagua_module_name``, ``bagua_algorithm`` (the
    ``AlgorithmImpl``), ``bagua_optimizers``, ``bagua_buckets``, ``bagua_train_step_counter``,
    ``parameters_to_ignore``, ``require_backward_grad_sync`` (False: gradients accumulate
    locally, as inside ``no_sync()``), ``bagua_build_params()``.
    """

    def __init__(
        self,
        module,
        optimizers,
        algorithm,
        process_group=None,
        bagua_module_name=None,
        gradient_as_bucket_view=True,
        find_unused_parameters=False,
        bucket_cap_mb=None,
        broadcast_buffers=False,
        first_bucket_bytes=0,
        engine_options=None,
    ):
        if algorithm is None:
            algorithm = GradientAllReduceAlgorithm()
        if not isinstance(algorithm, Algorithm):
            raise TypeError("bagua: algorithm must be a bagua.torch_api.algorithms.Algorithm, "
                            "got {}".format(type(algorithm)))
        # Weak: the module owns its wrapper (module.bagua_ddp, module.no_sync), so a strong
        # reference back would make a cycle, and the wrap (its reducer, process groups, device
        # buffers) would be freed only when the garbage collector runs: at a different moment on
        # every rank. With it weak, dropping the module frees everything at once.
        self._module_ref = weakref.ref(module)
        self.optimizers = list(optimizers or [])
        self.process_group = process_group or comm.get_default_group()
        if not self.process_group.is_member:
            raise ValueError("bagua: this rank is not in the process group it wraps with")
        self.bagua_module_name = bagua_module_name or "{}_{}".format(
            type(module).__name__, id(module))
        self.algorithm = algorithm
        impl = algorithm.reify(self.process_group)
        if not isinstance(impl, AlgorithmImpl):
            raise TypeError("bagua: {}.reify() must return an AlgorithmImpl, got {}".format(
                type(algorithm).__name__, type(impl)))
        self.bagua_algorithm = impl
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.parameters_to_ignore = _ignored_names(module)
        if bucket_cap_mb is None:
            bucket_cap_mb = env.get_default_bucket_size() / float(1 << 20)
        self._bucket_cap_mb = bucket_cap_mb
        self._broadcast_buffers = broadcast_buffers
        self._first_bucket_bytes = first_bucket_bytes
        self._engine_options = engine_options or EngineOptions()
        self._hooks = []
        self._grad_accs = []
        self._hook_state = None
        self._patched = []
        self._raw_steps = []  # (optimizer, its own step) for stepping inside backward
        self._in_backward = False
        self._no_sync = False
        self._closed = False
        self._used = set()
        self.require_backward_grad_sync = True

        named = list(module.named_parameters())
        devices = {p.device.type for _, p in named} | {b.device.type for _, b in
                                                       module.named_buffers()}
        if len(devices) > 1:
            raise ValueError("bagua: the model has parameters on {}; put it on one device "
                             "type".format(sorted(devices)))
        for _, p in named:
            if p.grad is not None and not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
        if isinstance(impl, _NativeImpl) and impl._overrides_hooks():
            raise NotImplementedError(
                "bagua: {} overrides hooks of the built-in {}; derive from AlgorithmImpl to "
                "write an algorithm (built-in implementations run in the C++ reducer)".format(
                    type(impl).__name__, impl._native_name))
        # One algorithm at a time on a module, as in Bagua (which keeps it on the module): a
        # module wrapped again (Bagua's test_model_switch: a new DDP or with_bagua per algorithm)
        # closes the wrapper before, whose hooks would otherwise go on firing as long as it is
        # alive, and rebuild its reducer when the new wrap lays the weights out anew.
        before = module.__dict__.get("_bagua_active_wrapper")
        before = before() if before is not None else None
        if before is not None and before is not self:
            before.close()
        module.__dict__["_bagua_active_wrapper"] = weakref.ref(self)
        if isinstance(impl, _NativeImpl):
            self._engine = _NativeEngine(self)
        else:
            self._engine = _PythonEngine(self)
        self._register_hooks()
        self._patch_optimizers()
        self._engine.attach_optimizers()

    # ---- Bagua's attributes ----------------------------------------------------------------

    @property
    def module(self):
        m = self._module_ref()
        if m is None:
            raise RuntimeError("bagua: the module this wrapper wraps was freed (a wrapper lives "
                               "as long as its module; keep the module)")
        return m

    @property
    def bagua_optimizers(self):
        return self.optimizers

    @property
    def bagua_buckets(self):
        return self._engine.buckets()

    @property
    def bagua_train_step_counter(self):
        return self._engine.train_step()

    def _bagua_save_schedule(self):
        """The step counter and the algorithm's state (decentralized exchange counter,
        low-precision replicas) as bytes, for ``save_training_state``."""
        return self._engine.save_schedule()

    def _bagua_restore_schedule(self, state, counter_only=False):
        """Takes ``_bagua_save_schedule()``'s bytes back, before the first forward; with
        ``counter_only`` (another world size) only the step counter."""
        self._engine.restore_schedule(state, counter_only)

    @property
    def _bagua_backend(self):
        return comm.get_backend(self.bagua_module_name)

    @property
    def _bagua_tensors(self):
        return getattr(self._engine, "tensors", [])

    def bagua_build_params(self):
        """``[(name, parameter)]`` of the parameters that require a gradient and are not
        ignored (with ``find_unused_parameters``: only those the last backward reached, once
        one ran); shared parameters once."""
        ignore = set(self.parameters_to_ignore)
        out, seen = [], set()
        for mname, m in self.module.named_modules():
            for pname, p in m.named_parameters(recurse=False):
                name = "{}.{}".format(mname, pname) if mname else pname
                if not p.requires_grad or name in ignore or id(p) in seen:
                    continue
                if self.find_unused_parameters and self._used and name not in self._used:
                    continue
                seen.add(id(p))
                out.append((name, p))
        for m in self.module.modules():
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
                raise NotImplementedError("bagua: sparse gradients are not supported ({})".format(
                    type(m).__name__))
        return out

    # ---- hooks -----------------------------------------------------------------------------

    def _register_hooks(self):
        me = weakref.ref(self)

        def pre_forward(module, inputs):
            s = me()
            if s is not None and not s._closed:
                s._pre_forward(inputs)

        self._hooks.append(self.module.register_forward_pre_hook(pre_forward))
        self._register_grad_hooks()

    def _register_grad_hooks(self):
        """(Re)registers the gradient hooks. Before torch 2.1 they sit on each parameter's
        AccumulateGrad node, which torch replaces when the parameter's data changes dtype or
        device (``.double()``, ``.to()``): the engine calls this again when it rebinds.

        The C++ reducer gets C++ hooks (``_native_grad_hook``: no Python per gradient; Python
        runs once per backward, ``_on_first_grad``); the Python engine and the Python CUDA
        reducer get Python ones (Bagua's ``init_backward_hook`` per gradient)."""
        me = weakref.ref(self)
        for h in getattr(self, "_grad_hooks", []):
            h.remove()
        self._grad_hooks = []
        self._grad_accs.clear()
        if self._hook_state is not None:
            self._hook_state.detach()
            self._hook_state = None
        named = list(self.module.named_parameters())
        reducer = self._engine.native_reducer() if self._engine_options.native_hooks else None
        if reducer is not None:
            st = ext.HookState()

            def on_first():
                s = me()
                return s._on_first_grad() if s is not None and not s._closed else False

            def slow_path(index, p):
                s = me()
                if s is not None and not s._closed:
                    s._engine.on_grad_slow(index, p)

            st.attach(reducer, sorted(self._engine._communicated), len(named), on_first, None,
                      slow_path)
            self._hook_state = st
        for index, (name, p) in enumerate(named):
            if not p.requires_grad:
                continue
            if reducer is not None:
                h, acc = _native_grad_hook(p, self._hook_state, index)
            else:
                def on_grad(name=name, pref=weakref.ref(p)):
                    s, p = me(), pref()
                    if s is not None and not s._closed and p is not None:
                        s._on_grad(name, p)

                h, acc = _grad_hook(p, on_grad)
            self._grad_hooks.append(h)
            if acc is not None:
                self._grad_accs.append(acc)
        self._hooked_as = [(p, p.dtype, p.device) for _, p in named]

    def _pre_forward(self, inputs):
        if not (self.module.training and torch.is_grad_enabled()):
            return
        if self._grad_accs and any(p.dtype != dt or p.device != dev
                                   for p, dt, dev in self._hooked_as):
            self._register_grad_hooks()  # torch replaced the AccumulateGrad nodes
        if self.find_unused_parameters:
            self._used = set()
        self._engine.pre_forward(inputs)

    def _on_grad(self, name, p):
        if not self._in_backward:
            begin = getattr(self._engine, "begin_backward", None)  # the C++ reducer's engine
            if begin is not None:
                begin()
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._post_backward)
        if self.find_unused_parameters:
            self._used.add(name)
        self._engine.on_grad(name, p)

    def _on_first_grad(self):
        """The C++ hooks' one Python call per backward: whether this backward communicates
        (no_sync), and the end-of-backward callback (queued last: begin_backward may raise)."""
        sync = self._engine.begin_backward()
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._post_backward)
        return sync

    def _post_backward(self):
        self._in_backward = False
        st = self._hook_state
        if st is not None:
            st.end_backward()
            if self.find_unused_parameters:
                named = list(self.module.named_parameters())
                self._used = {named[i][0] for i in st.used if i < len(named)}
        self._engine.post_backward()

    def _patch_optimizers(self):
        me = weakref.ref(self)
        for opt in self.optimizers:
            orig = opt.step
            func = orig.__func__ if getattr(orig, "__self__", None) is opt else None
            held = None if func is not None else orig

            def step(o, *args, _func=func, _held=held, **kwargs):
                s = me()
                steps = s._engine.steps() if s is not None and not s._closed else None
                if steps is not None:
                    if steps.finish_if_stepped(o, args, kwargs, fused=False):
                        s._engine.post_step(o)  # its buckets were stepped inside backward
                        return None
                    steps.observe_step(o, args, kwargs)
                r = _func(o, *args, **kwargs) if _func is not None else _held(*args, **kwargs)
                s = me()
                if s is not None and not s._closed:
                    s._engine.post_step(o)
                return r

            opt.step = _PatchedStep(step, opt)
            self._patched.append((opt, orig))
            # The optimizer's own step, for stepping buckets inside backward (held weakly by
            # way of the optimizer: a bound method of it would be a cycle through the wrap).
            self._raw_steps.append((opt, _raw_step(opt, func, held)))

    # ---- user API --------------------------------------------------------------------------

    def _sync_enabled(self):
        return self.require_backward_grad_sync and not self._no_sync

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first backward after it reduces the sum."""
        old = self._no_sync
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = old

    def bucket_layout(self):
        return self._engine.bucket_layout()

    @property
    def optimizer_steps_in_backward(self):
        """``{optimizer: (mode, reason)}`` for the fused optimizers of this wrap: "on" (each
        bucket is stepped inside the backward pass), "observe" (until the first step() decides)
        or "off" (after backward; the reason says why). Empty for the Python engine."""
        steps = self._engine.steps()
        return steps.state() if steps is not None else {}

    def rebind(self):
        """Rebuilds on the parameters' current memory if any was replaced (done at every
        forward and optimizer step; call it yourself to do it earlier). Collective."""
        self._engine.rebind_if_moved()

    def close(self):
        """Removes the hooks and the optimizer patches and frees the reducer."""
        if self._closed:
            return
        self._closed = True
        if self._hook_state is not None:
            self._hook_state.detach()
            self._hook_state = None
        for h in self._hooks + getattr(self, "_grad_hooks", []):
            h.remove()
        self._hooks.clear()
        self._grad_hooks = []
        self._grad_accs.clear()
        for opt, orig in self._patched:
            if opt.__dict__.get("step") is not None:
                del opt.__dict__["step"]
            if opt.step != orig:
                opt.step = orig
        self._patched.clear()
        self._engine.close()


#: Built-ins whose buckets hold the weights (Bagua's init_tensors): do_flatten lays out those.
_WEIGHT_ALGORITHMS = ("decentralized", "low_precision_decentralized", "async")


def _schedule_bytes(step):
    """The core's reducer-schedule layout (core/src/checkpoint.cc) for an engine whose only
    schedule is its step counter: "BGSC", version 1, the step, no algorithm state."""
    return struct.pack("<IIqQ", _SCHEDULE_MAGIC, 1, step, 0)


def _schedule_step(state, counter_only, current_step):
    """The step counter in ``state`` for an engine at ``current_step`` (which must be 0: a
    schedule is restored before the first forward)."""
    if current_step != 0:
        raise RuntimeError("bagua: restore the schedule before the first forward")
    if len(state) < 24:
        raise ValueError("bagua: not a reducer schedule ({} bytes)".format(len(state)))
    magic, version, step, n = struct.unpack_from("<IIqQ", state)
    if magic != _SCHEDULE_MAGIC or version != 1 or step < 0 or len(state) != 24 + n:
        raise ValueError("bagua: the reducer schedule is damaged or of another version")
    if n and not counter_only:
        raise ValueError("bagua: the checkpoint holds {} bytes of algorithm state, but this "
                         "algorithm keeps none: was it saved with another algorithm?".format(n))
    return step


_SCHEDULE_MAGIC = 0x43534742  # "BGSC"


class _Engine:
    """What both engines share: their wrapper, held weakly (it owns them)."""

    @property
    def ddp(self):
        d = self._ddp()
        if d is None:
            raise RuntimeError("bagua: the wrapper of this engine was freed")
        return d

    def native_reducer(self):
        """The _bagua_ext.Reducer the C++ gradient hooks feed, or None (Python hooks)."""
        return None

    def attach_optimizers(self):
        pass

    def steps(self):
        """The wrap's StepInBackward (step_in_backward.py), or None."""
        return None


class _NativeEngine(_Engine):
    """The built-in algorithms on the C++ reducer (see the module docstring)."""

    def __init__(self, ddp):
        self._ddp = weakref.ref(ddp)  # the wrapper owns its engine
        self.impl = ddp.bagua_algorithm
        self._reducer = None
        self._steps = None
        self._device_homes = ddp._engine_options.in_place_device_buckets  # for every rebuild
        self._build(first=True)

    def native_reducer(self):
        return None if self._python_device else self._reducer

    def attach_optimizers(self):
        from .step_in_backward import StepInBackward

        self._steps = StepInBackward(self)

    def steps(self):
        return self._steps

    def begin_backward(self):
        """The first gradient of a backward pass (C++ hooks): whether it communicates."""
        sync = self._sync()
        if self._steps is not None:
            self._steps.begin_backward(sync)
        return sync

    def on_grad_slow(self, i, p):
        """A gradient the C++ hook cannot hand over as it is (sparse, not contiguous)."""
        g = p.grad
        if g.is_sparse:
            raise RuntimeError("bagua: sparse gradients are not supported ({})".format(
                self._named_params[i][0]))
        if not g.is_contiguous():
            p.grad = g = g.contiguous()
        self._reducer.mark_ready(i, g.data_ptr())

    def _build(self, first=False):
        ddp, impl = self.ddp, self.impl
        module = ddp.module
        ignore = sorted(set(ddp.parameters_to_ignore))
        named = list(module.named_parameters())
        if first:
            # The gradient views this wrap laid out (the reducer's homes while they are still
            # the parameters' _bagua_grad_view; a later fuse_optimizer layout is left alone).
            self._own_views = {}
        if first and ddp.gradient_as_bucket_view:
            mine = [p for n, p in reversed(named) if p.requires_grad and n not in ignore]
            if impl._native_name in _WEIGHT_ALGORITHMS:
                _lay_out_weights(mine)
            else:
                _lay_out_grads(mine)
                self._own_views = {id(p): p._bagua_grad_view for p in mine}
        self._named_params = named
        self._params = [p for _, p in named]
        # Buffers go to the reducer only to be broadcast (at the wrap, at algorithm resets and
        # before each training forward): only with broadcast_buffers, as torch DDP does it.
        # with_bagua and DistributedDataParallel_V1_9_0 never broadcast them, as Bagua did not.
        self._named_buffers = [(n, b) for n, b in module.named_buffers()
                               if b.is_contiguous()] if ddp._broadcast_buffers else []
        # The memory the reducer points at: kept alive (see the module docstring).
        self._bound = [p.data for p in self._params] + [b for _, b in self._named_buffers]
        self._shapes = [p.shape for p in self._params]
        self._bound_ptrs = [p.data_ptr() for p in self._bound[:len(self._params)]]
        self._bound_dtypes = [p.dtype for p in self._bound[:len(self._params)]]
        self.is_cuda = any(p.is_cuda for p in self._params)
        group = ddp.process_group
        _check_devices(self._named_params, getattr(group, "stream", None))
        _broadcast_optimizer_state(ddp.optimizers, group)
        self._python_device = self.is_cuda and ddp._engine_options.cuda_reducer == "python"
        if self._python_device:
            from .device_reducer import DeviceReducer

            self._reducer = DeviceReducer(
                self._named_params, self._named_buffers, impl._algorithm, group,
                bucket_cap_mb=ddp._bucket_cap_mb, find_unused_parameters=ddp.find_unused_parameters,
                gradient_as_bucket_view=ddp.gradient_as_bucket_view,
                broadcast_buffers=ddp._broadcast_buffers, ignore=ignore)
        else:
            qadam = impl._qadam_optimizer()
            if qadam is not None:
                qadam._check_covers(self._params)
                self._qadam_generation = qadam._generation
            # The core reads a gradient pointer when it (re)builds buckets, at creation and at
            # algorithm resets; parameters without a gradient yet point at a shared zero buffer
            # (read only: the core writes gradients only in finish_backward, when every
            # pointer is a real gradient).
            most = max([p.numel() * p.element_size() for p in self._params] + [8])
            dev = self._params[0].device if self._params else torch.device("cpu")
            self._zero_grad = torch.zeros(most, dtype=torch.uint8, device=dev)
            host_group = group._host
            stream = 0
            if self.is_cuda:
                if group._nccl is None:
                    raise RuntimeError("bagua: CUDA model but no NCCL communicator (extension "
                                       "built without NCCL, or no GPU at init_process_group)")
                host_group = group._nccl
                self._torch_stream = torch.cuda.current_stream(dev)  # the trainer's
                stream = self._torch_stream.cuda_stream
            params = [_spec(n, p, self._grad_ptr(p)) for n, p in self._named_params]
            # do_flatten's laid-out gradients: the reducer's storage where they line up. The
            # reducer writes there until it is closed, so the views stay referenced here.
            self._homes = [self._home(p) for p in self._params]
            buffers = [_spec(n, b) for n, b in self._named_buffers]
            ext_algo = impl._algorithm._make_ext()
            global _reducers_made
            _reducers_made += 1  # the same on every rank: they wrap and rebuild in step
            self._reducer = ext.Reducer(
                host_group, params, buffers, ext_algo,
                qadam._ext if qadam is not None else None,
                float(ddp._bucket_cap_mb), bool(ddp.find_unused_parameters),
                bool(ddp._broadcast_buffers), True, ignore, int(ddp._first_bucket_bytes),
                int(stream), autotune=_autotune_arg(ddp._engine_options.autotune),
                autotune_model="with_bagua{}".format(_reducers_made),
                launch_without_waiting=ddp._engine_options.launch_without_waiting,
                grad_homes=self._home_ptrs(self._homes),
                shapes=[list(p.shape) for _, p in self._named_params])
        self._communicated = set(self._reducer.communicated())
        self._keep = self._keep_views()
        # The layout the homes were last laid out for (None: check at the next forward).
        self._homes_gen = None
        self._homes_wanted = not self._python_device and any(h is not None for h in self._homes)
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._synced = True  # a new reducer communicates

    def _keep_views(self):
        # Laid-out gradients to re-point fresh ones at (see the module docstring): only where
        # the reducer writes every reduced gradient back (communicated, the C++ reducer). Also
        # by parameter index, for stepping inside backward (step_in_backward.py).
        keep = [] if self._python_device else [
            (i, p, v) for i, p in enumerate(self._params)
            if i in self._communicated and (v := getattr(p, "_bagua_grad_view", None)) is not None
            and v.shape == p.shape and v.dtype == p.dtype and v.device == p.device]
        self._keep_by_index = {i: v for i, _, v in keep}
        return [(p, v) for _, p, v in keep]

    def _follow_layout(self):
        """When the reducer's bucket layout changed (the rebuild in gradient-ready order after
        the first iteration, an autotune switch) and a bucket no longer runs in place, lays the
        laid-out gradients out again as Bagua flattens them: one buffer per bucket, in its
        order. Gradients keep their values; a None gradient stays None."""
        red = self._reducer
        if red.layout_generation == self._homes_gen:
            return
        layout = red.bucket_layout()
        if red.buckets_in_place < len(layout):
            by_name = dict(self._named_params)

            def install(p, place):
                if p.grad is not None:
                    p.grad = place
                p._bagua_grad_view = self._own_views[id(p)] = place

            for names in layout:
                ps = [by_name[n] for n in names]
                if all(self._home(p) is not None for p in ps):
                    _lay_out(ps, lambda p: p.grad, install, zero=True)
            homes = [self._home(p) for p in self._params]
            red.set_grads(self._grad_ptrs())
            red.set_grad_homes(self._home_ptrs(homes))
            self._homes = homes  # the old ones were alive until the reducer left them
            self._keep = self._keep_views()
        self._homes_gen = red.layout_generation

    def _moved(self):
        qadam = self.impl._qadam_optimizer()
        if qadam is not None and qadam._generation != getattr(self, "_qadam_generation", None):
            return True  # the optimizer's core state object was replaced (load_state_dict)
        # Twice a step: one list compare in the common case (data pointer and dtype; a device
        # change always moves the data), the detailed walk only when something moved.
        if [p.data_ptr() for p in self._params] == self._bound_ptrs and \
                [p.dtype for p in self._params] == self._bound_dtypes:
            params_moved = False
        else:
            params_moved = True
        for i, p in enumerate(self._params if params_moved else ()):
            if p.data_ptr() != self._bound[i].data_ptr() or p.dtype != self._bound[i].dtype \
                    or p.device != self._bound[i].device:
                if p.shape != self._shapes[i]:
                    raise RuntimeError(
                        "bagua: parameter {} changed shape after the wrap ({} -> {}); wrap the "
                        "module again".format(self._named_params[i][0], tuple(self._shapes[i]),
                                              tuple(p.shape)))
                return True
        if self._named_buffers:  # only kept when broadcasting them
            # .to() / .double() put new tensor objects in the module's buffers.
            cur = [b for _, b in self.ddp.module.named_buffers() if b.is_contiguous()]
            nb = len(self._params)
            if len(cur) != len(self._named_buffers) or any(
                    b.data_ptr() != self._bound[nb + j].data_ptr() for j, b in enumerate(cur)):
                return True
        return False

    def rebind_if_moved(self):
        if self._reducer is not None and self._moved():
            self._rebuild()

    def _rebuild(self):
        old = self._reducer
        # The step counter and the algorithm's state go on in the new reducer (Bagua's counter
        # survives its resets; a decentralized schedule or replicas must not restart).
        schedule = old.save_schedule()
        hooks = self.ddp._hook_state
        if hooks is not None:
            hooks.detach()  # re-attached to the new reducer below
        self._reducer = None
        if hasattr(old, "close"):
            old.close()
        del old
        self._build()
        self._reducer.restore_schedule(schedule)
        self.ddp._register_grad_hooks()

    def _home(self, p):
        """p's gradient home: the view this wrap laid out, while it is still p's layout and fits
        p (CUDA ones only with EngineOptions.in_place_device_buckets); else None."""
        v = self._own_views.get(id(p))
        if v is None or getattr(p, "_bagua_grad_view", None) is not v or not p.requires_grad \
                or v.shape != p.shape or v.dtype != p.dtype or v.device != p.device \
                or not v.is_contiguous() or (v.is_cuda and not self._device_homes):
            return None
        return v

    @staticmethod
    def _home_ptrs(homes):
        return [h.data_ptr() if h is not None else 0 for h in homes]

    def _grad_ptr(self, p):
        if p.grad is not None and p.grad.is_contiguous():
            return p.grad.data_ptr()
        return self._zero_grad.data_ptr()

    def _grad_ptrs(self):
        zero = self._zero_grad.data_ptr()
        return [g.data_ptr() if (g := p.grad) is not None and g.is_contiguous() else zero
                for p in self._params]

    def pre_forward(self, inputs):
        self.rebind_if_moved()
        self._sync()
        if not self._python_device:
            self._reducer.set_grads(self._grad_ptrs())
        self._reducer.prepare_forward()
        if self._homes_wanted:
            self._follow_layout()

    def _sync(self):
        # Hot path (every gradient): the reducer is told only when the mode changes.
        sync = self.ddp._sync_enabled()
        if sync != self._synced:
            self._reducer.set_no_sync(not sync)
            self._synced = sync
        return sync

    def on_grad(self, name, p):
        i = self._index.get(id(p))
        if i is None or not self._sync() or i not in self._communicated:
            return
        g = p.grad
        if g is None:
            return
        if g.is_sparse:
            raise RuntimeError("bagua: sparse gradients are not supported ({})".format(name))
        if not g.is_contiguous():
            p.grad = g = g.contiguous()
        self._reducer.mark_ready(i, g.data_ptr())

    def post_backward(self):
        if not self._sync():
            self._reducer.finish_backward()
            return
        # Unused this iteration: a zero gradient receives the others' average (without
        # find_unused_parameters such a parameter is the reducer's error).
        for i in self._communicated if self.ddp.find_unused_parameters else ():
            p = self._params[i]
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        steps = self._steps
        if steps is not None and steps.active:
            # Each bucket stepped as soon as it is reduced, while the later ones communicate.
            if not self._python_device:
                self._reducer.set_grads(self._grad_ptrs())
            steps.post_backward()
        fresh = []  # alive until the reducer is done with them (it may still be copying)
        for p, view in self._keep:
            g = p.grad
            if g.data_ptr() != view.data_ptr():
                fresh.append(g)
                p.grad = view  # finish_backward writes the reduced gradient here
        if not self._python_device:
            self._reducer.set_grads(self._grad_ptrs())
        self._reducer.finish_backward()
        del fresh
        if steps is not None:
            steps.after_finish(True)
        if self.impl._native_name == "decentralized":
            # Bagua's bucket exposes the averaged weights of the last communication step
            # (its tests read bagua_buckets[0]._peer_weight): here they are the weights the
            # reducer has just written back, before the optimizer steps.
            every = max(1, int(self.impl._algorithm.communication_interval))
            if (self._reducer.train_step - 1) % every == 0:
                with torch.no_grad():
                    self._peer_weight = torch.cat([
                        self._params[i].detach().reshape(-1) for i in self._weight_indices()])

    def post_step(self, optimizer):
        self.rebind_if_moved()
        self._reducer.step()

    def train_step(self):
        return self._reducer.train_step

    def save_schedule(self):
        return self._reducer.save_schedule()

    def restore_schedule(self, state, counter_only=False):
        self._reducer.restore_schedule(state, counter_only)

    def bucket_layout(self):
        return self._reducer.bucket_layout()

    def buckets(self):
        """Bagua-style bucket views of the reducer's layout (names and tensors; the reducer
        owns the communication, so they carry no operations). The decentralized algorithms have
        one bucket of every trained weight, in reverse order, as Bagua's: decentralized's
        ``_peer_weight`` is the last averaged weight, low-precision decentralized's ``_weight``,
        ``_left_peer_weight``, ``_right_peer_weight`` its replicas (read back after the first
        forward)."""
        from ..bucket import BaguaBucket

        name = self.impl._native_name
        by_name = dict(self._named_params)
        if name in ("decentralized", "low_precision_decentralized"):
            names = [self._named_params[i][0] for i in self._weight_indices()]
            tensors = []
            for n in names:
                p = by_name[n]
                if not p.is_bagua_tensor():
                    p.ensure_bagua_tensor(n, self.ddp.bagua_module_name)
                tensors.append(p)
            if not tensors:
                return []
            b = BaguaBucket(tensors, "0", flatten=False)
            if name == "decentralized":
                b._peer_weight = getattr(self, "_peer_weight", None)
                if b._peer_weight is None:
                    b._peer_weight = b.flattened_tensor()
            else:
                reps = self.impl._algorithm.replicas()  # read back from host or device
                dev = tensors[0].device
                b._weight = torch.tensor(reps["self"], device=dev)
                b._left_peer_weight = torch.tensor(reps["left"], device=dev)
                b._right_peer_weight = torch.tensor(reps["right"], device=dev)
            return [b]
        out = []
        for i, names in enumerate(self._layout_names()):
            tensors = []
            for n in names:
                p = by_name[n]
                if not p.is_bagua_tensor():
                    p.ensure_bagua_tensor(n, self.ddp.bagua_module_name,
                                          getter_closure=lambda p: p.grad,
                                          setter_closure=lambda p, t: setattr(p, "grad", t))
                tensors.append(p)
            if tensors:
                out.append(BaguaBucket(tensors, str(i), flatten=False))
        return out

    def _weight_indices(self):
        """The weights a decentralized algorithm averages, in Bagua's bucket order (reverse)."""
        ignore = set(self.ddp.parameters_to_ignore)
        return [i for i in reversed(range(len(self._named_params)))
                if self._params[i].requires_grad and self._named_params[i][0] not in ignore]

    def _layout_names(self):
        return self._reducer.bucket_layout()

    def close(self):
        if self._steps is not None:
            self._steps.close()
        self._reducer = None


class _PythonEngine(_Engine):
    """A user-written ``AlgorithmImpl`` on Bagua's hook protocol (bucket.py runs the
    operations): ``init_tensors`` -> bucketing suggestion -> ``tensors_to_buckets`` ->
    ``init_operations`` per bucket; ``init_forward_pre_hook``, ``init_backward_hook``,
    ``init_post_backward_hook``, ``init_post_optimizer_step_hook`` called where Bagua calls
    them; ``need_reset()`` checked before each training forward."""

    def __init__(self, ddp):
        self._ddp = weakref.ref(ddp)  # the wrapper owns its engine
        self.impl = ddp.bagua_algorithm
        self.step = 0
        self.tensors = []
        self._buckets = []
        self._init()

    def _init(self):
        ddp = self.ddp
        group = ddp.process_group
        _check_devices(list(ddp.module.named_parameters()), getattr(group, "stream", None))
        with torch.no_grad():
            for _, p in ddp.bagua_build_params():
                comm.broadcast(p.data if p.data.is_contiguous() else p.data.contiguous(), 0,
                               group)
        _broadcast_optimizer_state(ddp.optimizers, group)
        self.tensors = self.impl.init_tensors(ddp)
        self._reset_buckets()

    def _reset_buckets(self):
        cap = max(1, int(self.ddp._bucket_cap_mb * (1 << 20)))
        raw, cur, size = [], [], 0
        for t in self.tensors:
            if cur and (size >= cap or t.dtype != cur[0].dtype):
                raw.append(cur)
                cur, size = [], 0
            cur.append(t)
            size += t.numel() * t.element_size()
        if cur:
            raw.append(cur)
        self._buckets = self.impl.tensors_to_buckets(raw, self.ddp.gradient_as_bucket_view)
        for b in self._buckets:
            self.impl.init_operations(self.ddp, b)
        comm.get_backend(self.ddp.bagua_module_name).register_ordered_buckets(self._buckets)

    def rebind_if_moved(self):
        pass  # effective tensors are found through their getters at every use

    def pre_forward(self, inputs):
        self.step += 1
        if self.impl.need_reset():
            self._init()
        self.impl.init_forward_pre_hook(self.ddp)(inputs)

    def on_grad(self, name, p):
        if not self.ddp._sync_enabled():
            return
        self.impl.init_backward_hook(self.ddp)(name, p)

    def post_backward(self):
        if not self.ddp._sync_enabled():
            return
        self.impl.init_post_backward_hook(self.ddp)()

    def post_step(self, optimizer):
        self.impl.init_post_optimizer_step_hook(self.ddp)(optimizer)

    def train_step(self):
        return self.step

    def save_schedule(self):
        return _schedule_bytes(self.step)

    def restore_schedule(self, state, counter_only=False):
        self.step = _schedule_step(state, counter_only, self.step)

    def buckets(self):
        return self._buckets

    def bucket_layout(self):
        return [[t.bagua_tensor_name for t in b.tensors] for b in self._buckets]

    def close(self):
        comm.get_backend(self.ddp.bagua_module_name).register_ordered_buckets([])
