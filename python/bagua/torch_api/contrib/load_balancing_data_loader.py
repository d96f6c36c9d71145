"""Bagua's load-balancing samplers on the loader library (same orders on every rank).

The per-epoch noise comes from the loader library's portable generator, not torch.Generator,
so the exact shuffled order differs from Bagua's; the documented guarantees hold (each step's
samples on all ranks are complexity neighbours; every rank gets num_samples samples).
"""

import torch

from .._ext import ext


def _world():
    from .. import communication as comm

    if comm.is_initialized():
        return comm.get_world_size(), comm.get_rank()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    raise RuntimeError("bagua: pass num_replicas and rank, or initialise a process group first")


class LoadBalancingDistributedSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, complexity_fn, num_replicas=None, rank=None, shuffle=True,
                 seed=0, drop_last=False, random_level=0):
        if num_replicas is None or rank is None:
            w, r = _world()
            num_replicas = w if num_replicas is None else num_replicas
            rank = r if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError("Invalid rank {}, rank should be in the interval [0, {}]".format(
                rank, num_replicas - 1))
        if random_level < 0.0 or random_level > 1.0:
            raise ValueError("Invalid random level {}, shoule be in the range [0.0, 1.0]".format(
                random_level))
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.random_level = random_level
        self.epoch = 0
        complexities = [int(complexity_fn(dataset[i])) for i in range(len(dataset))]
        self._s = ext.LoadBalancingSampler(complexities, num_replicas, rank, shuffle, seed,
                                           drop_last, float(random_level))
        self.num_samples = self._s.num_samples
        self.total_size = self._s.total_size

    def __iter__(self):
        self._s.set_epoch(self.epoch)
        return iter(self._s.indices())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class LoadBalancingDistributedBatchSampler(torch.utils.data.Sampler):
    """Variable-size batches from ``batch_fn(indices) -> list of lists``; every rank gets the
    same number of batches (padding cyclically; with drop_last truncating, which fixes Bagua's
    drop_last bug)."""

    def __init__(self, sampler, batch_fn, drop_last=False):
        if not isinstance(sampler, LoadBalancingDistributedSampler):
            raise ValueError("sampler should be of LoadBalancingDistributedSampler type.")
        if sampler.drop_last:
            raise ValueError("drop_last of sampler should be False")
        self.sampler = sampler
        self.batch_fn = batch_fn
        self.drop_last = drop_last
        self.epoch = sampler.epoch
        self._b = ext.LoadBalancingBatchSampler(
            sampler._s, lambda idx: [list(b) for b in batch_fn(list(idx))], drop_last)
        self._b.set_epoch(self.epoch)

    def set_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.epoch = epoch
        self._b.set_epoch(epoch)

    def __iter__(self):
        return iter(self._b.batches())

    def __len__(self):
        return self._b.num_batches
