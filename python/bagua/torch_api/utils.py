"""Bagua's ``bagua.torch_api.utils``: flatten helpers, dtype names and the time-windowed
average the autotuner's statistics used."""

import math
import time
from collections import OrderedDict

import torch

flatten = torch._utils._flatten_dense_tensors
unflatten = torch._utils._unflatten_dense_tensors


def apply_flattened_call(bucket, call, extra_args=None):
    """Runs ``call`` on one flattened copy of the tensors in ``bucket`` and copies the result
    back (divided by the world size when ``call`` is ``torch.distributed.all_reduce``)."""
    import torch.distributed as dist

    flat = flatten(bucket)
    call(flat, *(extra_args or ()))
    if call is dist.all_reduce:
        flat /= dist.get_world_size()
    for t, synced in zip(bucket, unflatten(flat, bucket)):
        t.copy_(synced)


def _group_by_tensor_type(tensors):
    groups = OrderedDict()
    for t in tensors:
        groups.setdefault(t.type(), []).append(t)
    return groups


def apply_flattened_call_all(tensors, call):
    """``apply_flattened_call`` once per tensor type."""
    for group in _group_by_tensor_type(tensors).values():
        apply_flattened_call(group, call)


def check_contiguous(tensors):
    """True when the tensors lie back to back in memory, in order."""
    end = None
    for t in tensors:
        if end is not None and t.data_ptr() != end:
            return False
        end = t.data_ptr() + t.numel() * t.element_size()
    return True


def get_flattened_tensor(tensors):
    """A new 1-D tensor holding the tensors' elements one after the other (None for [])."""
    if len(tensors) == 0:
        return None
    out = torch.zeros(sum(t.numel() for t in tensors), dtype=tensors[0].dtype,
                      device=tensors[0].device)
    off = 0
    for t in tensors:
        out[off:off + t.numel()] = t.reshape(-1)
        off += t.numel()
    return out


def _partitions(tensors):
    """``tensors`` grouped by (dtype, device), each group in the given order."""
    parts = {}
    for t in tensors:
        parts.setdefault((t.dtype, t.device), []).append(t)
    return list(parts.values())


def _lay_out(params, source, install, zero):
    """Per (dtype, device) group of ``params``, in the given order: one new buffer (zeroed when
    ``zero``, else uninitialised), ``source(p)`` copied to each parameter's place when it is not
    None, and ``install(p, place)`` (the place: a view of the buffer shaped like ``p``). The
    layouts of do_flatten (with_bagua's and fuse_optimizer's) are made with it."""
    with torch.no_grad():
        for ps in _partitions(params):
            flat = (torch.zeros if zero else torch.empty)(
                sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
            off = 0
            for p in ps:
                n = p.numel()
                place = flat[off:off + n].view_as(p)
                src = source(p)
                if src is not None:
                    place.copy_(src)
                install(p, place)
                off += n


def _lay_out_weights(params):
    """The weights of ``params`` as views of one buffer per (dtype, device), in this order."""

    def install(p, place):
        p.data = place

    _lay_out(params, lambda p: p.data, install, zero=False)


def _lay_out_grads(params):
    """The gradients of ``params`` as views of one zero-initialised (or copied) buffer per
    (dtype, device), in this order, each remembered as its parameter's ``_bagua_grad_view``
    (with_bagua re-points fresh gradients there)."""

    def install(p, place):
        p.grad = place
        p._bagua_grad_view = place

    _lay_out(params, lambda p: p.grad, install, zero=True)


_BAGUA_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.uint8: "u8",
                 torch.int64: "i64"}


def to_bagua_datatype(datatype):
    """Bagua's short dtype name ("f32", "f16", "u8", "i64")."""
    try:
        return _BAGUA_DTYPES[datatype]
    except KeyError:
        raise ValueError("unsupported data type {}.".format(datatype))


def average_by_removing_extreme_values(raw_score_list):
    """(mean, std, kept scores): the first third dropped as warm-up, then scores farther than
    one standard deviation from the mean removed (repeated while std >= mean, 10 rounds)."""
    import numpy as np

    scores = np.asarray(raw_score_list)[len(raw_score_list) // 3:]

    def keep_close(x):
        near = x[abs(x - np.mean(x)) < np.std(x)]
        return near if len(near) else x

    scores = keep_close(scores)
    for _ in range(10):
        if np.std(scores) < np.mean(scores):
            break
        scores = keep_close(scores)
    return np.mean(scores), np.std(scores), scores.tolist()


class StatisticalAverage:
    """A running mean over power-of-two time windows.

    ``records[i]`` is the mean of the values over the ``2**i`` seconds before
    ``last_update_time``; ``record_tail`` = (length in seconds, mean) of the time recorded
    beyond the largest window. A value recorded ``dt`` seconds after the last update is taken
    to have held for those ``dt`` seconds. Means over other lengths interpolate linearly
    between neighbouring windows.
    """

    def __init__(self, last_update_time=None, records=None, record_tail=(0.0, 0.0)):
        self.last_update_time = time.time() if last_update_time is None else last_update_time
        self.records = list(records) if records is not None else []
        self.record_tail = tuple(record_tail)

    def record_seconds(self):
        """The largest window's length (0 without records)."""
        return 2.0 ** (len(self.records) - 1) if self.records else 0.0

    def total_recording_time(self):
        return self.record_seconds() + self.record_tail[0]

    def get_records_mean(self, last_n_seconds):
        """The mean over the last ``last_n_seconds`` before ``last_update_time``."""
        if last_n_seconds <= 0.0:
            return 0.0
        tail_len, tail_mean = self.record_tail
        if not self.records:
            return tail_mean
        if last_n_seconds < 1.0:
            return self.records[0]
        span = self.record_seconds()
        if last_n_seconds <= span:
            i = max(0, int(math.floor(math.log2(last_n_seconds))))
            if i + 1 >= len(self.records):
                return self.records[i]
            lo = 2.0 ** i
            return _lerp(self.records[i], self.records[i + 1], (last_n_seconds - lo) / lo)
        if last_n_seconds <= span + tail_len:
            return _lerp(self.records[-1], tail_mean, (last_n_seconds - span) / tail_len)
        return tail_mean

    def record(self, val):
        """Records ``val`` as the value since ``last_update_time`` until now."""
        now = time.time()
        dt = now - self.last_update_time
        total = self.total_recording_time()
        records = []
        tail = (0.0, 0.0)
        for i in range(64):
            window = 2.0 ** i
            if window <= dt:
                records.append(val)  # the whole window lies in the new value's time
            elif window <= dt + total:
                w = dt / window  # the new value's share of the window
                records.append(val * w + self.get_records_mean(window - dt) * (1.0 - w))
            else:
                new_total = dt + total
                w = dt / new_total
                tail = (new_total - 2.0 ** (len(records) - 1),
                        val * w + self.get_records_mean(total) * (1.0 - w))
                break
        self.last_update_time = now
        self.records = records
        self.record_tail = tail

    def get(self, last_n_seconds):
        """The mean over the last ``last_n_seconds`` before now."""
        since = time.time() - self.last_update_time
        if last_n_seconds <= since:
            return self.records[0] if self.records else self.record_tail[1]
        return self.get_records_mean(last_n_seconds - since)

    def __str__(self):
        return str({"last_update_time": self.last_update_time, "records": self.records,
                    "record_tail": self.record_tail})


def _lerp(a, b, f):
    return a + (b - a) * f
