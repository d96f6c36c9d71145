"""Bagua's contrib: cached dataset, load-balancing samplers, generic fused optimizer."""

from .cached_dataset import CachedDataset, CacheLoader  # noqa: F401
from .load_balancing_data_loader import (  # noqa: F401
    LoadBalancingDistributedSampler,
    LoadBalancingDistributedBatchSampler,
)
from .fuse.optimizer import fuse_optimizer, fuse_step, is_fused_optimizer  # noqa: F401
