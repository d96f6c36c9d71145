"""A user-written ``AlgorithmImpl`` on Bagua's hook protocol (``_PythonEngine``)."""

import struct
import weakref

import torch

from .. import communication as comm
from ._engine import _Engine, _broadcast_optimizer_state, _check_devices

_SCHEDULE_MAGIC = 0x43534742  # "BGSC"


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
