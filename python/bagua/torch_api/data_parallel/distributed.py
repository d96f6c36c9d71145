"""``torch.nn.Module.with_bagua`` (Bagua's entry point), installed on import of bagua.torch_api."""

import torch

from .bagua_distributed import BaguaDistributedDataParallel


def with_bagua(self, optimizers, algorithm, process_group=None, do_flatten=True):
    """Wraps this module for distributed training with ``algorithm`` and returns it.

    The module stays the same object (state_dict keys unchanged). ``self.module`` is provided
    as an alias of the module itself when the module has no attribute of that name, so DDP-style
    checkpoint code (``model.module.state_dict()``, Bagua issue #334) keeps working. Wrapping
    again (another algorithm) replaces the previous wrap (Bagua's model switch).
    """
    old = self.__dict__.get("_bagua_ddp")
    if old is not None:
        old.close()
    ddp = BaguaDistributedDataParallel(
        self, optimizers, algorithm, process_group=process_group,
        gradient_as_bucket_view=do_flatten)
    self.__dict__["_bagua_ddp"] = ddp
    self.__dict__["bagua_algorithm"] = algorithm
    self.__dict__["bagua_optimizers"] = list(optimizers or [])
    if "module" not in self.__dict__ and "module" not in self._modules and not hasattr(type(self), "module"):
        self.__dict__["module"] = self
    if not hasattr(type(self), "no_sync"):
        self.__dict__["no_sync"] = ddp.no_sync
    return self


def _bagua_ddp(self):
    return self.__dict__.get("_bagua_ddp")


def install():
    torch.nn.Module.with_bagua = with_bagua
    torch.nn.Module.bagua_ddp = property(_bagua_ddp)
