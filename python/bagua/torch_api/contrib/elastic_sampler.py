"""A resumable, world-size-elastic batch sampler (issue 20): every sample of an epoch is
consumed exactly once, across restarts and changes of the number of ranks.

Plan of an epoch segment: the segment's global order G (a seeded permutation of the dataset,
or with ``complexities`` the load-balancing order of the loader library, in which each run of R
neighbours has similar cost) is cut into steps of R * batch_size samples; rank r takes
``block[r::R]`` of each step's block (with complexities: one sample of each run of R
neighbours, as the load-balancing sampler does). When the last block has fewer than R samples
it joins the step before (a few ranks then get batch_size + 1 samples once), so every rank
gets a non-empty batch at every step and all ranks run the same number of steps; only a
segment with fewer samples than ranks gives some ranks an empty last batch (run the step
anyway, with a zero gradient, so the collectives stay matched). Nothing is padded and nothing
dropped.

Resume: ``state_dict(batches_consumed)`` records the samples of the segment not yet consumed
(G after the first ``batches_consumed`` steps); ``load_state_dict`` on any world size makes
them the new segment, re-cut for the new R (with complexities: re-sorted by cost and re-chunked
into runs of the new R, so balance holds after the change). The counter ``batches_consumed``
is advanced by ``track(loader)``, which wraps the loader's iterator at the pace of the training
loop (not of the loader's prefetching).

Deterministic: the order depends on (dataset size, seed, epoch, complexities, world size) and,
after a resume, on the saved remainder only; the same on every rank, no communication.
"""

import random

import torch

from .._ext import ext
from .load_balancing_data_loader import _world  # the samplers' world and rank

__all__ = ["ElasticDistributedSampler"]


class ElasticDistributedSampler(torch.utils.data.Sampler):
    """Batch sampler: ``DataLoader(dataset, batch_sampler=ElasticDistributedSampler(...))``.

    Args:
        dataset_size: number of samples (an int, or a sized dataset).
        batch_size: samples per rank per step (>= 1).
        num_replicas, rank: the world (default: the initialised process group).
        shuffle: a new order every epoch (seeded by seed and epoch); False: 0, 1, 2, ...
        seed: must be the same on every rank.
        complexities: optional per-sample costs (ints in [0, 2^52]): load-balanced steps.
        random_level: the load-balancing noise, in [0, 1] (see LoadBalancingDistributedSampler).
    """

    def __init__(self, dataset_size, batch_size, num_replicas=None, rank=None, shuffle=True,
                 seed=0, complexities=None, random_level=0.0):
        n = dataset_size if isinstance(dataset_size, int) else len(dataset_size)
        if n < 1:
            raise ValueError("bagua: ElasticDistributedSampler needs a non-empty dataset")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("bagua: batch_size={!r}: expected an integer >= 1".format(batch_size))
        if num_replicas is None or rank is None:
            w, r = _world()
            num_replicas = w if num_replicas is None else num_replicas
            rank = r if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError("bagua: rank {} is outside [0, {})".format(rank, num_replicas))
        if complexities is not None and len(complexities) != n:
            raise ValueError("bagua: {} complexities for a dataset of {} samples".format(
                len(complexities), n))
        if not 0.0 <= random_level <= 1.0:
            raise ValueError("bagua: random_level={} is outside [0, 1]".format(random_level))
        self.dataset_size = n
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.random_level = float(random_level)
        self.complexities = None if complexities is None else [int(c) for c in complexities]
        self._lb = None
        if self.complexities is not None:
            self._lb = ext.LoadBalancingSampler(self.complexities, num_replicas, rank, shuffle,
                                                seed, False, self.random_level)
        self.epoch = 0
        self.batches_consumed = 0
        self._remainder = None  # a resumed segment's samples, or None: the epoch's full order
        self._segment = None
        self._steps = None

    # ---- the plan ------------------------------------------------------------------------

    def _full_order(self):
        if self._lb is not None and self.dataset_size % self.num_replicas == 0:
            # The loader library's order (Bagua's): no padding when R divides N.
            self._lb.set_epoch(self.epoch)
            per_rank = [self._lb.indices_of(r) for r in range(self.num_replicas)]
            return [per_rank[r][s] for s in range(len(per_rank[0]))
                    for r in range(self.num_replicas)]
        if self._lb is not None:  # it would pad: the same cut without padding, tail last
            return self._rebalanced(range(self.dataset_size), "full")
        order = list(range(self.dataset_size))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed * 1000003 + self.epoch)
            order = torch.randperm(self.dataset_size, generator=g).tolist()
        return order

    def _rebalanced(self, samples, tag="resumed"):
        """``samples`` cut for this world: sorted by (noisy) cost into runs of R neighbours, the
        runs shuffled, a short run last (so that every step's block starts a run)."""
        samples = list(samples)
        if self.complexities is None:
            return samples
        r = self.num_replicas
        rng = random.Random("{}/{}/{}/{}".format(self.seed, self.epoch, len(samples), tag))
        span = max(self.complexities) - min(self.complexities)
        noise = int(span * self.random_level + 1)
        keys = {i: self.complexities[i] + rng.randrange(noise) for i in samples}
        keyed = sorted(samples, key=lambda i: keys[i])
        chunks = [keyed[k:k + r] for k in range(0, len(keyed), r)]
        tail = [chunks.pop()] if chunks and len(chunks[-1]) < r else []
        if self.shuffle:
            rng.shuffle(chunks)
        return [i for c in chunks + tail for i in c]

    def _plan(self):
        if self._steps is not None:
            return self._steps
        if self._remainder is not None:
            g = self._rebalanced(self._remainder)
        else:
            g = self._full_order()
        r, b = self.num_replicas, self.batch_size
        bounds = list(range(0, len(g), r * b)) + [len(g)]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] < r:
            del bounds[-2]  # a tail shorter than the world joins the step before
        self._segment = g
        self._steps = [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
        return self._steps

    # ---- the Sampler interface -----------------------------------------------------------

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` from its beginning (every rank, same value)."""
        if epoch != self.epoch or self._remainder is None:
            self._remainder = None
        self.epoch = epoch
        self.batches_consumed = 0
        self._steps = None

    def __len__(self):
        return len(self._plan())

    def __iter__(self):
        steps = self._plan()
        for lo, hi in steps:
            yield self._segment[lo + self.rank:hi:self.num_replicas]

    def track(self, iterable):
        """Yields from ``iterable`` (the DataLoader), counting the batches the loop takes."""
        for item in iterable:
            self.batches_consumed += 1
            yield item

    # ---- resume --------------------------------------------------------------------------

    def remaining(self, batches_consumed=None):
        """The samples of this epoch not consumed after ``batches_consumed`` steps."""
        k = self.batches_consumed if batches_consumed is None else batches_consumed
        steps = self._plan()
        if not 0 <= k <= len(steps):
            raise ValueError("bagua: {} batches consumed, but this segment has {}".format(
                k, len(steps)))
        start = steps[k - 1][1] if k > 0 else 0
        return self._segment[start:]

    def state_dict(self, batches_consumed=None):
        """The data position: epoch and the samples still to read (same on every rank)."""
        return {
            "epoch": self.epoch,
            "remaining": torch.tensor(self.remaining(batches_consumed), dtype=torch.int64),
            "dataset_size": self.dataset_size,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state):
        """Continues the saved epoch with its remaining samples, re-cut for this world size
        (which may differ from the one that saved it)."""
        if state["dataset_size"] != self.dataset_size:
            raise ValueError("bagua: the data position is for a dataset of {} samples, this "
                             "sampler has {}".format(state["dataset_size"], self.dataset_size))
        if state["seed"] != self.seed:
            raise ValueError("bagua: the data position was saved with seed {}, this sampler "
                             "uses {}".format(state["seed"], self.seed))
        self.epoch = int(state["epoch"])
        self._remainder = [int(i) for i in state["remaining"]]
        self.batches_consumed = 0
        self._steps = None
