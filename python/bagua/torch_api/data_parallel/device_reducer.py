"""Gradient all-reduce for CUDA models over NCCL, in Python on the core's NCCL communicator.

Why here and not in C++: the core's reducer flattens buckets in host memory only. This keeps
its contract (buckets in order, launched as soon as the front bucket is complete, overlapped
with the rest of backward) on device memory: bucket storage is a torch tensor; a ready
bucket's CUDA event is recorded on the compute stream and a communication thread waits for the
event and issues the NCCL all-reduce on the communicator's own stream, so the compute stream
never blocks. ``finish`` waits for every bucket and copies the results back (or, with
gradient_as_bucket_view, points param.grad at the bucket).

Only gradient_allreduce is implemented on CUDA in this version; the other algorithms raise.
"""

import queue
import threading

import torch

from .. import communication as comm
from .._communicator import _CORE_OP


class DeviceReducer:
    def __init__(self, named_params, named_buffers, algorithm, pg, bucket_cap_mb=25,
                 find_unused_parameters=False, gradient_as_bucket_view=True,
                 broadcast_buffers=True, ignore=()):
        if algorithm.name != "gradient_allreduce":
            raise NotImplementedError(
                "bagua: on CUDA models only GradientAllReduceAlgorithm is implemented in this "
                "version ({} runs on CPU models)".format(type(algorithm).__name__))
        if pg._nccl is None:
            raise RuntimeError("bagua: CUDA model but no NCCL communicator (see init_process_group)")
        self.pg = pg
        self.average = algorithm.average
        self.find_unused = find_unused_parameters
        self.as_view = gradient_as_bucket_view
        self.broadcast_buffers = broadcast_buffers
        self.params = [p for _, p in named_params]
        self.names = [n for n, _ in named_params]
        self.buffers = [b for n, b in named_buffers if n not in ignore]
        self.train_step = 0
        with torch.no_grad():
            for n, p in named_params:
                if n not in ignore:
                    comm.broadcast(p.data, 0, pg)
            for b in self.buffers:
                comm.broadcast(b, 0, pg)
        order = [i for i in reversed(range(len(self.params)))
                 if self.params[i].requires_grad and self.names[i] not in ignore]
        cap = int(bucket_cap_mb * 1024 * 1024)
        self.buckets = []  # (tensor indices, offsets, flat)
        cur, size, dtype = [], 0, None
        limit = 1 << 20
        for i in order:
            p = self.params[i]
            if cur and (p.dtype != dtype or size >= limit):
                self.buckets.append(cur)
                cur, size, limit = [], 0, cap
            cur.append(i)
            dtype = p.dtype
            size += p.numel() * p.element_size()
        if cur:
            self.buckets.append(cur)
        self.bucket_of = {}
        self.offset_of = {}
        self.flats = []
        for bi, idx in enumerate(self.buckets):
            off = 0
            for i in idx:
                self.bucket_of[i] = bi
                self.offset_of[i] = off
                off += self.params[i].numel()
            p0 = self.params[idx[0]]
            self.flats.append(torch.zeros(off, dtype=p0.dtype, device=p0.device))
        self._reset_iteration()
        self.no_sync = False
        self._queue = queue.Queue()
        self._error = None
        self._done = threading.Semaphore(0)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="bagua-cuda-bucket", daemon=True)
        self._thread.start()

    def _reset_iteration(self):
        self.pending = [len(b) for b in self.buckets]
        self.marked = set()
        self.next_bucket = 0
        self.launched = 0

    def communicated(self):
        return sorted(self.bucket_of)

    def bucket_layout(self):
        return [[self.names[i] for i in b] for b in self.buckets]

    def set_grad(self, i, ptr):
        pass

    def mark_ready(self, i, ptr):
        self.mark_grad_ready(i)

    def set_no_sync(self, on):
        self.no_sync = on

    def save_schedule(self):
        from .bagua_distributed import _schedule_bytes

        return _schedule_bytes(self.train_step)

    def restore_schedule(self, state, counter_only=False):
        from .bagua_distributed import _schedule_step

        self.train_step = _schedule_step(state, counter_only, self.train_step)

    def prepare_forward(self):
        if self._error is not None:
            raise self._error
        self.train_step += 1
        if self.broadcast_buffers:
            for b in self.buffers:
                comm.broadcast(b, 0, self.pg)

    def _slot(self, i):
        flat = self.flats[self.bucket_of[i]]
        off = self.offset_of[i]
        return flat[off:off + self.params[i].numel()].view_as(self.params[i])

    def mark_grad_ready(self, i):
        if self.no_sync or i in self.marked:
            return
        self.marked.add(i)
        g = self.params[i].grad
        slot = self._slot(i)
        if g.data_ptr() != slot.data_ptr():
            slot.copy_(g)
        bi = self.bucket_of[i]
        self.pending[bi] -= 1
        self._launch()

    def _launch(self):
        while self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] == 0:
            ev = torch.cuda.Event()
            ev.record()
            self._queue.put((self.next_bucket, ev))
            self.next_bucket += 1
            self.launched += 1

    def _loop(self):
        op = comm.ReduceOp.AVG if self.average else comm.ReduceOp.SUM
        code = comm.dtype_code
        nccl = self.pg._nccl
        while True:
            item = self._queue.get()
            if item is None:
                return
            bi, ev = item
            try:
                if self._error is None:
                    ev.synchronize()
                    flat = self.flats[bi]
                    nccl.all_reduce(flat.data_ptr(), flat.data_ptr(), flat.numel(),
                                    code(flat.dtype), _CORE_OP[op]).wait()
            except Exception as e:  # surfaced by finish_backward
                self._error = RuntimeError("bagua: bucket {}: {}".format(bi, e))
            self._done.release()

    def finish_backward(self):
        if self.no_sync:
            return
        unused = [i for i in self.bucket_of if i not in self.marked]
        if unused and not self.find_unused:
            self.pg._host.abort("unused parameters without find_unused_parameters")
            raise RuntimeError(
                "bagua: {} parameter(s) got no gradient in this iteration ({}): set "
                "find_unused_parameters=True or add them to _bagua_params_and_buffers_to_ignore"
                .format(len(unused), ", ".join(self.names[i] for i in unused[:8])))
        for i in unused:
            self._slot(i).zero_()
            self.marked.add(i)
            self.pending[self.bucket_of[i]] -= 1
        self._launch()
        timeout = comm.ext.collective_timeout_ms() / 1000.0 + 5
        for _ in range(self.launched):
            if not self._done.acquire(timeout=timeout):
                raise RuntimeError("bagua: CUDA bucket communication timed out")
        if self._error is not None:
            raise self._error
        for i in self.bucket_of:
            p = self.params[i]
            slot = self._slot(i)
            if self.as_view:
                if p.grad is None or p.grad.data_ptr() != slot.data_ptr():
                    p.grad = slot
            elif p.grad is None:
                p.grad = slot.clone()
            else:
                p.grad.copy_(slot)
        self._reset_iteration()

    def step(self):
        pass

    def close(self):
        self._queue.put(None)
