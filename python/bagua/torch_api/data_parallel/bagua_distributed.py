"""The engine behind ``with_bagua`` and ``DistributedDataParallel`` (Bagua's
``BaguaDistributedDataParallel``).

``algorithm.reify(process_group)`` gives the algorithm implementation. The built-in ones
(``algorithms/*``: ``_NativeImpl``) run in the C++ reducer; any other ``AlgorithmImpl`` (a
user-written algorithm) runs on Bagua's hook protocol in Python (``_PythonEngine``).

The built-in engine and what it does with parameter memory and do_flatten: _native_engine.py;
the Python one: _python_engine.py; the hooks a wrap installs: _wrap_hooks.py.
"""

import contextlib
import weakref

import torch

from .._ext import ext
from .. import communication as comm
from .. import env
from ..algorithms import Algorithm, AlgorithmImpl, GradientAllReduceAlgorithm
from ..algorithms.base import _NativeImpl
from ._native_engine import _NativeEngine
from ._python_engine import _PythonEngine
from ._wrap_hooks import _PatchedStep, _grad_hook, _native_grad_hook, _raw_step
from .engine_options import EngineOptions  # noqa: F401  (its documented home for users)


def _ignored_names(module):
    names = []
    for attr in ("_bagua_params_and_buffers_to_ignore", "_ddp_params_and_buffers_to_ignore"):
        names.extend(getattr(module, attr, []) or [])
    return names



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
        runs once per backward, ``_on_first_grad``); the Python engine gets Python ones (Bagua's ``init_backward_hook`` per gradient)."""
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

