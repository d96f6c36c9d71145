"""The built-in algorithms on the C++ reducer (``_NativeEngine``).

CPU models: core::DistributedDataParallel with the C++ algorithm. Python
registers autograd hooks that mark each gradient ready (post-accumulate-grad hooks where torch
has them, the AccumulateGrad node's hook otherwise), queues an end-of-backward callback that
waits for the buckets, patches ``optimizer.step`` to run the post-step hook, and runs the
forward-pre hook from a module forward-pre hook (training mode with grad enabled only).
CUDA models: the same C++ reducer on the NCCL group (device buckets; gradient copies ordered
after torch's current stream with CUDA events).

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

import weakref

import torch

from .._ext import ext
from .. import communication as comm
from ..utils import _lay_out, _lay_out_grads, _lay_out_weights
from ._engine import _Engine, _broadcast_optimizer_state, _check_devices

_reducers_made = 0  # names each reducer's tuner (store keys), equal across ranks

#: Built-ins whose buckets hold the weights (Bagua's init_tensors): do_flatten lays out those.
_WEIGHT_ALGORITHMS = ("decentralized", "low_precision_decentralized", "async")


def _autotune_arg(autotune):
    """The reducer's autotune argument: -1 follows BAGUA_AUTOTUNE, 1 / 0 force it."""
    return -1 if autotune is None else int(bool(autotune))



def _spec(name, t, grad_ptr=0):
    dev_type = 1 if t.is_cuda else 0
    dev_index = t.device.index if t.is_cuda else 0
    return (name, t.data_ptr(), grad_ptr, t.numel(), comm.dtype_code(t.dtype), dev_type,
            dev_index or 0, t.requires_grad)


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
        return self._reducer

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
        self._homes_wanted = any(h is not None for h in self._homes)
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._synced = True  # a new reducer communicates

    def _keep_views(self):
        # Laid-out gradients to re-point fresh ones at (see the module docstring): only where
        # the reducer writes every reduced gradient back (communicated, the C++ reducer). Also
        # by parameter index, for stepping inside backward (step_in_backward.py).
        keep = [
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
            self._reducer.set_grads(self._grad_ptrs())
            steps.post_backward()
        fresh = []  # alive until the reducer is done with them (it may still be copying)
        for p, view in self._keep:
            g = p.grad
            if g is None:
                # No gradient this iteration (zero_grad(set_to_none=True), torch 2's default,
                # then unused): finish_backward names it, as find_unused_parameters is off.
                continue
            if g.data_ptr() != view.data_ptr():
                fresh.append(g)
                p.grad = view  # finish_backward writes the reduced gradient here
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

