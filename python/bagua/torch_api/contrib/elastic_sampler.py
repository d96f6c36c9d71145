"""A resumable, world-size-elastic batch sampler: every sample of an epoch is
consumed exactly once, across restarts and changes of the number of ranks.

The plan is the loader library's ElasticBatchPlan (``loader/include/bagua/loader/elastic_plan.h``
has the whole recipe), shared with C++ trainers: the epoch's global order (a seeded permutation,
or with ``complexities`` the load-balancing order, in which each run of R neighbours has similar
cost) is cut into steps of R * batch_size samples; rank r takes ``block[r::R]`` of each step's
block. A last block shorter than R joins the step before (a few ranks then get batch_size + 1
samples once), so every rank gets a non-empty batch at every step and all ranks run the same
number of steps; only a segment with fewer samples than ranks gives some ranks an empty last
batch (run the step anyway, with a zero gradient, so the collectives stay matched). Nothing is
padded and nothing dropped.

Resume: ``state_dict(batches_consumed)`` records the samples of the segment not yet consumed;
``load_state_dict`` on any world size makes them the new segment, re-cut for the new R (with
complexities: re-sorted by cost and re-chunked into runs of the new R, so balance holds after
the change). The counter ``batches_consumed`` is advanced by ``track(loader)``, which wraps the
loader's iterator at the pace of the training loop (not of the loader's prefetching).

Deterministic: the order depends on (dataset size, seed, epoch, complexities, world size) and,
after a resume, on the saved remainder only; the same on every rank and machine, no
communication.
"""

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
        # The plan (C++) checks the rest and raises ValueError; these cannot reach it as numbers.
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("bagua: batch_size={!r}: expected an integer >= 1".format(batch_size))
        if n < 0:
            raise ValueError("bagua: dataset_size={}: expected a size >= 1".format(n))
        if num_replicas is None or rank is None:
            w, r = _world()
            num_replicas = w if num_replicas is None else num_replicas
            rank = r if rank is None else rank
        self.dataset_size = n
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.random_level = float(random_level)
        self.complexities = None if complexities is None else [int(c) for c in complexities]
        self._plan_impl = ext.ElasticPlan(n, batch_size, num_replicas, rank, shuffle, seed,
                                          self.complexities or [], self.random_level)
        self.epoch = 0
        self.batches_consumed = 0
        self._batches = None  # this rank's batches of the planned segment

    def _plan(self):
        if self._batches is None:
            self._batches = self._plan_impl.batches_for_epoch(self.epoch)
        return self._batches

    # ---- the Sampler interface -----------------------------------------------------------

    def set_epoch(self, epoch):
        """Starts epoch ``epoch``: from its beginning, or from a loaded position's remaining
        samples when ``load_state_dict`` named this epoch (every rank, same value)."""
        if epoch != self.epoch:
            self._batches = None
        self.epoch = epoch
        self.batches_consumed = 0

    def __len__(self):
        return len(self._plan())

    def __iter__(self):
        for batch in self._plan():
            yield list(batch)

    def track(self, iterable):
        """Yields from ``iterable`` (the DataLoader), counting the batches the loop takes."""
        for item in iterable:
            self.batches_consumed += 1
            yield item

    # ---- resume --------------------------------------------------------------------------

    def remaining(self, batches_consumed=None):
        """The samples of this epoch not consumed after ``batches_consumed`` steps."""
        k = self.batches_consumed if batches_consumed is None else batches_consumed
        self._plan()  # position() needs this epoch planned; it refuses k past the segment's end
        if k < 0:
            raise ValueError("bagua: {} batches consumed: expected a count >= 0".format(k))
        return self._plan_impl.position(k)[1]

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
        (which may differ from the one that saved it). A position of another dataset size or
        seed is refused (ValueError) and the sampler is left as it was."""
        epoch = int(state["epoch"])
        self._plan_impl.resume(epoch, [int(i) for i in state["remaining"]],
                               int(state["dataset_size"]), int(state["seed"]))
        self.epoch = epoch
        self._batches = None
        self.batches_consumed = 0
