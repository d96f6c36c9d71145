"""Bagua's contrib: cached dataset and loader, load-balancing samplers, generic fused optimizer,
synchronized batch norm, key-value stores."""

from .cache_loader import CacheLoader  # noqa: F401
from .cached_dataset import CachedDataset  # noqa: F401
from .load_balancing_data_loader import (  # noqa: F401
    LoadBalancingDistributedSampler,
    LoadBalancingDistributedBatchSampler,
)
from .elastic_sampler import ElasticDistributedSampler  # noqa: F401
from .fuse.optimizer import fuse_optimizer, fuse_step, is_fused_optimizer  # noqa: F401
from .sync_batchnorm import SyncBatchNorm  # noqa: F401
from . import utils  # noqa: F401
