"""Bagua's ``BaguaBucket``: a list of Bagua tensors communicated together, with the operations
an algorithm registers on it.

For a user-written algorithm (an ``AlgorithmImpl`` that is not one of ours) the buckets are run
by the module's Python engine (``communication.get_backend(module_name)``): once every tensor of
a bucket is marked ready, the bucket's operations run in the order they were appended, buckets
in their registration order, on the thread that marked the last tensor ready (autograd's, during
backward). ``wait_pending_comm_ops()`` runs what is left. Collectives are synchronous here, so
no operation overlaps another; the built-in algorithms run in the C++ reducer instead and
overlap communication with backward.

Operations: ``append_python_op`` (any function of the bucket's name),
``append_centralized_synchronous_op`` (all-reduce of the flattened effective tensors, mean or
sum; ``hierarchical`` and ``scattergather`` give the same result here), and
``append_decentralized_synchronous_op`` with ``peer_selection_mode="all"`` (the average of the
group's effective tensors written to ``peer_weight``; the returned handle's
``copy_back_peer_weight(bucket)`` writes it back, as Bagua's). Compressed and asynchronous operations
are what the built-in ``bytegrad``, ``low_precision_decentralized`` and ``async`` algorithms
do: use those (they raise here with that advice).
"""

import torch

from .communication import ReduceOp, _get_default_group, allreduce_inplace, get_backend
from .utils import check_contiguous, get_flattened_tensor

__all__ = ["BaguaBucket"]


class BaguaBucket:
    def __init__(self, tensors, name, flatten, alignment=1):
        """``tensors``: Bagua tensors of one module (``ensure_bagua_tensor(name, module_name,
        ...)``); ``flatten``: lay their effective tensors out contiguously in one storage;
        ``alignment``: pad the bucket with zeros to a multiple of it."""
        if not tensors:
            raise ValueError("bagua: a bucket needs at least one tensor")
        self.tensors = list(tensors)
        self.bagua_module_name = self.tensors[0].bagua_module_name
        for t in self.tensors:
            if t.bagua_module_name != self.bagua_module_name:
                raise ValueError("bagua: every tensor of a bucket must belong to one module "
                                 "({!r} vs {!r})".format(t.bagua_module_name,
                                                         self.bagua_module_name))
        self._bagua_backend = get_backend(self.bagua_module_name)
        self.name = name
        self.padding_tensor = None
        if alignment > 1:
            rest = sum(t.numel() for t in self.tensors) % alignment
            if rest:
                self.padding_tensor = torch.zeros(
                    alignment - rest, dtype=self.tensors[0].dtype,
                    device=self.tensors[0].device).ensure_bagua_tensor(
                        "bagua_padding_tensor_bucket_" + name,
                        module_name=self.bagua_module_name)
        self._all_tensors = self.tensors + ([self.padding_tensor] if self.padding_tensor
                                            is not None else [])
        self.backend_tensor = None
        self.flatten = flatten
        self._ops = []
        if flatten:
            self._flatten_()
        for t in self._all_tensors:
            t._bagua_bucket = self
        self.backend_bucket = self  # what register_ordered_buckets takes (Bagua's name)

    def flattened_tensor(self):
        """A new contiguous tensor holding the effective tensors' data."""
        return get_flattened_tensor([t.bagua_getter_closure() for t in self._all_tensors])

    def _flatten_(self):
        """Makes the effective tensors views of one storage, in bucket order."""
        if self.check_flatten():
            first = self._all_tensors[0].bagua_getter_closure()
            n = sum(t.bagua_getter_closure().numel() for t in self._all_tensors)
            self.backend_tensor = first.detach().as_strided((n,), (1,))
            return
        flat = self.flattened_tensor()
        off = 0
        for t in self._all_tensors:
            t.bagua_set_storage(flat.storage() if hasattr(flat, "storage") else flat, off)
            off += t.bagua_getter_closure().numel()
        self.backend_tensor = flat
        if not self.check_flatten():
            raise RuntimeError("bagua: bucket {} could not be flattened".format(self.name))

    def check_flatten(self):
        """True when the effective tensors are contiguous in memory, in order."""
        return check_contiguous([t.bagua_getter_closure() for t in self._all_tensors])

    # -- operations ----------------------------------------------------------------------------

    def append_python_op(self, python_function, group=None):
        """Runs ``python_function(bucket_name)`` when the bucket is ready."""
        self._ops.append(lambda: python_function(self.name))
        return self

    def append_centralized_synchronous_op(self, hierarchical=False, average=True,
                                          scattergather=False, compression=None, group=None):
        """All-reduces the bucket's effective tensors over ``group`` (mean when ``average``)."""
        if compression is not None:
            raise NotImplementedError(
                "bagua: compressed centralized operations in a user-written algorithm are not "
                "supported (compression={!r}); ByteGradAlgorithm is the built-in one".format(
                    compression))
        group = group if group is not None else _get_default_group()
        op = ReduceOp.AVG if average else ReduceOp.SUM

        def run():
            self._reduce_effective(lambda flat: allreduce_inplace(flat, op, comm=group))

        self._ops.append(run)
        return self

    def append_decentralized_synchronous_op(self, peer_weight, hierarchical=True,
                                            peer_selection_mode="all", group=None):
        """Writes the average of the group's effective tensors (flattened) into
        ``peer_weight``; the algorithm copies it back when it chooses (Bagua's contract)."""
        if peer_selection_mode != "all":
            raise NotImplementedError(
                "bagua: peer_selection_mode={!r} in a user-written algorithm is not supported "
                "('all' is); DecentralizedAlgorithm is the built-in one".format(
                    peer_selection_mode))
        group = group if group is not None else _get_default_group()
        op = _DecentralizedOp(self, peer_weight, group)
        self._ops.append(op.run)
        return op

    def append_low_precision_decentralized_synchronous_op(self, *args, **kwargs):  # noqa: D102
        raise NotImplementedError("bagua: use LowPrecisionDecentralizedAlgorithm (built in) for "
                                  "low-precision decentralized communication")

    def append_asynchronous_model_average_op(self, *args, **kwargs):
        raise NotImplementedError("bagua: use AsyncModelAverageAlgorithm (built in) for "
                                  "asynchronous model averaging")

    def clear_ops(self):
        self._ops = []
        return self

    def bytes(self):
        """Bytes of the bucket's effective tensors."""
        return sum(t.numel() * t.element_size() for t in self._all_tensors)

    def _reduce_effective(self, reduce_flat):
        effective = [t.bagua_getter_closure() for t in self._all_tensors]
        if check_contiguous(effective) and all(e.is_contiguous() for e in effective):
            n = sum(e.numel() for e in effective)
            reduce_flat(effective[0].detach().as_strided((n,), (1,)))
            return
        flat = get_flattened_tensor(effective)
        reduce_flat(flat)
        off = 0
        with torch.no_grad():
            for e in effective:
                e.view(-1).copy_(flat[off:off + e.numel()])
                off += e.numel()

    def _run_ops(self):
        for op in self._ops:
            op()


class _DecentralizedOp:
    """What ``append_decentralized_synchronous_op`` returns (Bagua's handle):
    ``copy_back_peer_weight(bucket)`` writes the averaged weights into the bucket's tensors."""

    def __init__(self, bucket, peer_weight, group):
        self.bucket = bucket
        self.peer_weight = peer_weight
        self.group = group

    def run(self):
        with torch.no_grad():
            self.peer_weight.view(-1).copy_(self.bucket.flattened_tensor())
        allreduce_inplace(self.peer_weight, ReduceOp.AVG, comm=self.group)

    def copy_back_peer_weight(self, bucket=None):
        bucket = bucket if bucket is not None else self.bucket
        flat = self.peer_weight.view(-1)
        off = 0
        with torch.no_grad():
            for t in bucket._all_tensors:
                e = t.bagua_getter_closure()
                e.view(-1).copy_(flat[off:off + e.numel()])
                off += e.numel()
