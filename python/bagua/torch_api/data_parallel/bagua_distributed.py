"""The engine behind ``with_bagua`` and ``DistributedDataParallel``.

CPU models: the C++ reducer (core::DistributedDataParallel) with the C++ algorithm. Python
registers autograd hooks that mark each gradient ready (post-accumulate-grad hooks where torch
has them, the AccumulateGrad node's hook otherwise), queues an end-of-backward callback that
waits for the buckets, patches ``optimizer.step`` to run the post-step hook, and runs the
forward-pre hook from a module forward-pre hook (training mode with grad enabled only).

CUDA models: the same C++ reducer on the NCCL group (device buckets; gradient copies ordered
after torch's current stream with CUDA events). ``CUDA_REDUCER = "python"`` selects
``DeviceReducer`` instead (gradient_allreduce only, in Python over the NCCL communicator; kept
as a comparison point for the benchmark).
"""

#: "core" (the C++ reducer) or "python" (device_reducer.DeviceReducer) for CUDA models.
CUDA_REDUCER = "core"

import contextlib
import weakref

import torch

from .._ext import ext
from .. import communication as comm
from ..algorithms import Algorithm, GradientAllReduceAlgorithm
from ..algorithms.q_adam import QAdamAlgorithm


def _ignored_names(module):
    names = set()
    for attr in ("_bagua_params_and_buffers_to_ignore", "_ddp_params_and_buffers_to_ignore"):
        names.update(getattr(module, attr, []) or [])
    return names


def _spec(name, t, grad_ptr=0):
    dev_type = 1 if t.is_cuda else 0
    dev_index = t.device.index if t.is_cuda else 0
    return (name, t.data_ptr(), grad_ptr, t.numel(), comm.dtype_code(t.dtype), dev_type,
            dev_index or 0, t.requires_grad)


def _broadcast_optimizer_state(optimizers, group):
    """Every rank takes rank 0's optimizer state (tensors directly, other values pickled)."""
    for opt in optimizers:
        if isinstance(opt, QAdamAlgorithm):
            continue
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


class BaguaDistributedDataParallel:
    """One wrap of ``module`` with ``algorithm`` (see the module docstring)."""

    def __init__(
        self,
        module,
        optimizers,
        algorithm,
        process_group=None,
        bucket_cap_mb=25,
        find_unused_parameters=False,
        gradient_as_bucket_view=True,
        broadcast_buffers=True,
        first_bucket_bytes=0,
    ):
        if algorithm is None:
            algorithm = GradientAllReduceAlgorithm()
        if not isinstance(algorithm, Algorithm):
            raise TypeError("bagua: algorithm must be a bagua.torch_api.algorithms.Algorithm")
        self.module = module
        self.optimizers = list(optimizers or [])
        self.bagua_algorithm = algorithm
        self.process_group = process_group or comm.get_default_group()
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        ignore = _ignored_names(module)
        self._named_params = list(module.named_parameters())
        self._params = [p for _, p in self._named_params]
        self._named_buffers = list(module.named_buffers())
        devices = {p.device.type for p in self._params} | {b.device.type for _, b in self._named_buffers}
        if len(devices) > 1:
            raise ValueError("bagua: the model has parameters on {}; put it on one device "
                             "type".format(sorted(devices)))
        self.is_cuda = devices == {"cuda"}
        self._hooks = []
        self._grad_accs = []
        self._patched = []
        self._in_backward = False
        self._no_sync = False
        self._closed = False

        for i, p in enumerate(self._params):
            if p.grad is not None and not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
        _broadcast_optimizer_state(self.optimizers, self.process_group)

        if self.is_cuda and CUDA_REDUCER == "python":
            from .device_reducer import DeviceReducer

            self._reducer = DeviceReducer(
                self._named_params, self._named_buffers, algorithm, self.process_group,
                bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                gradient_as_bucket_view=gradient_as_bucket_view,
                broadcast_buffers=broadcast_buffers, ignore=ignore)
        else:
            qadam = algorithm.optimizer if isinstance(algorithm, QAdamAlgorithm) else None
            if qadam is not None:
                ids = [id(p) for p in qadam._params]
                if ids != [id(p) for p in self._params]:
                    raise ValueError(
                        "bagua: QAdamAlgorithm needs QAdamOptimizer(model.parameters(), ...) over "
                        "exactly the model's parameters, in order")
            # The core reads a gradient pointer when it (re)builds buckets, at creation and at
            # algorithm resets; parameters without a gradient yet point at a shared zero buffer
            # (read only: the core writes gradients only in finish_backward, when every
            # pointer is a real gradient).
            most = max([p.numel() * p.element_size() for p in self._params] + [8])
            dev = self._params[0].device if self._params else torch.device("cpu")
            self._zero_grad = torch.zeros(most, dtype=torch.uint8, device=dev)
            group = self.process_group._host
            stream = 0
            if self.is_cuda:
                if self.process_group._nccl is None:
                    raise RuntimeError("bagua: CUDA model but no NCCL communicator (extension "
                                       "built without NCCL, or no GPU at init_process_group)")
                group = self.process_group._nccl
                stream = torch.cuda.current_stream(dev).cuda_stream
            params = [_spec(n, p, self._grad_ptr(p)) for n, p in self._named_params]
            buffers = [_spec(n, b) for n, b in self._named_buffers if b.is_contiguous()]
            ext_algo = algorithm._make_ext()
            self._reducer = ext.Reducer(
                group, params, buffers, ext_algo,
                qadam._ext if qadam is not None else None,
                float(bucket_cap_mb), bool(find_unused_parameters), bool(broadcast_buffers),
                True, sorted(ignore), int(first_bucket_bytes), int(stream))
        self._python_device = self.is_cuda and CUDA_REDUCER == "python"
        self._communicated = set(self._reducer.communicated())
        self._register_hooks()
        self._patch_optimizers()

    # ---- hooks -----------------------------------------------------------------------------

    def _register_hooks(self):
        me = weakref.ref(self)

        def pre_forward(module, inputs):
            s = me()
            if s is not None:
                s._pre_forward()

        self._hooks.append(self.module.register_forward_pre_hook(pre_forward))
        for i, p in enumerate(self._params):
            if not p.requires_grad:
                continue

            def on_grad(*_, i=i):
                s = me()
                if s is not None:
                    s._on_grad(i)

            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._hooks.append(p.register_post_accumulate_grad_hook(on_grad))
            else:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hooks.append(acc.register_hook(on_grad))
                self._grad_accs.append(acc)

    def _grad_ptr(self, p):
        if p.grad is not None and p.grad.is_contiguous():
            return p.grad.data_ptr()
        return self._zero_grad.data_ptr()

    def _pre_forward(self):
        if self._closed or not (self.module.training and torch.is_grad_enabled()):
            return
        if not self._python_device:
            for i, p in enumerate(self._params):
                self._reducer.set_grad(i, self._grad_ptr(p))
        self._reducer.prepare_forward()

    def _on_grad(self, i):
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._post_backward)
        if i not in self._communicated or self._no_sync:
            return
        p = self._params[i]
        g = p.grad
        if g is None:
            return
        if g.is_sparse:
            raise RuntimeError("bagua: sparse gradients are not supported ({})".format(
                self._named_params[i][0]))
        if not g.is_contiguous():
            p.grad = g = g.contiguous()
        self._reducer.set_grad(i, g.data_ptr())
        self._reducer.mark_grad_ready(i)

    def _post_backward(self):
        self._in_backward = False
        if self._no_sync:
            self._reducer.finish_backward()
            return
        for i in self._communicated:
            p = self._params[i]
            if p.grad is None:
                # Unused this iteration: a zero gradient receives the others' average.
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            self._reducer.set_grad(i, p.grad.data_ptr())
        self._reducer.finish_backward()

    def _patch_optimizers(self):
        me = weakref.ref(self)
        for opt in self.optimizers:
            orig = opt.step

            def step(*args, _orig=orig, **kwargs):
                r = _orig(*args, **kwargs)
                s = me()
                if s is not None and not s._closed:
                    s._reducer.step()
                return r

            opt.step = step
            self._patched.append((opt, orig))

    # ---- user API --------------------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first backward after it reduces the sum."""
        old = self._no_sync
        self._no_sync = True
        self._reducer.set_no_sync(True)
        try:
            yield
        finally:
            self._no_sync = old
            self._reducer.set_no_sync(old)

    @property
    def bagua_train_step_counter(self):
        return self._reducer.train_step

    def bucket_layout(self):
        return self._reducer.bucket_layout()

    def close(self):
        """Removes the hooks and the optimizer patches and frees the reducer."""
        if self._closed:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._grad_accs.clear()
        for opt, orig in self._patched:
            if opt.__dict__.get("step") is not None:
                del opt.__dict__["step"]
            if opt.step != orig:
                opt.step = orig
        self._patched.clear()
        self._reducer = None
