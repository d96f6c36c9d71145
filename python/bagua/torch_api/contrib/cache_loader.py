"""Bagua's ``CacheLoader``: values computed by an expensive function, cached by key in a
key-value store (``.store``), under ``"{dataset_name}_{key}"``, encoded by ``utils/codec.py``
(typed, or an authenticated pickle; never a bare pickle, so a value planted in a shared Redis
runs nothing: it is a miss, counted as ``corrupt`` and logged).

Backends: ``"redis"`` (``RedisStore``; ``hosts``, ``cluster_mode`` and ``capacity_per_node``
are passed to it, as in Bagua) and ``"embedded"`` (our addition: the dataset_cache library's
in-process store). The read/write path is the dataset_cache library's CacheLoader (C++):
writes are buffered ``writer_buffer_size`` at a time and a backend outage degrades to calling
the load function, reported once. One backend per distinct configuration is shared by every
loader of the process.
"""

from .._ext import ext
from .utils import codec
from .utils.redis_store import RedisStore, _BackendStore, _hosts

__all__ = ["CacheLoader"]

_stores = {}


def _store(backend, kwargs):
    capacity = int(kwargs.pop("capacity_per_node", 0) or 0)
    hosts = kwargs.pop("hosts", None)
    cluster_mode = kwargs.pop("cluster_mode", True)
    if kwargs:
        raise TypeError("bagua CacheLoader: unexpected arguments {}".format(sorted(kwargs)))
    if backend == "redis":
        key = ("redis", tuple(_hosts(hosts)) if hosts is not None else None, bool(cluster_mode),
               capacity)
        if key not in _stores:
            _stores[key] = RedisStore(hosts=hosts, cluster_mode=cluster_mode,
                                      capacity_per_node=capacity or 107_374_182_400)
        return _stores[key]
    if backend == "embedded":
        key = ("embedded", capacity)
        if key not in _stores:
            _stores[key] = _BackendStore(ext.make_cache_backend("embedded", capacity))
        return _stores[key]
    raise ValueError("bagua: cache backend must be 'redis' or 'embedded', got {!r}".format(backend))


def _backend_of(store):
    return store._backend if isinstance(store, RedisStore) else store.backend


class CacheLoader:
    def __init__(self, backend="redis", dataset_name="", writer_buffer_size=1, **kwargs):
        self.backend = backend
        self.dataset_name = dataset_name
        self.store = _store(backend, dict(kwargs))
        self._loader = ext.CacheLoader(_backend_of(self.store), dataset_name,
                                       max(1, int(writer_buffer_size)))

    def get(self, key, load_fn):
        """The cached value of ``key``, or ``load_fn(key)`` (then cached). A cached value that
        does not decode (damaged, planted, another job's) is reloaded with ``load_fn``."""
        raised = []
        loaded = []
        decoded = []
        cache_key = "{}_{}".format(self.dataset_name, key)

        def load(_k):
            try:
                value = load_fn(key)
                loaded.append(value)
                return codec.encode(value, cache_key)
            except BaseException as e:  # re-raised below as it is (IndexError ends iteration)
                raised.append(e)
                raise

        def check(data):
            decoded.append(codec.decode(data, cache_key))

        try:
            self._loader.get(str(key), load, check)
        except RuntimeError:
            if raised:
                raise raised[0] from None
            raise
        return loaded[-1] if loaded else decoded[-1]

    def num_keys(self):
        """Keys in the store (every dataset's, as in Bagua)."""
        self._loader.flush()
        return self.store.num_keys()

    def flush(self):
        self._loader.flush()

    def stats(self):
        return self._loader.stats()
