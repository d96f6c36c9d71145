"""Bagua's data-parallel wrappers (``DistributedDataParallel``) and their engine."""

from .bagua_distributed import BaguaDistributedDataParallel  # noqa: F401
from .distributed import (  # noqa: F401
    DistributedDataParallel,
    DistributedDataParallel_V1_9_0,
    to_bagua_process_group,
)
from . import functional  # noqa: F401

__all__ = ["DistributedDataParallel", "DistributedDataParallel_V1_9_0",
           "BaguaDistributedDataParallel", "to_bagua_process_group"]
