"""DDP-compatible wrapper (Bagua's bagua.torch_api.data_parallel.DistributedDataParallel)."""

import torch

from ..algorithms import GradientAllReduceAlgorithm
from .bagua_distributed import BaguaDistributedDataParallel


class DistributedDataParallel(torch.nn.Module):
    """torch DDP's arguments plus Bagua's ``optimizers`` and ``algorithm``.

    ``module`` is the wrapped model (state_dict keys get the ``module.`` prefix, as with torch
    DDP). ``bucket_cap_mb`` is honoured (Bagua ignored it); ``device_ids``, ``output_device``,
    ``dim``, ``check_reduction`` and ``static_graph`` are accepted for compatibility.
    """

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
        static_graph=False,
        optimizers=(),
        algorithm=None,
    ):
        super().__init__()
        self.module = module
        algorithm = algorithm if algorithm is not None else GradientAllReduceAlgorithm()
        self.__dict__["_bagua_ddp"] = BaguaDistributedDataParallel(
            module, list(optimizers), algorithm, process_group=process_group,
            bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
            broadcast_buffers=broadcast_buffers)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view

    @property
    def bagua_algorithm(self):
        return self.__dict__["_bagua_ddp"].bagua_algorithm

    @property
    def bagua_optimizers(self):
        return self.__dict__["_bagua_ddp"].optimizers

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def no_sync(self):
        return self.__dict__["_bagua_ddp"].no_sync()

    def close(self):
        self.__dict__["_bagua_ddp"].close()


__all__ = ["DistributedDataParallel", "BaguaDistributedDataParallel"]
