"""Bagua's ``CachedDataset``: a dataset whose samples are cached (encoded by utils/codec.py) in a
key-value store on first read, through ``CacheLoader`` (see cache_loader.py for backends and
arguments: ``hosts``, ``cluster_mode`` and ``capacity_per_node`` configure the Redis servers)."""

import torch

from .cache_loader import CacheLoader

__all__ = ["CachedDataset"]


class CachedDataset(torch.utils.data.Dataset):
    def __init__(self, dataset, backend="redis", dataset_name="", writer_buffer_size=20, **kwargs):
        super().__init__()
        self.dataset = dataset
        self.cache_loader = CacheLoader(backend, dataset_name, writer_buffer_size, **kwargs)

    def __getitem__(self, item):
        return self.cache_loader.get(item, lambda x: self.dataset[x])

    def __len__(self):
        return len(self.dataset)
