"""Bagua's key-value store interface (``Store``) and a store sharded over several
(``ClusterStore``). Values are ``bytes`` (or ``str``); a missing key reads as ``None``."""

import zlib

__all__ = ["Store", "ClusterStore"]


class Store:
    """The interface: ``set``, ``get``, ``mset``, ``mget``, ``num_keys``, ``clear``,
    ``status`` (True when alive), ``shutdown`` (stops the instances this store started)."""

    def set(self, key, value):
        raise NotImplementedError

    def get(self, key):
        raise NotImplementedError

    def num_keys(self):
        raise NotImplementedError

    def clear(self):
        raise NotImplementedError

    def mset(self, dictionary):
        for k, v in dictionary.items():
            self.set(k, v)

    def mget(self, keys):
        return [self.get(k) for k in keys]

    def status(self):
        raise NotImplementedError

    def shutdown(self):
        pass


class ClusterStore(Store):
    """Entries sharded over ``stores`` by a stable hash of the key (CRC-32 here; Bagua used
    xxHash64, so the shard of a key differs from Bagua's: a cache written by Bagua is not read
    back by key, which only costs misses)."""

    def __init__(self, stores):
        if not stores:
            raise ValueError("ClusterStore needs at least one store")
        self.stores = list(stores)
        self.num_stores = len(self.stores)

    def _hash_key(self, key):
        return zlib.crc32(key.encode() if isinstance(key, str) else key) % self.num_stores

    def route(self, key):
        return self.stores[self._hash_key(key)] if self.num_stores > 1 else self.stores[0]

    def set(self, key, value):
        self.route(key).set(key, value)

    def get(self, key):
        return self.route(key).get(key)

    def num_keys(self):
        return sum(s.num_keys() for s in self.stores)

    def clear(self):
        for s in self.stores:
            s.clear()

    def mset(self, dictionary):
        parts = {}
        for k, v in dictionary.items():
            parts.setdefault(self._hash_key(k) if self.num_stores > 1 else 0, {})[k] = v
        for i, part in parts.items():
            self.stores[i].mset(part)

    def mget(self, keys):
        parts = {}
        for pos, k in enumerate(keys):
            parts.setdefault(self._hash_key(k) if self.num_stores > 1 else 0, []).append(pos)
        out = [None] * len(keys)
        for i, positions in parts.items():
            got = self.stores[i].mget([keys[p] for p in positions])
            for p, v in zip(positions, got):
                out[p] = v
        return out

    def status(self):
        return all(s.status() for s in self.stores)

    def shutdown(self):
        for s in self.stores:
            s.shutdown()
