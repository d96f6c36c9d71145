"""``torch.nn.Module.with_bagua`` and Bagua's ``bagua_*`` module attributes (``BaguaModule``),
installed on ``torch.nn.Module`` when ``bagua.torch_api`` is imported."""

import torch

from .communication import _get_default_group
from .data_parallel.bagua_distributed import BaguaDistributedDataParallel
from . import env

__all__ = ["BaguaModule"]


class BaguaModule:
    """The methods and properties patched onto ``torch.nn.Module`` (Bagua's names)."""

    def with_bagua(self, optimizers, algorithm, process_group=None, do_flatten=True, *,
                   _engine_options=None):
        """Wraps this module for distributed training with ``algorithm`` and returns it (the
        same object: state_dict keys unchanged).

        ``optimizers``: the optimizers stepping it (their state is broadcast from rank 0 and
        their ``step`` runs the algorithm's post-step hook); ``process_group``: default group
        when None; ``do_flatten``: lay each bucket's parameters out contiguously (see
        data_parallel/_native_engine.py). Buckets hold BAGUA_DEFAULT_BUCKET_SIZE bytes
        (25 MiB, torch DDP's size; Bagua's was 10 MiB: see env.get_default_bucket_size), the
        first 1 MiB as DDP's; a model with less than 4 MiB of gradients is cut into about four
        buckets (at least 64 KiB each) so that communication overlaps its backward pass.
        Parameters named in ``_bagua_params_and_buffers_to_ignore`` (or DDP's
        ``_ddp_params_and_buffers_to_ignore``) are left alone. Wrapping again (another
        algorithm) replaces the previous wrap (Bagua's model switch). Buffers are not
        broadcast in forward (Bagua does not either); use the DistributedDataParallel wrapper
        with ``broadcast_buffers=True`` for torch DDP's behaviour. ``_engine_options`` (not
        Bagua's): an ``EngineOptions`` (data_parallel/engine_options.py), for benchmarks and
        tests that compare the engine's modes."""
        if process_group is None:
            process_group = _get_default_group()
        if "_bagua_module_name" not in self.__dict__:
            self.__dict__["_bagua_module_name"] = "{}_{}".format(type(self).__name__, id(self))
        old = self.__dict__.get("bagua_ddp")
        if old is not None:
            old.close()
        ddp = BaguaDistributedDataParallel(
            self, optimizers, algorithm, process_group=process_group,
            bagua_module_name=self.bagua_module_name, gradient_as_bucket_view=do_flatten,
            bucket_cap_mb=env.get_default_bucket_size() / float(1 << 20),
            broadcast_buffers=False, engine_options=_engine_options)
        self.__dict__["bagua_ddp"] = ddp
        if not hasattr(type(self), "no_sync"):
            self.__dict__["no_sync"] = ddp.no_sync
        return self

    @property
    def bagua_module_name(self):
        """The name Bagua tells modules apart by (``<class>_<id>`` unless set)."""
        return self.__dict__.get("_bagua_module_name",
                                 "{}_{}".format(type(self).__name__, id(self)))

    @bagua_module_name.setter
    def bagua_module_name(self, name):
        self.__dict__["_bagua_module_name"] = name

    @property
    def bagua_algorithm(self):
        """The algorithm implementation (``AlgorithmImpl``) of the wrap."""
        return _wrap_of(self, "bagua_algorithm").bagua_algorithm

    @property
    def bagua_optimizers(self):
        return _wrap_of(self, "bagua_optimizers").bagua_optimizers

    @property
    def bagua_buckets(self):
        return _wrap_of(self, "bagua_buckets").bagua_buckets

    @property
    def bagua_train_step_counter(self):
        return _wrap_of(self, "bagua_train_step_counter").bagua_train_step_counter


def _wrap_of(module, what):
    """The module's with_bagua wrap; AttributeError (so getattr(m, what, None) works) before it."""
    ddp = module.__dict__.get("bagua_ddp")
    if ddp is None:
        raise AttributeError("{}.{}: call with_bagua(...) on this module first".format(
            type(module).__name__, what))
    return ddp


def _install():
    for name in ("with_bagua", "bagua_module_name", "bagua_algorithm", "bagua_optimizers",
                 "bagua_buckets", "bagua_train_step_counter"):
        setattr(torch.nn.Module, name, BaguaModule.__dict__[name])


_install()
