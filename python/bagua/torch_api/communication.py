"""Process groups and collectives with Bagua's names and signatures.

CPU tensors go through the host backend (TCP + shared memory); CUDA tensors through NCCL when
the extension was built with NCCL and a GPU is visible. Tensors are exchanged without copies:
the C++ core reads and writes the tensors' memory (they must be contiguous). Every call is
synchronous for the caller: it returns when the result is in the output tensor (CUDA: the
current stream is synchronised before the collective is issued on the communicator's stream,
and the call returns once that stream finished it).
"""

import enum
import io
import os
import pickle
import threading

import torch

from ._ext import ext
from . import env

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
    """Reduction operations (Bagua's names; bitwise ones are not supported)."""

    SUM = 0
    AVG = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


def dtype_code(dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(
            "bagua: dtype {} is not supported (use one of {})".format(
                dtype, ", ".join(str(d) for d in _DTYPES)
            )
        )


class BaguaProcessGroup:
    """A group of ranks: a host-backend communicator, plus an NCCL one when CUDA is usable.

    ``ranks`` are global ranks in group order; ``rank``/``size`` are this process's rank in
    the group and the group size.
    """

    def __init__(self, host, nccl, ranks, name):
        self._host = host
        self._nccl = nccl
        self.ranks = list(ranks)
        self.group_name = name

    @property
    def rank(self):
        return self._host.rank

    @property
    def size(self):
        return self._host.size

    def get_global_communicator(self):
        return self

    def get_intra_node_communicator(self):  # compatibility: collectives use the global one
        return self

    def get_inter_node_communicator(self):
        return self

    def _comm_for(self, tensor):
        if tensor.is_cuda:
            if self._nccl is None:
                raise RuntimeError(
                    "bagua: CUDA tensor but no NCCL communicator (extension built without NCCL "
                    "(HAVE_NCCL={}) or no GPU visible at init_process_group)".format(ext.HAVE_NCCL)
                )
            return self._nccl
        return self._host

    def destroy(self):
        for g in (self._nccl, self._host):
            if g is not None and g.alive:
                g.destroy()


_default_pg = None
_group_count = 0
_lock = threading.Lock()


def is_initialized():
    return _default_pg is not None


def _check_init():
    if _default_pg is None:
        raise RuntimeError(
            "bagua: call bagua.torch_api.init_process_group() first (under baguarun or torchrun, "
            "which set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)"
        )
    return _default_pg


def init_process_group(store=None, rank=-1, world_size=-1, local_world_size=-1):
    """Initialises the default process group from env:// (MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), as Bagua's does; arguments >= 0 override the
    environment. ``store`` (a torch.distributed store) is not used: the core has its own.
    Selects the CUDA device LOCAL_RANK when CUDA is available."""
    return _init(store, rank, world_size, -1, local_world_size)


def _init(store=None, rank=-1, world_size=-1, local_rank=-1, local_world_size=-1):
    global _default_pg
    if store is not None:
        import warnings

        warnings.warn("bagua: init_process_group(store=...) is ignored; env:// is used")
    with _lock:
        if _default_pg is not None:
            return _default_pg
        port = _torchrun_port(rank)
        saved = os.environ.get("MASTER_PORT")
        if port is not None:
            os.environ["MASTER_PORT"] = str(port)  # read once by the core's catalogue
        try:
            host = _init_host(rank, world_size, local_rank, local_world_size)
        finally:
            if port is not None:
                os.environ["MASTER_PORT"] = saved
        nccl = None
        ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ext.HAVE_NCCL and 0 < ngpu < host.local_size:
            # NCCL needs one GPU per rank of a node: CUDA collectives stay off, CPU ones work.
            import warnings

            warnings.warn(
                "bagua: {} ranks on this node but {} GPU(s): no NCCL group, CUDA tensors "
                "cannot be communicated (CPU tensors use the host backend)".format(
                    host.local_size, ngpu
                )
            )
        elif ext.HAVE_NCCL and ngpu > 0:
            dev = host.local_rank % ngpu
            torch.cuda.set_device(dev)
            nccl = host.new_group(
                list(range(host.size)), "nccl", backend="nccl", hierarchical=True, cuda_device=dev
            )
        _default_pg = BaguaProcessGroup(host, nccl, range(host.size), "default")
        return _default_pg


def _torchrun_port(rank):
    """Under torchrun the elastic agent's store already listens on MASTER_PORT: rank 0 picks a
    free port for bagua's own store and publishes it through the agent's store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import datetime
    import socket

    from torch.distributed import TCPStore

    r = rank if rank >= 0 else env.get_rank()
    store = TCPStore(env.get_master_addr(), int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=datetime.timedelta(seconds=60))
    key = "bagua/master_port/{}".format(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if r == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        store.set(key, str(port))
        return port
    return int(store.get(key))


def _init_host(rank, world_size, local_rank, local_world_size):
    return ext.init_from_env(
        backend="host",
        hierarchical=True,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
    )


def destroy_process_group():
    global _default_pg
    with _lock:
        if _default_pg is not None:
            _default_pg.destroy()
            _default_pg = None


def get_default_group():
    return _check_init()


def new_group(ranks=None, stream=None):
    """A group over ``ranks`` (global ranks; None: all). Collective: every rank of the default
    group must call it, in the same order; ranks outside the group get None."""
    pg = _check_init()
    global _group_count
    _group_count += 1
    ranks = list(range(pg.size)) if ranks is None else sorted(set(int(r) for r in ranks))
    for r in ranks:
        if r < 0 or r >= pg.size:
            raise ValueError("bagua.new_group: rank {} outside [0, {})".format(r, pg.size))
    name = "group{}".format(_group_count)
    host = pg._host.new_group(ranks, name, backend="host", hierarchical=False)
    nccl = None
    if pg._nccl is not None:
        nccl = pg._host.new_group(
            ranks, name + "_nccl", backend="nccl", hierarchical=False,
            cuda_device=torch.cuda.current_device(),
        )
    if host is None:
        return None
    return BaguaProcessGroup(host, nccl, ranks, name)


def get_rank(group=None):
    return (group or _check_init()).rank


def get_world_size(group=None):
    return (group or _check_init()).size


def get_local_rank():
    return _check_init()._host.local_rank


def get_local_size():
    return _check_init()._host.local_size


def get_node_rank():
    return _check_init()._host.node_rank


def _group(comm):
    if comm is None:
        return _check_init()
    if isinstance(comm, BaguaProcessGroup):
        return comm
    raise TypeError("bagua: comm must be a BaguaProcessGroup (from new_group) or None")


def _check(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("bagua.{}: expected a torch.Tensor, got {}".format(what, type(t)))
    if not t.is_contiguous():
        raise ValueError("bagua.{}: the tensor must be contiguous (call .contiguous())".format(what))
    if t.is_sparse:
        raise ValueError("bagua.{}: sparse tensors are not supported".format(what))
    return dtype_code(t.dtype)


def _run(comm_obj, tensors, issue):
    if any(t.is_cuda for t in tensors):
        torch.cuda.current_stream().synchronize()
    work = issue(comm_obj)
    work.wait()


def _same(a, b, what):
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            "bagua.{}: send and recv must have the same dtype and device ({} {} vs {} {})".format(
                what, a.dtype, a.device, b.dtype, b.device
            )
        )


def allreduce(send_tensor, recv_tensor, op=ReduceOp.SUM, comm=None):
    dt = _check(send_tensor, "allreduce")
    _check(recv_tensor, "allreduce")
    _same(send_tensor, recv_tensor, "allreduce")
    if send_tensor.numel() != recv_tensor.numel():
        raise ValueError("bagua.allreduce: send and recv sizes differ")
    g = _group(comm)
    c = g._comm_for(send_tensor)
    _run(c, [send_tensor], lambda c: c.all_reduce(
        send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel(), dt, int(op)))


def allreduce_inplace(tensor, op=ReduceOp.SUM, comm=None):
    allreduce(tensor, tensor, op, comm)


def reduce(send_tensor, recv_tensor, dst, op=ReduceOp.SUM, comm=None):
    dt = _check(send_tensor, "reduce")
    _check(recv_tensor, "reduce")
    _same(send_tensor, recv_tensor, "reduce")
    g = _group(comm)
    c = g._comm_for(send_tensor)
    _run(c, [send_tensor], lambda c: c.reduce(
        send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel(), dt, int(op), dst))


def reduce_inplace(tensor, dst, op=ReduceOp.SUM, comm=None):
    reduce(tensor, tensor, dst, op, comm)


def broadcast(tensor, src=0, comm=None):
    dt = _check(tensor, "broadcast")
    g = _group(comm)
    c = g._comm_for(tensor)
    _run(c, [tensor], lambda c: c.broadcast(tensor.data_ptr(), tensor.numel(), dt, src))


def allgather(send_tensor, recv_tensor, comm=None):
    dt = _check(send_tensor, "allgather")
    _check(recv_tensor, "allgather")
    _same(send_tensor, recv_tensor, "allgather")
    g = _group(comm)
    if recv_tensor.numel() != send_tensor.numel() * g.size:
        raise ValueError(
            "bagua.allgather: recv must hold world_size * send.numel() = {} elements, has {}".format(
                send_tensor.numel() * g.size, recv_tensor.numel()))
    c = g._comm_for(send_tensor)
    _run(c, [send_tensor], lambda c: c.all_gather(
        send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel(), dt))


def allgather_inplace(tensor, comm=None):
    g = _group(comm)
    n = tensor.numel() // g.size
    chunk = tensor.view(-1)[g.rank * n:(g.rank + 1) * n].clone()
    allgather(chunk, tensor, comm)


def reduce_scatter(send_tensor, recv_tensor, op=ReduceOp.SUM, comm=None):
    dt = _check(send_tensor, "reduce_scatter")
    _check(recv_tensor, "reduce_scatter")
    _same(send_tensor, recv_tensor, "reduce_scatter")
    g = _group(comm)
    if send_tensor.numel() != recv_tensor.numel() * g.size:
        raise ValueError("bagua.reduce_scatter: send must hold world_size * recv.numel() elements")
    c = g._comm_for(send_tensor)
    _run(c, [send_tensor], lambda c: c.reduce_scatter(
        send_tensor.data_ptr(), recv_tensor.data_ptr(), recv_tensor.numel(), dt, int(op)))


def reduce_scatter_inplace(tensor, op=ReduceOp.SUM, comm=None):
    g = _group(comm)
    n = tensor.numel() // g.size
    out = torch.empty(n, dtype=tensor.dtype, device=tensor.device)
    reduce_scatter(tensor, out, op, comm)
    tensor.view(-1)[g.rank * n:(g.rank + 1) * n].copy_(out)


def alltoall(send_tensor, recv_tensor, comm=None):
    dt = _check(send_tensor, "alltoall")
    _check(recv_tensor, "alltoall")
    _same(send_tensor, recv_tensor, "alltoall")
    g = _group(comm)
    if send_tensor.numel() % g.size or send_tensor.numel() != recv_tensor.numel():
        raise ValueError("bagua.alltoall: send and recv must hold the same multiple of world_size")
    c = g._comm_for(send_tensor)
    _run(c, [send_tensor], lambda c: c.all_to_all(
        send_tensor.data_ptr(), recv_tensor.data_ptr(), send_tensor.numel() // g.size, dt))


def alltoall_inplace(tensor, comm=None):
    out = torch.empty_like(tensor)
    alltoall(tensor, out, comm)
    tensor.copy_(out)


def send(tensor, dst, comm=None):
    dt = _check(tensor, "send")
    c = _group(comm)._comm_for(tensor)
    _run(c, [tensor], lambda c: c.send(tensor.data_ptr(), tensor.numel(), dt, dst))


def recv(tensor, src, comm=None):
    dt = _check(tensor, "recv")
    c = _group(comm)._comm_for(tensor)
    _run(c, [tensor], lambda c: c.recv(tensor.data_ptr(), tensor.numel(), dt, src))


def barrier(comm=None):
    _group(comm)._host.barrier().wait()


def broadcast_object(obj, src=0, comm=None):
    """Pickles ``obj`` on ``src`` and returns it on every rank."""
    g = _group(comm)
    if g.rank == src:
        buf = io.BytesIO()
        pickle.dump(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        n = torch.zeros(1, dtype=torch.int64)
    g._host.broadcast(n.data_ptr(), 1, dtype_code(torch.int64), src).wait()
    if g.rank != src:
        data = torch.empty(int(n.item()), dtype=torch.uint8)
    if data.numel():
        g._host.broadcast(data.data_ptr(), data.numel(), dtype_code(torch.uint8), src).wait()
    if g.rank == src:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, comm=None):
    g = _group(comm)
    return [broadcast_object(obj if r == g.rank else None, r, comm) for r in range(g.size)]
