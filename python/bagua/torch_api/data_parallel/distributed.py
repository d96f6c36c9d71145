"""torch DDP-compatible wrappers (Bagua's ``bagua.torch_api.data_parallel.distributed``).

``DistributedDataParallel_V1_9_0``: torch 1.9 DDP's interface on the Bagua engine
(``.module`` is the wrapped module, ``.inner`` the engine; state_dict keys get ``module.``).
``DistributedDataParallel``: the same, except that, as in Bagua, arguments the engine does not
support (``device_ids``, ``output_device``, ``dim != 0``, ``check_reduction``) fall back to
torch's own DDP with a warning. Ours honours ``bucket_cap_mb`` and ``broadcast_buffers``
(buffers broadcast from rank 0 before each training forward, as torch DDP does; Bagua ignored
both); ``DistributedDataParallel_V1_9_0`` is Bagua's exactly (buffers not broadcast).
"""

import contextlib
import warnings

import torch
from torch.nn.modules import Module

from ..communication import BaguaProcessGroup, _get_default_group
from ..algorithms import GradientAllReduceAlgorithm
from .bagua_distributed import BaguaDistributedDataParallel

__all__ = ["DistributedDataParallel", "DistributedDataParallel_V1_9_0",
           "to_bagua_process_group"]


def to_bagua_process_group(process_group=None):
    """The Bagua group for ``process_group``: None or torch's default group -> the default
    group; a torch group -> its Bagua twin (``bagua_patch()``); a Bagua group -> itself."""
    if process_group is None or isinstance(process_group, BaguaProcessGroup):
        return process_group if process_group is not None else _get_default_group()
    import torch.distributed as dist

    if isinstance(process_group, dist.ProcessGroup):
        if dist.is_initialized() and process_group is dist.distributed_c10d._get_default_group():
            return _get_default_group()
        return process_group.bagua_patch().bagua_pg
    raise TypeError("bagua: process_group must be a torch or Bagua process group or None, got "
                    "{}".format(type(process_group)))


class DistributedDataParallel_V1_9_0(Module):
    """torch 1.9 DDP's interface with Bagua's ``optimizers`` and ``algorithm``."""

    def __init__(
        self,
        module,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=True,
        process_group=None,
        bucket_cap_mb=25,
        find_unused_parameters=False,
        check_reduction=False,
        gradient_as_bucket_view=True,
        optimizers=(),
        algorithm=None,
        static_graph=False,
        _bagua_broadcast_buffers=False,
        _engine_options=None,
    ):
        super().__init__()
        if not any(p.requires_grad for p in module.parameters()):
            raise ValueError("DistributedDataParallel is not needed when a module doesn't have "
                             "any parameter that requires a gradient.")
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        types = {p.device.type for p in module.parameters()}
        if len(types) != 1:
            raise ValueError("DistributedDataParallel's input module must be on the same type "
                             "of devices, but input module parameters locate in {}.".format(types))
        self.device_type = types.pop()
        self.is_multi_device_module = len({p.device for p in module.parameters()}) > 1
        self.static_graph = static_graph
        self.dim = dim
        self.module = module
        self.device = next(iter(module.parameters())).device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        if "_bagua_module_name" not in module.__dict__:
            module.__dict__["_bagua_module_name"] = "{}_{}".format(type(self).__name__,
                                                                  id(module))
        self.__dict__["inner"] = BaguaDistributedDataParallel(
            module, list(optimizers),
            algorithm if algorithm is not None else GradientAllReduceAlgorithm(),
            process_group=to_bagua_process_group(process_group),
            bagua_module_name=module.bagua_module_name,
            gradient_as_bucket_view=gradient_as_bucket_view,
            find_unused_parameters=find_unused_parameters,
            bucket_cap_mb=bucket_cap_mb,
            broadcast_buffers=_bagua_broadcast_buffers and broadcast_buffers,
            engine_options=_engine_options)

    @property
    def require_backward_grad_sync(self):
        """False: backward accumulates gradients locally (see ``no_sync``)."""
        return self.inner.require_backward_grad_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value):
        self.inner.require_backward_grad_sync = bool(value)

    @property
    def parameters_to_ignore(self):
        return self.inner.parameters_to_ignore

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first backward after it reduces them."""
        old = self.inner.require_backward_grad_sync
        self.inner.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.inner.require_backward_grad_sync = old

    @property
    def bagua_algorithm(self):
        """The algorithm implementation (``AlgorithmImpl``) of the wrap."""
        return self.inner.bagua_algorithm

    @property
    def bagua_optimizers(self):
        return self.inner.bagua_optimizers

    @property
    def bagua_buckets(self):
        return self.inner.bagua_buckets

    @property
    def bagua_train_step_counter(self):
        return self.inner.bagua_train_step_counter

    def train(self, mode=True):
        super().train(mode)
        return self

    def will_sync_module_buffers(self):
        return bool(self.inner._broadcast_buffers)

    def close(self):
        """Removes the engine's hooks (the module trains alone afterwards)."""
        self.inner.close()


class DistributedDataParallel(DistributedDataParallel_V1_9_0):
    """torch DDP's arguments plus Bagua's ``optimizers`` and ``algorithm`` (see the module
    docstring for the fallback to torch DDP and the buffer broadcast)."""

    def __new__(cls, module=None, device_ids=None, output_device=None, dim=0,
                broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                find_unused_parameters=False, check_reduction=False,
                gradient_as_bucket_view=True, static_graph=False, optimizers=(),
                algorithm=None, *, _engine_options=None):
        if device_ids is None and output_device is None and dim == 0 and not check_reduction:
            return super().__new__(cls)
        warnings.warn("bagua: device_ids, output_device, dim and check_reduction are not "
                      "supported by Bagua's DistributedDataParallel: falling back to torch's "
                      "(as Bagua does); optimizers and algorithm are not used")
        pg = process_group
        if isinstance(pg, BaguaProcessGroup):
            raise ValueError("bagua: the torch DDP fallback needs a torch process group")
        return torch.nn.parallel.DistributedDataParallel(
            module=module, device_ids=device_ids, output_device=output_device, dim=dim,
            broadcast_buffers=broadcast_buffers, process_group=pg,
            bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
            check_reduction=check_reduction, gradient_as_bucket_view=gradient_as_bucket_view)

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=True, static_graph=False, optimizers=(),
                 algorithm=None, *, _engine_options=None):
        super().__init__(module, device_ids, output_device, dim, broadcast_buffers,
                         process_group, bucket_cap_mb, find_unused_parameters, check_reduction,
                         gradient_as_bucket_view, optimizers, algorithm, static_graph,
                         _bagua_broadcast_buffers=True, _engine_options=_engine_options)


