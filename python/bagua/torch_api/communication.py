"""Process groups, communicators and collectives with Bagua's names, signatures and semantics.

CPU tensors go through the host backend (TCP + shared memory); CUDA tensors through NCCL when
the extension was built with NCCL and a GPU is visible. Tensors are exchanged without copies:
the C++ core reads and writes the tensors' memory (they must be contiguous). Every call is
synchronous for the caller: it returns when the result is in the output tensor (CUDA: the
current stream is synchronised before the collective is issued on the communicator's stream,
and the call returns once that stream finished it).

As in Bagua, ``init_process_group`` also initialises ``torch.distributed`` (NCCL when CUDA is
usable, else Gloo) on the same rendezvous, so ``torch.distributed.barrier()`` and
``DistributedSampler()`` work in Bagua scripts. The core's own store listens on a port that rank
0 picks freely and publishes through torch's store: the job needs one fixed port (MASTER_PORT),
whichever launcher set it.

Collectives take ``comm``: ``None`` (the default group's global communicator), a communicator
(``group.get_global_communicator()``), or a ``BaguaProcessGroup``. A rank outside a group gets a
group whose communicators are ``CommMember.NON_COMM_MEMBER``, and every collective on it returns
at once, as in Bagua.
"""

import datetime
import functools
import io
import os
import pickle
import threading
import warnings
import weakref

import torch

from ._ext import ext
from . import env
# Bagua's users import these names from here.
from ._communicator import BaguaCommunicator, CommMember, ReduceOp, dtype_code  # noqa: F401

# fmt: off
__all__ = [
    "ReduceOp", "new_group", "from_torch_group", "init_process_group", "destroy_process_group",
    "is_initialized", "send", "recv", "broadcast", "broadcast_object", "allgather_object",
    "reduce", "reduce_inplace", "allreduce", "allreduce_inplace", "allreduce_coalesced_inplace",
    "broadcast_coalesced", "allgather", "allgather_inplace", "gather", "gather_inplace",
    "scatter", "scatter_inplace", "reduce_scatter", "reduce_scatter_inplace",
    "alltoall", "alltoall_inplace", "alltoall_v", "alltoall_v_inplace", "barrier",
    "BaguaProcessGroup", "BaguaCommunicator", "CommMember", "get_backend",
]
# fmt: on

class BaguaProcessGroup:
    """A group of ranks (global ranks in ``ranks``, sorted). Members have a global communicator
    (and, on request, intra-node and inter-node ones, built lazily like Bagua's); a rank outside
    the group gets ``CommMember.NON_COMM_MEMBER`` for each, and collectives on it do nothing.

    ``rank`` / ``size`` (our additions) are this process's rank in the group (-1 outside it) and
    the group's size.
    """

    def __init__(self, ranks, stream, group_name, communicator=None):
        self.ranks = list(ranks)
        self.stream = stream
        self.group_name = group_name
        self._global = communicator if communicator is not None else CommMember.NON_COMM_MEMBER
        self._sub = {}

    @property
    def is_member(self):
        return self._global is not CommMember.NON_COMM_MEMBER

    @property
    def rank(self):
        return self._global.rank() if self.is_member else -1

    @property
    def size(self):
        return len(self.ranks)

    # What the reducer and our own code use: the group's host and NCCL groups.
    @property
    def _host(self):
        return self._global._host if self.is_member else None

    @property
    def _nccl(self):
        return self._global._nccl if self.is_member else None

    def get_global_communicator(self):
        """This group's communicator over all its ranks (NON_COMM_MEMBER outside the group)."""
        return self._global

    def _sub_comm(self, kind):
        if not self.is_member:
            return CommMember.NON_COMM_MEMBER
        if kind not in self._sub:
            local = get_local_size()
            me = get_rank()
            if kind == "intra":
                ranks = [r for r in self.ranks if r // local == me // local]
            else:
                ranks = [r for r in self.ranks if r % local == me % local]
            idx = [self.ranks.index(r) for r in ranks]
            # Different ranks build different groups of this kind (one per node, one per local
            # rank): the members are part of the name, as in Bagua's communicator keys.
            name = "{}_{}_{}".format(self.group_name, kind, ",".join(map(str, ranks)))
            host = self._host.new_group(idx, name, backend="host", hierarchical=False)
            nccl = None
            if self._nccl is not None:
                nccl = self._host.new_group(idx, name + "_nccl", backend="nccl",
                                            hierarchical=False,
                                            cuda_device=torch.cuda.current_device())
            self._sub[kind] = BaguaCommunicator(host, nccl, self.stream)
        return self._sub[kind]

    def get_intra_node_communicator(self):
        """The members on this node (collective over them: each calls it in the same order)."""
        return self._sub_comm("intra")

    def get_inter_node_communicator(self):
        """The members with this process's local rank, one per node."""
        return self._sub_comm("inter")

    def _comm_for(self, tensor):
        return self._global._for(tensor)

    def destroy(self):
        for c in list(self._sub.values()) + ([self._global] if self.is_member else []):
            c.destroy()
        self._sub.clear()


_default_pg = None
_default_store = None
_owns_torch_pg = False
_group_count = 0
_init_count = 0
_lock = threading.RLock()
_pg_group_ranks = {}
_torch_to_bagua_pg_map = weakref.WeakKeyDictionary()


def is_initialized():
    return _default_pg is not None


def _check_init():
    if _default_pg is None:
        raise RuntimeError(
            "bagua: call bagua.torch_api.init_process_group() first (under baguarun, torchrun or "
            "python -m bagua.distributed.launch, which set MASTER_ADDR, MASTER_PORT, RANK, "
            "WORLD_SIZE, LOCAL_RANK)"
        )
    return _default_pg


def _get_default_group():
    """The default group (Bagua's private name, used by its tests and Lightning). As in Bagua,
    initialisation is asked of ``is_initialized()`` (module-level lookup): lightning-Bagua's
    tests patch it to True and build a wrap, engine mocked, without a group (then None)."""
    if not is_initialized():
        _check_init()
    return _default_pg


def get_default_group():
    return _check_init()


def _torch_backend(local_world_size):
    """torch.distributed's backend: NCCL for CUDA tensors when every rank of a node has a GPU
    (Bagua used NCCL), plus Gloo for CPU tensors where torch can mix them (>= 2.0); Gloo
    alone without GPUs or with fewer GPUs than ranks (NCCL would refuse a shared GPU)."""
    import torch.distributed as dist

    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dist.is_nccl_available() and ngpu >= max(1, local_world_size):
        major = int(torch.__version__.split(".")[0]) if torch.__version__[0].isdigit() else 1
        return "cpu:gloo,cuda:nccl" if major >= 2 else "nccl"
    return "gloo"


def _init_device(current, local_rank, ngpu):
    """The CUDA device of the default group's NCCL communicator: the one the script selected
    before init (``torch.cuda.set_device``, as Bagua's docs ask), else LOCAL_RANK's. A script
    that selected nothing is on device 0 on every rank, so 0 counts as "nothing selected" (Bagua
    always took LOCAL_RANK, and a model on another device crashed in NCCL with an illegal
    memory access; with_bagua now also refuses parameters on a device other than this one)."""
    return current if current != 0 else local_rank % ngpu


def init_process_group(store=None, rank=-1, world_size=-1, local_world_size=-1):
    """Initialises the default process group, and ``torch.distributed`` as Bagua does.

    ``store`` (a ``torch.distributed.Store``) is the rendezvous store: with it, ``rank``,
    ``world_size`` and ``local_world_size`` are required (Bagua's contract) and are written to
    RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE. Without it, env:// is used (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, as set by every launcher), and
    arguments >= 0 override the environment. ``torch.distributed`` is initialised on the same
    store unless it already is (then its default store is used). A second call raises, as in
    Bagua. With CUDA, the device the script selected before (a non-zero
    ``torch.cuda.current_device()``) stays, else LOCAL_RANK's is selected (``_init_device``)."""
    global _default_pg, _default_store, _owns_torch_pg, _init_count
    import torch.distributed as dist

    with _lock:
        if _default_pg is not None:
            raise RuntimeError("bagua: trying to initialize the default process group twice "
                               "(call destroy_process_group() first)")
        if store is not None:
            if rank < 0 or world_size <= 0 or local_world_size <= 0:
                raise ValueError("bagua.init_process_group(store=...) needs rank >= 0, "
                                 "world_size > 0 and local_world_size > 0")
            os.environ["LOCAL_RANK"] = str(rank % local_world_size)
        if rank >= 0:
            os.environ["RANK"] = str(rank)
        if world_size > 0:
            os.environ["WORLD_SIZE"] = str(world_size)
        if local_world_size > 0:
            os.environ["LOCAL_WORLD_SIZE"] = str(local_world_size)
        r, w = env.get_rank(), env.get_world_size()
        if store is None and not (dist.is_available() and dist.is_initialized()):
            # A script run without a launcher: the core's defaults (127.0.0.1:29500), or any
            # free port for a world of one, written out for torch's env:// rendezvous.
            if not env._is_set("MASTER_ADDR"):
                os.environ["MASTER_ADDR"] = env.get_master_addr()
            if not env._is_set("MASTER_PORT"):
                os.environ["MASTER_PORT"] = str(env.find_free_network_port() if w == 1
                                                else env.get_master_port())
        lw, lr = env.get_local_size(), env.get_local_rank()
        timeout = datetime.timedelta(minutes=30)

        owns = False
        if dist.is_available() and dist.is_initialized():
            tstore = dist.distributed_c10d._get_default_store()
        else:
            if store is None:
                store, _, _ = next(dist.rendezvous("env://", rank=r, world_size=w,
                                                   timeout=timeout))
                store.set_timeout(timeout)
            tstore = store
            dist.init_process_group(backend=_torch_backend(lw), store=tstore, rank=r,
                                    world_size=w, timeout=timeout)
            owns = True
        _init_count += 1
        # Not keyed by TORCHELASTIC_RESTART_COUNT: it differs between the nodes of one round (a
        # node restarted for a membership change keeps its count, one whose worker failed
        # counts up, a joining node starts at 0); the env:// store is new in every round.
        key = "bagua/core_store/{}".format(_init_count)
        server = None
        if r == 0:
            addr = env.get_master_addr()
            # The core listens on MASTER_ADDR's interface (or BAGUA_STORE_LISTEN_ADDR).
            server = ext.start_store_server(addr, 0)
            tstore.set(key, "{}:{}".format(addr, server.port))
            port = server.port
        else:
            addr, port = tstore.get(key).decode().rsplit(":", 1)
            port = int(port)
        try:
            host = ext.init_group(addr, port, r, w, lr, lw, backend="host", hierarchical=True,
                                  server=server)
        except Exception:
            if owns:
                dist.destroy_process_group()
            raise
        nccl = None
        stream = None
        ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ext.HAVE_NCCL and 0 < ngpu < host.local_size:
            # NCCL needs one GPU per rank of a node: CUDA collectives stay off, CPU ones work.
            warnings.warn(
                "bagua: {} ranks on this node but {} GPU(s): no NCCL group, CUDA tensors "
                "cannot be communicated (CPU tensors use the host backend)".format(
                    host.local_size, ngpu
                )
            )
        elif ext.HAVE_NCCL and ngpu > 0:
            dev = _init_device(torch.cuda.current_device(), host.local_rank, ngpu)
            torch.cuda.set_device(dev)
            nccl = host.new_group(
                list(range(host.size)), "nccl", backend="nccl", hierarchical=True, cuda_device=dev
            )
            stream = torch.cuda.current_stream()
        _default_store = tstore
        _owns_torch_pg = owns
        _default_pg = BaguaProcessGroup(range(host.size), stream, "default",
                                        BaguaCommunicator(host, nccl, stream))
        _pg_group_ranks[_default_pg] = {g: g for g in range(host.size)}
        return _default_pg


def _init(store=None, rank=-1, world_size=-1, local_rank=-1, local_world_size=-1):
    """init_process_group with an explicit local rank (our Lightning strategy)."""
    if local_rank >= 0:
        os.environ["LOCAL_RANK"] = str(local_rank)
    return init_process_group(store, rank, world_size, local_world_size)


def destroy_process_group():
    """Destroys the default group and every group made from it (and torch.distributed's
    default group when init_process_group created it)."""
    global _default_pg, _default_store, _owns_torch_pg
    with _lock:
        if _default_pg is None:
            return
        for pg in list(_pg_group_ranks):
            if pg is not _default_pg:
                pg.destroy()
        _pg_group_ranks.clear()
        _default_pg.destroy()
        _default_pg = None
        _default_store = None
        if _owns_torch_pg:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            _owns_torch_pg = False


def _node_layout(ranks, rank):
    """(local rank, local size) of ``rank`` in a group over the sorted global ``ranks`` when
    every node (``LOCAL_WORLD_SIZE`` consecutive ranks) holds the same number of members, else
    None: such a group has no hierarchical sub-groups (the core's layout is node by node, the
    same count on each)."""
    local = get_local_size()
    nodes = {}
    for r in ranks:
        nodes.setdefault(r // local, []).append(r)
    if len({len(m) for m in nodes.values()}) != 1:
        return None
    mine = nodes[rank // local]
    return mine.index(rank), len(mine)


def new_group(ranks=None, stream=None):
    """A group over ``ranks`` (global ranks; None: all). Every rank of the default group calls
    it, in the same order; members rendezvous with each other, a rank outside ``ranks`` gets a
    group whose communicators are ``CommMember.NON_COMM_MEMBER`` (collectives on it return at
    once). ``stream``: the CUDA stream of the group's communicators (default: the default
    group's)."""
    pg = _check_init()
    global _group_count
    with _lock:
        _group_count += 1
        n = get_world_size()
        if ranks is None:
            ranks = list(range(n))
        for r in ranks:
            if r < 0 or r >= n:
                raise ValueError("bagua.new_group: invalid rank {}, should be non-negative and "
                                 "less than world size {}".format(r, n))
        ranks = sorted(set(int(r) for r in ranks))
        if stream is None:
            stream = pg.stream
        name = "group{}".format(_group_count)
        comm = None
        if pg.rank in ranks:
            # Hierarchical sub-groups (intra-node, inter-node) whenever the members are spread
            # evenly over their nodes, as Bagua's groups always have them: algorithms'
            # hierarchical=True defaults then work on any such group (one node: a leaders'
            # ring of one).
            layout = _node_layout(ranks, pg.rank)
            hier = dict(hierarchical=layout is not None,
                        local_rank=layout[0] if layout else -1,
                        local_world_size=layout[1] if layout else -1)
            host = pg._host.new_group(ranks, name, backend="host", **hier)
            nccl = None
            if pg._nccl is not None:
                nccl = pg._host.new_group(
                    ranks, name + "_nccl", backend="nccl",
                    cuda_device=torch.cuda.current_device(), **hier
                )
            comm = BaguaCommunicator(host, nccl, stream)
        g = BaguaProcessGroup(ranks, stream, name, comm)
        _pg_group_ranks[g] = {gr: i for i, gr in enumerate(ranks)}
        return g


def _torch_group_ranks(group):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if group is None or group is getattr(dist.GroupMember, "WORLD", None):
        return list(range(get_world_size()))
    if hasattr(dist, "get_process_group_ranks"):
        try:
            return list(dist.get_process_group_ranks(group))
        except Exception:  # not a group of this process (a non-member's placeholder)
            return None
    table = getattr(c10d, "_pg_group_ranks", {})
    if group in table:
        return sorted(table[group].keys())
    return None


def from_torch_group(group, stream=None):
    """The Bagua group over the ranks of a ``torch.distributed`` group. Every rank calls it in
    the same order (with the group ``torch.distributed.new_group`` returned it, a placeholder
    on ranks outside the group: they get a non-member group)."""
    ranks = _torch_group_ranks(group)
    if ranks is None:
        global _group_count
        _check_init()
        with _lock:
            _group_count += 1
            g = BaguaProcessGroup([], stream, "group{}".format(_group_count))
            _pg_group_ranks[g] = {}
            return g
    return new_group(ranks, stream)


def _install_torch_group_patch():
    """``ProcessGroup.bagua_patch()`` and friends on torch's process groups (Bagua's patch)."""
    try:
        from torch.distributed import ProcessGroup as TorchProcessGroup
    except ImportError:  # pragma: no cover - torch without distributed
        return

    def bagua_patch(self, stream=None):
        if self not in _torch_to_bagua_pg_map:
            _torch_to_bagua_pg_map[self] = from_torch_group(self, stream)
        return self

    def bagua_pg(self):
        if self not in _torch_to_bagua_pg_map:
            raise RuntimeError("bagua: call bagua_patch() on this torch process group first")
        return _torch_to_bagua_pg_map[self]

    TorchProcessGroup.bagua_patch = bagua_patch
    TorchProcessGroup.bagua_pg = property(bagua_pg)
    TorchProcessGroup.bagua_get_global_communicator = \
        lambda self: self.bagua_pg.get_global_communicator()
    TorchProcessGroup.bagua_get_inter_node_communicator = \
        lambda self: self.bagua_pg.get_inter_node_communicator()
    TorchProcessGroup.bagua_get_intra_node_communicator = \
        lambda self: self.bagua_pg.get_intra_node_communicator()


_install_torch_group_patch()


def get_rank(group=None):
    """This process's rank: in ``group`` when given, else the global rank (RANK from the
    environment before init_process_group, as Bagua reads it)."""
    if group is not None:
        return group.rank
    if _default_pg is not None:
        return _default_pg.rank
    return env.get_rank()


def get_world_size(group=None):
    if group is not None:
        return group.size
    if _default_pg is not None:
        return _default_pg.size
    return env.get_world_size()


def get_local_rank():
    if _default_pg is not None:
        return _default_pg._host.local_rank
    return env.get_local_rank()


def get_local_size():
    if _default_pg is not None:
        return _default_pg._host.local_size
    return env.get_local_size()


def get_node_rank():
    if _default_pg is not None:
        return _default_pg._host.node_rank
    return env.get_node_rank()


def _rank_not_in_comm(comm=None):
    """True when this process is outside the communicator."""
    if comm is None:
        return False
    return comm is CommMember.NON_COMM_MEMBER


def _rank_not_in_group(group=None):
    """True when this process is outside the group."""
    if group is None:
        return False
    return _rank_not_in_comm(group.get_global_communicator())


def _comm(comm):
    """The communicator a collective runs on, or None when this rank is outside it."""
    if comm is None or comm is CommMember.WORLD:
        return _check_init().get_global_communicator()
    if comm is CommMember.NON_COMM_MEMBER:
        return None
    if isinstance(comm, BaguaProcessGroup):
        c = comm.get_global_communicator()
        return None if c is CommMember.NON_COMM_MEMBER else c
    if isinstance(comm, BaguaCommunicator):
        return comm
    raise TypeError("bagua: comm must be a communicator (group.get_global_communicator()), a "
                    "BaguaProcessGroup or None, got {}".format(type(comm)))


def allreduce(send_tensor, recv_tensor, op=ReduceOp.SUM, comm=None):
    """Reduces ``send_tensor`` over every rank into ``recv_tensor`` (op: ReduceOp)."""
    c = _comm(comm)
    if c is not None:
        c.allreduce(send_tensor, recv_tensor, op)


def allreduce_inplace(tensor, op=ReduceOp.SUM, comm=None):
    c = _comm(comm)
    if c is not None:
        c.allreduce(tensor, tensor, op)


def allreduce_coalesced_inplace(tensors, op=ReduceOp.SUM, comm=None):
    """All-reduces a list of tensors as one flattened buffer per (dtype, device)."""
    c = _comm(comm)
    if c is None:
        return
    from .utils import flatten, unflatten

    for group in _by_type(tensors):
        flat = flatten(group)
        c.allreduce(flat, flat, op)
        for t, synced in zip(group, unflatten(flat, group)):
            t.copy_(synced)


def broadcast_coalesced(tensors, src=0, comm=None):
    """Broadcasts a list of tensors from ``src`` as one flattened buffer per (dtype, device)."""
    c = _comm(comm)
    if c is None:
        return
    from .utils import flatten, unflatten

    for group in _by_type(tensors):
        flat = flatten(group)
        c.broadcast(flat, src)
        for t, synced in zip(group, unflatten(flat, group)):
            t.copy_(synced)


def _by_type(tensors):
    parts = {}
    for t in tensors:
        parts.setdefault((t.dtype, t.device), []).append(t)
    return list(parts.values())


def reduce(send_tensor, recv_tensor, dst, op=ReduceOp.SUM, comm=None):
    c = _comm(comm)
    if c is not None:
        c.reduce(send_tensor, recv_tensor, dst, op)


def reduce_inplace(tensor, dst, op=ReduceOp.SUM, comm=None):
    c = _comm(comm)
    if c is not None:
        c.reduce(tensor, tensor, dst, op)


def broadcast(tensor, src=0, comm=None):
    c = _comm(comm)
    if c is not None:
        c.broadcast(tensor, src)


def allgather(send_tensor, recv_tensor, comm=None):
    c = _comm(comm)
    if c is not None:
        c.allgather(send_tensor, recv_tensor)


def allgather_inplace(tensor, comm=None):
    c = _comm(comm)
    if c is not None:
        c.allgather_inplace(tensor)


def gather(send_tensor, recv_tensor, dst, comm=None):
    """Gathers every rank's ``send_tensor`` into ``recv_tensor`` on ``dst`` (nranks * numel)."""
    c = _comm(comm)
    if c is not None:
        c.gather(send_tensor, recv_tensor, dst)


def gather_inplace(tensor, count, dst, comm=None):
    """In place: on ``dst`` ``tensor`` holds nranks * count elements (its own chunk at its
    rank), elsewhere ``count`` elements."""
    c = _comm(comm)
    if c is not None:
        c.gather_inplace(tensor, count, dst)


def scatter(send_tensor, recv_tensor, src, comm=None):
    """Rank i receives the i-th chunk of ``send_tensor`` (used on ``src`` only)."""
    c = _comm(comm)
    if c is not None:
        c.scatter(send_tensor, recv_tensor, src)


def scatter_inplace(tensor, count, src, comm=None):
    c = _comm(comm)
    if c is not None:
        c.scatter_inplace(tensor, count, src)


def reduce_scatter(send_tensor, recv_tensor, op=ReduceOp.SUM, comm=None):
    c = _comm(comm)
    if c is not None:
        c.reduce_scatter(send_tensor, recv_tensor, op)


def reduce_scatter_inplace(tensor, op=ReduceOp.SUM, comm=None):
    c = _comm(comm)
    if c is not None:
        c.reduce_scatter_inplace(tensor, op)


def alltoall(send_tensor, recv_tensor, comm=None):
    c = _comm(comm)
    if c is not None:
        c.alltoall(send_tensor, recv_tensor)


def alltoall_inplace(tensor, comm=None):
    c = _comm(comm)
    if c is not None:
        c.alltoall_inplace(tensor)


def alltoall_v(send_tensor, send_counts, send_displs, recv_tensor, recv_counts, recv_displs,
               comm=None):
    """All-to-all with per-peer counts and displacements (see BaguaCommunicator.alltoall_v)."""
    c = _comm(comm)
    if c is not None:
        c.alltoall_v(send_tensor, send_counts, send_displs, recv_tensor, recv_counts,
                     recv_displs)


def alltoall_v_inplace(tensor, counts, displs, comm=None):
    c = _comm(comm)
    if c is not None:
        c.alltoall_v_inplace(tensor, counts, displs)


def send(tensor, dst, comm=None):
    c = _comm(comm)
    if c is not None:
        c.send(tensor, dst)


def recv(tensor, src, comm=None):
    c = _comm(comm)
    if c is not None:
        c.recv(tensor, src)


def barrier(comm=None):
    c = _comm(comm)
    if c is not None:
        c.barrier()


def broadcast_object(obj, src=0, comm=None):
    """Pickles ``obj`` on ``src`` and returns it on every rank (host memory only)."""
    c = _comm(comm)
    if c is None:
        return obj
    host = c._host
    if c.rank() == src:
        buf = io.BytesIO()
        pickle.dump(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        n = torch.zeros(1, dtype=torch.int64)
    host.broadcast(n.data_ptr(), 1, dtype_code(torch.int64), src).wait()
    if c.rank() != src:
        data = torch.empty(int(n.item()), dtype=torch.uint8)
    if data.numel():
        host.broadcast(data.data_ptr(), data.numel(), dtype_code(torch.uint8), src).wait()
    if c.rank() == src:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, comm=None):
    c = _comm(comm)
    if c is None:
        return [obj]
    return [broadcast_object(obj if r == c.rank() else None, r, comm) for r in range(c.nranks())]


class _Backend:
    """The Python engine of one module (Bagua's ``get_backend(model_name)``): runs the buckets
    of a user-written algorithm. ``register_ordered_buckets`` sets the buckets;
    ``mark_communication_ready(tensor)`` marks a tensor ready and runs, in registration order,
    every bucket whose tensors are all ready; ``wait_pending_comm_ops()`` runs the rest and
    starts the next iteration. Everything runs on the calling thread (bucket.py says why)."""

    def __init__(self, model_name):
        self.model_name = model_name
        self._buckets = []
        self._ready = set()
        self._next = 0

    def register_ordered_buckets(self, buckets):
        self._buckets = list(buckets)
        self._ready = set()
        self._next = 0

    def mark_communication_ready(self, tensor, *unused):
        self._ready.add(id(tensor))
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            if not all(id(t) in self._ready for t in b.tensors):
                break
            self._next += 1
            b._run_ops()

    def wait_pending_comm_ops(self):
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            self._next += 1
            b._run_ops()
        self._ready = set()
        self._next = 0


@functools.lru_cache(maxsize=None)
def get_backend(model_name):
    return _Backend(model_name)
