"""The optimizer inside the backward pass (``BAGUA_OPTIM_STEP_IN_BACKWARD``, the optimizer
library's catalogue; off by default: on the GPUs measured, stepping after backward is faster).

A ``fuse_optimizer`` optimizer of a ``with_bagua`` model whose algorithm leaves final gradients
per bucket (gradient_allreduce, bytegrad) steps each bucket's parameters as soon as that bucket
is reduced, while later buckets still communicate, instead of all of them after the backward
pass:

* CUDA: once a bucket's collective is enqueued, its parameters are stepped on a side stream
  ordered after the communicator's stream (no host wait), from the gradient hooks while the
  backward pass still runs; the trainer's stream waits for that stream when backward ends.
* CPU: at the end of the backward pass, each bucket as soon as its communication has completed,
  while the later buckets still communicate (stepping during the backward pass would delay the
  rest of it on the same thread, and with it the later buckets' communication).

The user's ``optimizer.step()`` / ``fuse_step()`` after backward then steps only the parameters
no bucket holds. Each parameter gets the same operations on the same values as after backward
(the optimizers allowed are those whose step updates each parameter from its own gradient and
state only), so the weights are the same bits.

What needs every gradient before any step cannot be known during the backward pass, so an
optimizer starts stepping inside it only after one iteration was seen to need nothing of the
kind: exactly one backward pass that communicates since the previous step, gradients that nobody
changed between the end of backward and ``step()`` (gradient clipping, ``GradScaler.unscale_``
and the like change them), no argument to ``step()`` (a closure, or the GradScaler's
``grad_scale``/``found_inf`` of torch's fused optimizers) and the same hyper-parameters. If that
first iteration does not qualify, the optimizer steps after backward for the rest of the wrap,
and the reason is logged (logger "bagua", INFO). Once it steps inside backward, the same checks
run at every ``step()``; a loop that changes afterwards (starts clipping, accumulates gradients
without ``no_sync()``) gets a RuntimeError naming what changed, since the step it expected has
already been taken: set BAGUA_OPTIM_STEP_IN_BACKWARD=0 for such a loop.

Cost: no Python per gradient (the gradient hooks are C++), one call per bucket, and per step a
look at each stepped gradient's version counter (the checks above). Each bucket keeps its fusion
between steps while its layout holds (contrib/fuse/optimizer.py, ``_planned_bucket_step``).
"""

import logging
import weakref

import torch

from .._ext import ext

_LOG = logging.getLogger("bagua")

#: Optimizers whose step updates each parameter from its own gradient and state only, so that
#: stepping a bucket's parameters on their own gives the same bits as stepping all of them.
#: Exact types: a subclass may override ``step``.
PER_PARAMETER = tuple(getattr(torch.optim, n) for n in (
    "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "RMSprop", "Rprop", "NAdam", "RAdam",
    "ASGD") if hasattr(torch.optim, n))
#: Algorithms whose reduced buckets hold final gradients (core's
#: AlgorithmImpl::reducedBucketIsFinal).
ALGORITHMS = ("gradient_allreduce", "bytegrad")

OBSERVE, ON, OFF = "observe", "on", "off"

def _hypers(opt):
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _same_hypers(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for k, v in x.items():
            w = y[k]
            if v is w:
                continue
            if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor):
                if not (isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor)
                        and v.shape == w.shape and torch.equal(v, w)):
                    return False
            elif v != w:
                return False
    return True


class _Optimizer:
    """One optimizer's state: its mode, the buckets' share of its parameters, the checks."""

    def __init__(self, opt, raw_step):
        self.opt = opt
        self.raw_step = raw_step  # the optimizer's own step (not the wrap's patched one)
        self.mode = OBSERVE
        self.reason = None
        self.sync_backwards = 0   # backward passes that communicated since the last step
        self.pending = False      # buckets stepped in backward; the user's step completes it
        self.grads = None         # the gradients stepped (or seen) at the end of the backward
        self.versions = None
        self.hypers = None
        self.fused_groups = set()
        self.layout_key = None
        self.by_bucket = []       # per bucket: per group, its parameters in group order
        self.rest = []            # per group: the parameters no bucket holds
        self.watch = []           # the parameters the buckets hold

    def layout(self, key, bucket_of, nbuckets):
        """(Re)computes the per-bucket lists when the reducer's layout or the groups changed."""
        if key == self.layout_key:
            return
        groups = self.opt.param_groups
        self.by_bucket = [[[] for _ in groups] for _ in range(nbuckets)]
        self.rest = [[] for _ in groups]
        self.watch = []
        for gi, g in enumerate(groups):
            for p in g["params"]:
                b = bucket_of.get(id(p))
                if b is None:
                    self.rest[gi].append(p)
                else:
                    self.by_bucket[b][gi].append(p)
                    self.watch.append(p)
        self.layout_key = key

    def snapshot(self):
        self.grads = [p.grad for p in self.watch]
        self.versions = [g._version if g is not None else -1 for g in self.grads]

    def changed_since_snapshot(self, args, kwargs):
        """Why the gradients or the call do not allow (or did not allow) stepping in backward;
        None when nothing did."""
        args = [a for a in args if a is not None]
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if args or kwargs:
            return "optimizer.step() was called with arguments ({}) (a closure, or a " \
                   "GradScaler's grad_scale / found_inf)".format(
                       ", ".join(["{} positional".format(len(args))] * bool(args) +
                                 sorted(kwargs)))
        if self.grads is not None:
            for p, g, v in zip(self.watch, self.grads, self.versions):
                if p.grad is not g or (g is not None and g._version != v):
                    return "the gradients changed between backward and optimizer.step() " \
                           "(gradient clipping, GradScaler.unscale_ or another change of .grad)"
        if self.hypers is not None and not _same_hypers(self.hypers, _hypers(self.opt)):
            return "the hyper-parameters changed between backward and optimizer.step()"
        return None


class StepInBackward:
    """The wrap's in-backward stepping (see the module docstring); made by the native engine."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        ddp = engine.ddp
        self.static_reason = None
        # EngineOptions.step_in_backward: None follows BAGUA_OPTIM_STEP_IN_BACKWARD (read once,
        # at the first wrap); True / False force it (tests and bench/ddp compare both).
        forced = ddp._engine_options.step_in_backward
        if not (ext.optim_step_in_backward() if forced is None else forced):
            self.static_reason = "BAGUA_OPTIM_STEP_IN_BACKWARD is off"
        elif engine.impl._native_name not in ALGORITHMS:
            self.static_reason = "{} does not leave final gradients per bucket".format(
                engine.impl._native_name)
        self._opts = {}
        self.active = []
        self._stepped = set()
        self._fresh = []
        self._stream = None
        self._logged = set()
        self._bucket_key = None
        # The hooks' callback holds this object weakly: the hooks live on the parameters, which
        # the optimizers this object holds keep alive (a cycle through C++ is never collected).
        me = weakref.ref(self)
        self._on_reduced_cb = lambda: me() is not None and me()._on_reduced()
        for opt, raw in ddp._raw_steps:
            self._opts[id(opt)] = _Optimizer(opt, raw)
            opt._bagua_step_ctl = weakref.ref(self)

    @property
    def engine(self):
        return self._engine()

    def state(self):
        """{optimizer: (mode, reason)}: "on" steps inside backward, "observe" until the first
        step() decides, "off" after backward (reason given)."""
        return {st.opt: (st.mode, st.reason or self.static_reason) for st in self._opts.values()}

    def close(self):
        for st in self._opts.values():
            if getattr(st.opt, "_bagua_step_ctl", None) is not None and \
                    st.opt._bagua_step_ctl() is self:
                del st.opt._bagua_step_ctl
        self._opts = {}
        self.active = []

    def _log_once(self, st, msg):
        key = (id(st.opt), msg)
        if key not in self._logged:
            self._logged.add(key)
            _LOG.info("bagua: %s %s", type(st.opt).__name__, msg)

    def _eligible(self, st):
        """Why this optimizer cannot step inside backward at all, or None."""
        if self.static_reason is not None:
            return self.static_reason
        from ..contrib.fuse.optimizer import is_fused_optimizer

        if not is_fused_optimizer(st.opt):
            return "is not a fused optimizer (bagua.torch_api.contrib.fuse_optimizer)"
        if type(st.opt) not in PER_PARAMETER:
            return "{}.step is not known to update each parameter on its own (those that " \
                   "are: {})".format(type(st.opt).__name__,
                                     ", ".join(c.__name__ for c in PER_PARAMETER))
        return None

    # ---- backward ----------------------------------------------------------------------------

    def begin_backward(self, sync):
        """At the first gradient of a backward pass (from the hooks' on_first)."""
        for st in self._opts.values():
            if st.pending:
                st.pending = False  # raise once, then behave as after backward
                st.mode, st.reason = OFF, "a second backward pass before optimizer.step()"
                raise RuntimeError(
                    "bagua: {} already stepped the previous backward pass's gradients inside "
                    "that backward pass (BAGUA_OPTIM_STEP_IN_BACKWARD), but optimizer.step() "
                    "was not called before this backward pass. For gradient accumulation use "
                    "model.no_sync(); for other loops set BAGUA_OPTIM_STEP_IN_BACKWARD=0".format(
                        type(st.opt).__name__))
            if sync:
                st.sync_backwards += 1
        engine = self.engine
        self.active = [st for st in self._opts.values()
                       if sync and st.mode == ON and st.sync_backwards == 1]
        self._stepped = set()
        self._fresh = []
        if self.active:
            red = engine._reducer
            key = (id(red), red.layout_generation, tuple(
                (id(g["params"]), len(g["params"])) for st in self.active
                for g in st.opt.param_groups))
            if key != self._bucket_key:
                self._bucket_key = key
                bucket_params = red.bucket_params()
                self._bucket_params = bucket_params
                self._bucket_of = {id(engine._params[i]): b
                                   for b, idx in enumerate(bucket_params) for i in idx}
            for st in self.active:
                st.layout(key, self._bucket_of, len(self._bucket_params))
                st.hypers = _hypers(st.opt)
                st.fused_groups = set()
            if engine.is_cuda and self._stream is None:
                self._stream = torch.cuda.Stream(engine._params[0].device)
            if engine.is_cuda:
                self._trainer_stream = engine._torch_stream  # torch's current stream at the wrap
        hooks = engine.ddp._hook_state
        if hooks is not None:
            hooks.set_on_reduced(self._on_reduced_cb if self.active and engine.is_cuda else None)

    def _on_reduced(self):
        """Hooks (CUDA): buckets whose collective is enqueued, stepped on the side stream."""
        engine = self.engine
        if engine is None or not self.active:
            return
        n = engine._reducer.buckets_reduced()
        for b in range(n):
            if b not in self._stepped:
                self._step_bucket(b)

    def _repoint(self, b):
        """Gradients autograd allocated afresh (zero_grad(set_to_none=True)) were copied to
        their laid-out homes when ready: the bucket's parameters point there again before the
        optimizer reads them (the fresh ones stay alive until backward ends)."""
        engine = self.engine
        keep = engine._keep_by_index
        if not keep:
            return
        red = engine._reducer
        for i in self._bucket_params[b]:
            v = keep.get(i)
            if v is not None:
                p = engine._params[i]
                g = p.grad
                if g is not v:
                    self._fresh.append(g)
                    p.grad = v
                    red.set_grad(i, v.data_ptr())  # copied back there (none: v is the slot)

    def _step_bucket(self, b):
        from ..contrib.fuse.optimizer import _planned_bucket_step

        self._stepped.add(b)
        self._repoint(b)  # (host: a second time is a no-op)
        engine = self.engine
        with torch.autograd.profiler.record_function("bagua.step_in_backward"):
            if engine.is_cuda:  # the side stream after the reduction, gradients brought back
                engine._reducer.copy_bucket_out_on(b, self._stream.cuda_stream)
                ctx = torch.cuda.stream(self._stream)
            else:
                ctx = _NULL
            with ctx:
                for st in self.active:
                    lists = st.by_bucket[b]
                    if any(lists):
                        _, fused = _planned_bucket_step(st.opt, st.raw_step, lists, b)
                        st.fused_groups |= fused

    def post_backward(self):
        """Before finish_backward, backward having ended: every bucket not stepped yet, each as
        soon as it is reduced (CUDA: enqueued)."""
        if not self.active:
            return
        red = self.engine._reducer
        red.mark_unused_ready()
        for b in range(len(self._bucket_params)):
            if b in self._stepped:
                continue
            if not self.engine.is_cuda:
                self._repoint(b)  # before a copied bucket is copied back
            red.wait_bucket_reduced(b)
            self._step_bucket(b)

    def after_finish(self, sync):
        """After finish_backward: the streams, the snapshots."""
        if self.active:
            if self._stream is not None:
                self._trainer_stream.wait_stream(self._stream)
            for st in self.active:
                st.snapshot()
                st.pending = True
            self._fresh = []
            self.active = []
        elif sync and self.static_reason is None:
            # Where no optimizer can step inside backward there is nothing to observe.
            for st in self._opts.values():
                if st.mode == OBSERVE:
                    engine = self.engine
                    red = engine._reducer
                    key = (id(red), red.layout_generation, tuple(
                        (id(g["params"]), len(g["params"])) for g in st.opt.param_groups))
                    buckets = red.bucket_params()
                    bucket_of = {id(engine._params[i]): b
                                 for b, idx in enumerate(buckets) for i in idx}
                    st.layout(key, bucket_of, len(buckets))
                    st.snapshot()
                    st.hypers = _hypers(st.opt)

    # ---- the user's step -----------------------------------------------------------------------

    def finish_if_stepped(self, opt, args, kwargs, fused):
        """The user's step() / fuse_step(): True when this backward's buckets were stepped
        already (the parameters no bucket holds are stepped now), False to step as usual."""
        st = self._opts.get(id(opt))
        if st is None or not st.pending:
            return False
        st.pending = False
        st.sync_backwards = 0
        why = st.changed_since_snapshot(args, kwargs)
        if why is not None:
            st.mode, st.reason = OFF, why
            raise RuntimeError(
                "bagua: {} stepped its buckets inside the backward pass "
                "(BAGUA_OPTIM_STEP_IN_BACKWARD), but then {}: that step has already been taken "
                "with the gradients as backward left them. Set "
                "BAGUA_OPTIM_STEP_IN_BACKWARD=0 for this training loop".format(
                    type(opt).__name__, why))
        from ..contrib.fuse.optimizer import _fuse_and_step

        if any(st.rest):
            _, groups = _fuse_and_step(opt, st.raw_step, st.rest)
            st.fused_groups |= groups
        if fused:
            opt._bagua_fused_count += len(st.fused_groups)
        st.fused_groups = set()
        return True

    def observe_step(self, opt, args, kwargs):
        """The user's step() when nothing was stepped in backward: in the observing mode, decides
        whether the next backward passes step this optimizer."""
        st = self._opts.get(id(opt))
        if st is None:
            return
        if st.mode == OBSERVE:
            why = self._eligible(st)
            if why is None and st.sync_backwards != 1:
                why = "{} backward passes that communicated before optimizer.step() (gradient " \
                      "accumulation without no_sync())".format(st.sync_backwards)
            if why is None:
                why = st.changed_since_snapshot(args, kwargs)
            if why is None and st.grads is None:
                why = "optimizer.step() before any backward pass that communicated"
            if why is None:
                st.mode = ON
                self._log_once(st, "steps each bucket inside the backward pass from the next "
                                   "iteration on")
            else:
                st.mode, st.reason = OFF, why
                self._log_once(st, "steps after the backward pass: " + why)
        st.sync_backwards = 0
        st.grads = None


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()
