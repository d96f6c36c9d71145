"""Bagua's reduce ops, dtype codes and ``BaguaCommunicator`` (one communicator of a group, its
collectives as methods). Private: ``bagua.torch_api.communication`` re-exports every name here,
which is where Bagua's users (and its tests) import them from.
"""

import enum
import warnings

import torch

from ._ext import ext

_DTYPES = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float64: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.uint8: 6,
}


class ReduceOp(enum.IntEnum):
    """Reduction operations, with Bagua's values (its Aluminum codes)."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BOR = 7
    BAND = 8
    BXOR = 9
    AVG = 10


# Bagua's op -> the core's code (core/include/bagua/core/types.h). The bitwise ops are not in
# the core: they are computed from an all-gather (integer tensors only).
_CORE_OP = {ReduceOp.SUM: 0, ReduceOp.AVG: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3,
            ReduceOp.PRODUCT: 4}
_BITWISE = {ReduceOp.BOR: torch.bitwise_or, ReduceOp.BAND: torch.bitwise_and,
            ReduceOp.BXOR: torch.bitwise_xor}


def _op(op):
    try:
        return ReduceOp(int(op))
    except ValueError:
        raise ValueError("bagua: unknown reduce op {!r} (one of {})".format(
            op, ", ".join("{}={}".format(o.name, int(o)) for o in ReduceOp)))


def dtype_code(dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(
            "bagua: dtype {} is not supported (use one of {})".format(
                dtype, ", ".join(str(d) for d in _DTYPES)
            )
        )


class _Comm(object):
    WORLD = object()


class CommMember(object):
    """``WORLD``: the default group's global communicator; ``NON_COMM_MEMBER``: what a rank
    outside a group gets for its communicators (collectives on it return at once)."""

    WORLD = _Comm.WORLD
    NON_COMM_MEMBER = object()


def _check(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("bagua.{}: expected a torch.Tensor, got {}".format(what, type(t)))
    if not t.is_contiguous():
        raise ValueError("bagua.{}: the tensor must be contiguous (call .contiguous())".format(what))
    if t.is_sparse:
        raise ValueError("bagua.{}: sparse tensors are not supported".format(what))
    return dtype_code(t.dtype)


def _same(a, b, what):
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            "bagua.{}: send and recv must have the same dtype and device ({} {} vs {} {})".format(
                what, a.dtype, a.device, b.dtype, b.device
            )
        )


def _tensor(t):
    """A torch tensor from what Bagua's communicator methods take (a tensor or its
    ``bagua_backend_tensor()``, which is the tensor itself here)."""
    return t


class BaguaCommunicator:
    """One communicator of a group (Bagua's ``BaguaSingleCommunicatorPy``): ``rank()``,
    ``nranks()`` and the collectives as methods on tensors (``tensor.bagua_backend_tensor()`` is
    accepted, it is the tensor itself). A host-backend communicator, plus an NCCL one for CUDA
    tensors when the group has one.

    After ``abort()`` every operation returns without effect, as Bagua's does (an operation
    blocked in a peer's absence returns with an error logged, not raised).
    """

    def __init__(self, host, nccl, stream=None):
        self._host = host
        self._nccl = nccl
        self.cuda_stream = stream
        self._aborted = False

    def rank(self):
        return self._host.rank

    def nranks(self):
        return self._host.size

    def _for(self, tensor):
        if tensor.is_cuda:
            if self._nccl is None:
                raise RuntimeError(
                    "bagua: CUDA tensor but no NCCL communicator (extension built without NCCL "
                    "(HAVE_NCCL={}) or no GPU visible at init_process_group)".format(ext.HAVE_NCCL)
                )
            return self._nccl
        return self._host

    def _run(self, tensors, issue):
        if self._aborted:
            return False
        c = self._for(tensors[0])
        if any(t.is_cuda for t in tensors):
            torch.cuda.current_stream().synchronize()
        try:
            issue(c).wait()
        except RuntimeError:
            if self._aborted:
                warnings.warn("bagua: a collective on an aborted communicator returned early")
                return False
            raise
        return True

    def abort(self):
        """Aborts the communicator: pending and later operations return (Bagua's abort)."""
        self._aborted = True
        for g in (self._host, self._nccl):
            if g is not None and g.alive:
                g.abort("aborted by the user (communicator.abort())")

    def check_abort(self):
        return self._aborted

    # -- collectives (Bagua's communicator methods) --------------------------------------------

    def allreduce(self, send_tensor, recv_tensor, op=ReduceOp.SUM):
        send_tensor, recv_tensor = _tensor(send_tensor), _tensor(recv_tensor)
        dt = _check(send_tensor, "allreduce")
        _check(recv_tensor, "allreduce")
        _same(send_tensor, recv_tensor, "allreduce")
        if send_tensor.numel() != recv_tensor.numel():
            raise ValueError("bagua.allreduce: send and recv sizes differ")
        op = _op(op)
        if op in _BITWISE:
            self._bitwise(send_tensor, recv_tensor, op)
            return
        self._run([send_tensor], lambda c: c.all_reduce(
            send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel(), dt,
            _CORE_OP[op]))

    def allreduce_inplace(self, tensor, op=ReduceOp.SUM):
        self.allreduce(tensor, tensor, op)

    def _bitwise(self, send_tensor, recv_tensor, op, dst=None):
        if send_tensor.dtype.is_floating_point:
            raise TypeError("bagua: {} needs an integer tensor, got {}".format(
                op.name, send_tensor.dtype))
        n = self.nranks()
        g = torch.empty(n * send_tensor.numel(), dtype=send_tensor.dtype,
                        device=send_tensor.device)
        src = send_tensor.clone() if send_tensor.data_ptr() == recv_tensor.data_ptr() else \
            send_tensor
        self.allgather(src, g)
        if dst is not None and self.rank() != dst:
            return
        rows = g.view(n, -1)
        acc = rows[0].clone()
        for i in range(1, n):
            acc = _BITWISE[op](acc, rows[i])
        recv_tensor.view(-1).copy_(acc)

    def reduce(self, send_tensor, recv_tensor, dst, op=ReduceOp.SUM):
        dt = _check(send_tensor, "reduce")
        _check(recv_tensor, "reduce")
        _same(send_tensor, recv_tensor, "reduce")
        op = _op(op)
        if op in _BITWISE:
            self._bitwise(send_tensor, recv_tensor, op, dst=dst)
            return
        self._run([send_tensor], lambda c: c.reduce(
            send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel(), dt,
            _CORE_OP[op], dst))

    def reduce_inplace(self, tensor, dst, op=ReduceOp.SUM):
        self.reduce(tensor, tensor, dst, op)

    def broadcast(self, tensor, src=0):
        dt = _check(tensor, "broadcast")
        self._run([tensor], lambda c: c.broadcast(tensor.data_ptr(), tensor.numel(), dt, src))

    def allgather(self, send_tensor, recv_tensor):
        dt = _check(send_tensor, "allgather")
        _check(recv_tensor, "allgather")
        _same(send_tensor, recv_tensor, "allgather")
        n = self.nranks()
        if recv_tensor.numel() != send_tensor.numel() * n:
            raise ValueError(
                "bagua.allgather: recv must hold nranks * send.numel() = {} elements, has "
                "{}".format(send_tensor.numel() * n, recv_tensor.numel()))
        self._run([send_tensor], lambda c: c.all_gather(
            send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel(), dt))

    def allgather_inplace(self, tensor):
        n = tensor.numel() // self.nranks()
        r = self.rank()
        chunk = tensor.view(-1)[r * n:(r + 1) * n].clone()
        self.allgather(chunk, tensor)

    def gather(self, send_tensor, recv_tensor, dst):
        """``recv_tensor`` (dst only) receives every rank's ``send_tensor`` in rank order."""
        _check(send_tensor, "gather")
        n, r, count = self.nranks(), self.rank(), send_tensor.numel()
        if r == dst:
            _check(recv_tensor, "gather")
            _same(send_tensor, recv_tensor, "gather")
            if recv_tensor.numel() != n * count:
                raise ValueError("bagua.gather: recv must hold nranks * send.numel() = {} "
                                 "elements, has {}".format(n * count, recv_tensor.numel()))
            out = recv_tensor.view(-1)
            for peer in range(n):
                part = out[peer * count:(peer + 1) * count]
                if peer == r:
                    part.copy_(send_tensor.view(-1))
                else:
                    self.recv(part, peer)
        else:
            self.send(send_tensor, dst)

    def gather_inplace(self, tensor, count, dst):
        if self.rank() == dst:
            r = self.rank()
            mine = tensor.view(-1)[r * count:(r + 1) * count].clone()
            self.gather(mine, tensor, dst)
        else:
            self.gather(tensor.view(-1)[:count], None, dst)

    def scatter(self, send_tensor, recv_tensor, src):
        """Rank i receives the i-th chunk of ``send_tensor`` (src only) in ``recv_tensor``."""
        _check(recv_tensor, "scatter")
        n, r, count = self.nranks(), self.rank(), recv_tensor.numel()
        if r == src:
            _check(send_tensor, "scatter")
            _same(send_tensor, recv_tensor, "scatter")
            if send_tensor.numel() != n * count:
                raise ValueError("bagua.scatter: send must hold nranks * recv.numel() = {} "
                                 "elements, has {}".format(n * count, send_tensor.numel()))
            flat = send_tensor.view(-1)
            for peer in range(n):
                part = flat[peer * count:(peer + 1) * count]
                if peer == r:
                    recv_tensor.view(-1).copy_(part)
                else:
                    self.send(part.contiguous(), peer)
        else:
            self.recv(recv_tensor, src)

    def scatter_inplace(self, tensor, count, src):
        if self.rank() == src:
            r = self.rank()
            out = torch.empty(count, dtype=tensor.dtype, device=tensor.device)
            self.scatter(tensor, out, src)
            tensor.view(-1)[r * count:(r + 1) * count].copy_(out)
        else:
            self.scatter(None, tensor.view(-1)[:count], src)

    def reduce_scatter(self, send_tensor, recv_tensor, op=ReduceOp.SUM):
        dt = _check(send_tensor, "reduce_scatter")
        _check(recv_tensor, "reduce_scatter")
        _same(send_tensor, recv_tensor, "reduce_scatter")
        n = self.nranks()
        if send_tensor.numel() != recv_tensor.numel() * n:
            raise ValueError("bagua.reduce_scatter: send must hold nranks * recv.numel() elements")
        op = _op(op)
        if op in _BITWISE:
            full = torch.empty_like(send_tensor)
            self._bitwise(send_tensor, full, op)
            c = recv_tensor.numel()
            recv_tensor.view(-1).copy_(full.view(-1)[self.rank() * c:(self.rank() + 1) * c])
            return
        self._run([send_tensor], lambda c: c.reduce_scatter(
            send_tensor.data_ptr(), recv_tensor.data_ptr(), recv_tensor.numel(), dt,
            _CORE_OP[op]))

    def reduce_scatter_inplace(self, tensor, op=ReduceOp.SUM):
        n = tensor.numel() // self.nranks()
        r = self.rank()
        out = torch.empty(n, dtype=tensor.dtype, device=tensor.device)
        self.reduce_scatter(tensor, out, op)
        tensor.view(-1)[r * n:(r + 1) * n].copy_(out)

    def alltoall(self, send_tensor, recv_tensor):
        dt = _check(send_tensor, "alltoall")
        _check(recv_tensor, "alltoall")
        _same(send_tensor, recv_tensor, "alltoall")
        n = self.nranks()
        if send_tensor.numel() % n or send_tensor.numel() != recv_tensor.numel():
            raise ValueError("bagua.alltoall: send and recv must hold the same multiple of nranks")
        self._run([send_tensor], lambda c: c.all_to_all(
            send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel() // n, dt))

    def alltoall_inplace(self, tensor):
        out = torch.empty_like(tensor)
        self.alltoall(tensor, out)
        tensor.copy_(out)

    def alltoall_v(self, send_tensor, send_counts, send_displs, recv_tensor, recv_counts,
                   recv_displs):
        """Rank r sends ``send_tensor[send_displs[j]:][:send_counts[j]]`` to rank j and puts
        what rank i sent it at ``recv_tensor[recv_displs[i]:]`` (``recv_counts[i]`` elements).

        One all-to-all over chunks padded to the largest count of the job (found with one
        MAX all-reduce): the same code path on both backends, no point-to-point ordering."""
        _check(send_tensor, "alltoall_v")
        _check(recv_tensor, "alltoall_v")
        _same(send_tensor, recv_tensor, "alltoall_v")
        n = self.nranks()
        for name, v in (("send_counts", send_counts), ("send_displs", send_displs),
                        ("recv_counts", recv_counts), ("recv_displs", recv_displs)):
            # Longer lists are accepted and their first nranks entries used, as Bagua's
            # backend did (its example passes nranks + 1 displacements).
            if len(v) < n:
                raise ValueError("bagua.alltoall_v: {} has {} entries for {} ranks".format(
                    name, len(v), n))
        most = torch.tensor([max([int(c) for c in send_counts] + [0])], dtype=torch.int64,
                            device=send_tensor.device)
        self.allreduce_inplace(most, ReduceOp.MAX)
        m = int(most.item())
        if m == 0:
            return
        sflat, rflat = send_tensor.view(-1), recv_tensor.view(-1)
        packed = torch.zeros(n * m, dtype=send_tensor.dtype, device=send_tensor.device)
        for j in range(n):
            c, d = int(send_counts[j]), int(send_displs[j])
            packed[j * m:j * m + c].copy_(sflat[d:d + c])
        got = torch.empty_like(packed)
        self.alltoall(packed, got)
        for i in range(n):
            c, d = int(recv_counts[i]), int(recv_displs[i])
            rflat[d:d + c].copy_(got[i * m:i * m + c])

    def alltoall_v_inplace(self, tensor, counts, displs):
        src = tensor.clone()
        self.alltoall_v(src, counts, displs, tensor, counts, displs)

    def send(self, tensor, dst):
        dt = _check(tensor, "send")
        self._run([tensor], lambda c: c.send(tensor.data_ptr(), tensor.numel(), dt, dst))

    def recv(self, tensor, src):
        dt = _check(tensor, "recv")
        self._run([tensor], lambda c: c.recv(tensor.data_ptr(), tensor.numel(), dt, src))

    def barrier(self):
        if self._aborted:
            return
        try:
            self._host.barrier().wait()
        except RuntimeError:
            if not self._aborted:
                raise

    def destroy(self):
        for g in (self._nccl, self._host):
            if g is not None and g.alive:
                g.destroy()
