"""Bagua's ``RedisStore`` on the dataset_cache library's Redis backend (hiredis, C++).

``RedisStore(hosts=None, cluster_mode=True, capacity_per_node=100 GiB)``: ``hosts`` is a list of
``{"host": ..., "port": ...}``; with None, local ``redis-server`` processes are spawned (their
count and settings: BAGUA_CACHE_REDIS_*) and stopped when the store is garbage collected or
``shutdown()``. ``cluster_mode=True`` shards keys over every server; False makes the workers of
node n use server n % len(hosts), as in Bagua. No redis-py is needed.

Differences from Bagua: spawned servers belong to the process that made the store (Bagua
shared one per node through torch's store); the key -> server mapping is the library's own
hash (dataset_cache/README.md), not xxHash64.
"""

import shlex
import subprocess

from ..._ext import ext
from ... import env
from .store import ClusterStore, Store

__all__ = ["RedisStore", "start_redis_server_cli"]


def _hosts(hosts):
    out = []
    for h in hosts:
        if isinstance(h, dict):
            out.append((str(h["host"]), int(h["port"])))
        elif isinstance(h, str):
            host, _, port = h.rpartition(":")
            out.append((host.strip("[]"), int(port)))
        else:
            host, port = h
            out.append((str(host), int(port)))
    return out


class _BackendStore(Store):
    """The Store API over one C++ cache backend (which shards over its servers itself)."""

    def __init__(self, backend):
        self.backend = backend

    def set(self, key, value):
        self.backend.put(str(key), value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key):
        return self.backend.get(str(key))

    def mset(self, dictionary):
        self.backend.put_many([(str(k), v.encode() if isinstance(v, str) else bytes(v))
                               for k, v in dictionary.items()])

    def mget(self, keys):
        return self.backend.get_many([str(k) for k in keys])

    def num_keys(self):
        return self.backend.num_keys()

    def clear(self):
        self.backend.clear()

    def status(self):
        return self.backend.ping()

    def shutdown(self):
        self.backend = None  # spawned servers stop with the backend


class RedisStore(ClusterStore):
    def __init__(self, hosts=None, cluster_mode=True, capacity_per_node=107_374_182_400):
        if hosts is not None and len(hosts) == 0:
            raise ValueError("RedisStore hosts should not be empty.")
        self.hosts = _hosts(hosts) if hosts is not None else None
        self.cluster_mode = cluster_mode
        self._backend = ext.make_cache_backend(
            "redis", int(capacity_per_node), self.hosts or [], 1 if cluster_mode else 0,
            env.get_node_rank())
        super().__init__([_BackendStore(self._backend)])

    def describe(self):
        return self._backend.describe()

    def shutdown(self):
        super().shutdown()
        self._backend = None


def start_redis_server_cli(port, capacity, *args):
    """Starts a daemonized ``redis-server`` on ``port`` with a memory cap, random eviction and
    no persistence (Bagua's settings); extra ``args`` are more redis-server options. Unlike
    Bagua's, the server runs in protected mode (without a password it answers loopback clients
    only): to serve other hosts give it a password (``"--requirepass SECRET"``) and
    ``"--protected-mode no"``."""
    cmd = ["redis-server", "--daemonize", "yes", "--port", str(port), "--maxmemory",
           str(capacity), "--maxmemory-policy", "allkeys-random", "--appendonly", "no",
           "--save", "", "--protected-mode", "yes"]
    for a in args:
        cmd.extend(shlex.split(a))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
