"""Bagua's CachedDataset / CacheLoader on the dataset_cache library.

Samples are pickled (as Bagua does) and stored under "{dataset_name}_{index}". Backends:
"embedded" (the in-process store of dataset_cache) and "redis" (spawned or listed Redis
servers, BAGUA_CACHE_REDIS_* parameters). One backend per kind is shared by every loader of the
process (Bagua spawns its Redis servers once per process too).
"""

import pickle
import warnings

import torch

from .._ext import ext

_backends = {}


def _backend(kind, capacity):
    if kind not in ("redis", "embedded"):
        raise ValueError("bagua: cache backend must be 'redis' or 'embedded', got {!r}".format(kind))
    if kind not in _backends:
        _backends[kind] = ext.make_cache_backend(kind, int(capacity or 0))
    return _backends[kind]


class CacheLoader:
    def __init__(self, backend="redis", dataset_name="", writer_buffer_size=1, **kwargs):
        capacity = kwargs.pop("capacity_per_node", 0)
        for k in kwargs:
            warnings.warn("bagua CacheLoader: argument {!r} is not used (set BAGUA_CACHE_* "
                          "parameters instead)".format(k))
        self.backend = backend
        self.dataset_name = dataset_name
        self._loader = ext.CacheLoader(_backend(backend, capacity), dataset_name,
                                       max(1, int(writer_buffer_size)))

    def get(self, key, load_fn):
        """The cached value of ``key``, or ``load_fn(key)`` (then cached)."""
        data = self._loader.get(str(key), lambda _k: pickle.dumps(load_fn(key)))
        return pickle.loads(data)

    def num_keys(self):
        return self._loader.num_keys()

    def flush(self):
        self._loader.flush()

    def stats(self):
        return self._loader.stats()


class CachedDataset(torch.utils.data.Dataset):
    def __init__(self, dataset, backend="redis", dataset_name="", writer_buffer_size=20, **kwargs):
        super().__init__()
        self.dataset = dataset
        self.cache_loader = CacheLoader(backend, dataset_name, writer_buffer_size, **kwargs)

    def __getitem__(self, item):
        return self.cache_loader.get(item, lambda x: self.dataset[x])

    def __len__(self):
        return len(self.dataset)
