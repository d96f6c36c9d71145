"""Worker functions run by harness.run in separate processes (one per rank)."""

import json
import os
import sys
import time

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import (
    Algorithm,
    GradientAllReduceAlgorithm,
    ByteGradAlgorithm,
    DecentralizedAlgorithm,
    LowPrecisionDecentralizedAlgorithm,
    AsyncModelAverageAlgorithm,
)
from bagua.torch_api.algorithms.q_adam import QAdamAlgorithm, QAdamOptimizer
from bagua.torch_api.data_parallel import DistributedDataParallel

WORKERS = {}


def _init():
    """The bundled scenarios share one process: init once (a second init raises, as in
    Bagua)."""
    if not bagua.is_initialized():
        bagua.init_process_group()


def worker(f):
    WORKERS[f.__name__] = f
    return f


class Net(torch.nn.Module):
    """Bagua's test model: 2 -> 10 -> 50 -> 4 with ReLUs and a softmax."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 10, bias=False)
        self.fc2 = torch.nn.Linear(10, 50, bias=True)
        self.fc3 = torch.nn.Linear(50, 4, bias=False)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return torch.softmax(self.fc3(x), dim=1)


def data(rank, step, batch=4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(batch, 2, generator=g), torch.randn(batch, 4, generator=g)


def _device(a):
    """The worker's device: a["device"] ("cpu" or "cuda": this rank's current GPU)."""
    dev = torch.device(a.get("device", "cpu"))
    return torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" else dev


def flat(model):
    return torch.cat([p.detach().reshape(-1).cpu().clone() for p in model.parameters()])


def make_algorithm(name, kwargs, model, lr):
    if name == "qadam":
        params = model.parameters()
        if kwargs.get("groups"):  # one group per parameter, in reverse order
            params = [{"params": [p]} for p in reversed(list(model.parameters()))]
        opt = QAdamOptimizer(params, lr=lr, **kwargs.get("opt", {}))
        return QAdamAlgorithm(opt, **kwargs.get("algo", {})), opt
    return Algorithm.init(name, **kwargs), torch.optim.SGD(model.parameters(), lr=lr)


# ---- communication --------------------------------------------------------------------------


@worker
def comm_basic(a):
    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()
    out = {"rank": r, "world": n, "local_rank": bagua.get_local_rank(),
           "local_size": bagua.get_local_size()}
    dev = a.get("device", "cpu")
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
        x = (torch.arange(1001, dtype=torch.float64) * (r + 1) + r).to(dt).to(dev)
        for op in ("SUM", "MAX", "MIN", "AVG"):
            if op == "AVG" and not dt.is_floating_point:
                continue
            y = torch.empty_like(x)
            bagua.allreduce(x, y, op=getattr(bagua.ReduceOp, op))
            out["allreduce_{}_{}".format(dt, op)] = y.cpu()
    x = torch.arange(7, dtype=torch.float32, device=dev) + 100 * r
    bagua.broadcast(x, src=n - 1)
    out["broadcast"] = x.cpu()
    g = torch.empty(7 * n, dtype=torch.float32, device=dev)
    bagua.allgather(torch.arange(7, dtype=torch.float32, device=dev) + 100 * r, g)
    out["allgather"] = g.cpu()
    rs = torch.empty(5, dtype=torch.float32, device=dev)
    bagua.reduce_scatter(torch.arange(5 * n, dtype=torch.float32, device=dev) * (r + 1), rs)
    out["reduce_scatter"] = rs.cpu()
    red = torch.zeros(9, device=dev)
    bagua.reduce(torch.full((9,), float(r + 1), device=dev), red, dst=0)
    out["reduce"] = red.cpu()
    a2a = torch.empty(3 * n, device=dev)
    bagua.alltoall(torch.arange(3 * n, dtype=torch.float32, device=dev) + 1000 * r, a2a)
    out["alltoall"] = a2a.cpu()
    if n >= 2:
        if r == 0:
            bagua.send(torch.arange(11, dtype=torch.float32, device=dev) * 3, dst=1)
        elif r == 1:
            t = torch.zeros(11, device=dev)
            bagua.recv(t, src=0)
            out["recv"] = t.cpu()
    bagua.barrier()
    out["object"] = bagua.broadcast_object({"from": r, "list": [1, 2, r]}, src=0)
    if n >= 3:
        # Every rank calls new_group; a non-member gets a group whose collectives do nothing.
        sub = bagua.new_group([0, 2])
        s = torch.tensor([float(r + 1)])
        bagua.allreduce_inplace(s, comm=sub)
        out["subgroup"] = s
        out["subgroup_member"] = sub.get_global_communicator() is not \
            bagua.communication.CommMember.NON_COMM_MEMBER
    return out


@worker
def comm_bagua(a):
    """The rest of Bagua's communication API: communicators, gather/scatter, alltoall_v,
    coalesced ops, bitwise ops, torch.distributed initialised alongside, torch groups."""
    import torch.distributed as dist
    from bagua.torch_api import communication as C

    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()
    out = {}
    g = C._get_default_group()
    c = g.get_global_communicator()
    out["comm_rank"], out["comm_nranks"] = c.rank(), c.nranks()
    # torch.distributed is usable (Bagua initialises it): barrier, all_reduce, a sampler.
    out["dist"] = (dist.is_initialized(), dist.get_rank(), dist.get_world_size())
    dist.barrier()
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    out["dist_allreduce"] = t.item()
    sampler = torch.utils.data.distributed.DistributedSampler(list(range(10)), shuffle=False)
    out["sampler"] = list(iter(sampler))
    # gather / scatter (and in place) to the last rank.
    root = n - 1
    recv = torch.zeros(3 * n) if r == root else None
    bagua.gather(torch.arange(3, dtype=torch.float32) + 10 * r, recv, root)
    out["gather"] = recv
    buf = torch.zeros(3 * n) if r == root else torch.arange(3, dtype=torch.float32) + 10 * r
    if r == root:
        buf[3 * r:3 * r + 3] = torch.arange(3, dtype=torch.float32) + 10 * r
    bagua.gather_inplace(buf, 3, root)
    out["gather_inplace"] = buf
    src = torch.arange(2 * n, dtype=torch.float32) * 7 if r == root else None
    part = torch.zeros(2)
    bagua.scatter(src, part, root)
    out["scatter"] = part
    buf = torch.arange(2 * n, dtype=torch.float32) * 7 if r == root else torch.zeros(2)
    bagua.scatter_inplace(buf, 2, root)
    out["scatter_inplace"] = buf[2 * r:2 * r + 2] if r == root else buf
    # alltoall_v: rank r sends (j + 1) elements valued 100 r + j to rank j.
    sc = [j + 1 for j in range(n)]
    sd = [sum(sc[:j]) for j in range(n + 1)]  # n + 1 entries, as Bagua's example passes
    send = torch.cat([torch.full((j + 1,), float(100 * r + j)) for j in range(n)])
    rc = [r + 1] * n
    rd = [i * (r + 1) for i in range(n)]
    recv = torch.full((n * (r + 1),), -1.0)
    bagua.alltoall_v(send, sc, sd, recv, rc, rd)
    out["alltoall_v"] = recv
    # coalesced: two dtypes in one call.
    ts = [torch.full((3,), float(r + 1)), torch.full((2,), r + 1, dtype=torch.int64),
          torch.full((4,), float(r))]
    bagua.allreduce_coalesced_inplace(ts, bagua.ReduceOp.SUM)
    out["coalesced"] = ts
    bs = [torch.full((2,), float(r)), torch.full((3,), r, dtype=torch.int32)]
    bagua.broadcast_coalesced(bs, src=root)
    out["broadcast_coalesced"] = bs
    # Bitwise ops on integers (Bagua's BOR / BAND / BXOR), through the communicator object.
    x = torch.tensor([1 << r, 0xFF ^ (1 << r), r + 1], dtype=torch.int64)
    for op in ("BOR", "BAND", "BXOR"):
        y = torch.empty_like(x)
        c.allreduce(x, y, getattr(bagua.ReduceOp, op))
        out["bitwise_" + op] = y
    y = x.clone()
    bagua.reduce_inplace(y, 0, bagua.ReduceOp.BOR)
    out["reduce_bor"] = y
    p = torch.tensor([float(r + 2)])
    bagua.allreduce_inplace(p, bagua.ReduceOp.PRODUCT)
    out["product"] = p.item()
    # Tensor-level names: comm methods take tensor.ensure_bagua_tensor().bagua_backend_tensor().
    d = torch.full((4,), float(r))
    c.allreduce_inplace(d.ensure_bagua_tensor().bagua_backend_tensor(), bagua.ReduceOp.AVG)
    out["comm_avg"] = d
    # A torch group and its Bagua twin (from_torch_group, bagua_patch).
    odd = [k for k in range(n) if k % 2 == 1]
    tg = dist.new_group(odd)
    bg = C.from_torch_group(tg)
    out["from_torch"] = (bg.ranks, C._rank_not_in_group(bg),
                         bg.get_global_communicator().rank() if r in odd else None,
                         bg.get_global_communicator().nranks() if r in odd else None)
    s = torch.tensor([float(r)])
    bagua.allreduce_inplace(s, comm=bg.get_global_communicator())
    out["from_torch_allreduce"] = s.item()
    # Intra- and inter-node communicators (one node here: all ranks, and just me).
    intra, inter = g.get_intra_node_communicator(), g.get_inter_node_communicator()
    t = torch.tensor([float(r + 1)])
    bagua.allreduce_inplace(t, comm=intra)
    u = torch.tensor([float(r + 1)])
    bagua.allreduce_inplace(u, comm=inter)
    out["hier"] = (intra.rank(), intra.nranks(), t.item(), inter.rank(), inter.nranks(),
                   u.item(), g.get_intra_node_communicator() is intra)
    wg = dist.new_group(list(range(n)))
    wg.bagua_patch()
    out["patched"] = wg in C._torch_to_bagua_pg_map and \
        wg.bagua_get_global_communicator().nranks() == n
    return out


# ---- training -------------------------------------------------------------------------------


@worker
def train(a):
    """Trains Net with an algorithm; returns losses and final weights (and, on rank 0, the
    single-process reference on the concatenated batches when asked)."""
    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()
    dev = _device(a)
    from bagua.torch_api.data_parallel.bagua_distributed import EngineOptions

    options = EngineOptions(cuda_reducer=a.get("cuda_reducer", "core"),
                            autotune=True if a.get("autotune") else None,
                            in_place_device_buckets=a.get("in_place", True))
    torch.manual_seed(r)  # different initial weights per rank: the wrap must broadcast rank 0's
    model = Net().to(dev)
    init = None
    lr = a.get("lr", 0.05)
    algo, opt = make_algorithm(a["algorithm"], a.get("kwargs", {}), model, lr)
    group = None  # the default group
    if a.get("group") == "new_group":
        group = bagua.communication.new_group(ranks=list(range(n)))
    elif a.get("group") == "torch":
        import torch.distributed as dist

        group = bagua.communication.from_torch_group(dist.new_group(list(range(n))))
    if a.get("wrapper") == "ddp":
        wrapped = DistributedDataParallel(model, optimizers=[opt], algorithm=algo,
                                          find_unused_parameters=a.get("find_unused", False),
                                          process_group=group, _engine_options=options)
        ctx = wrapped.no_sync
    else:
        wrapped = model.with_bagua([opt], algo, process_group=group,
                                   do_flatten=a.get("do_flatten", True), _engine_options=options)
        ctx = wrapped.no_sync
    init = flat(model)
    losses = []
    accum = a.get("accumulate", 1)
    for step in range(a.get("steps", 10)):
        opt.zero_grad()
        for micro in range(accum):
            x, y = data(r * accum + micro, step)
            x, y = x.to(dev), y.to(dev)
            if micro < accum - 1:
                with ctx():
                    loss = torch.nn.functional.mse_loss(wrapped(x), y)
                    loss.backward()
            else:
                loss = torch.nn.functional.mse_loss(wrapped(x), y)
                loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"init": init, "final": flat(model), "losses": losses}
    inner = wrapped.inner if a.get("wrapper") == "ddp" else wrapped.bagua_ddp
    reducer = getattr(inner._engine, "_reducer", None)
    if hasattr(reducer, "buckets_in_place"):  # the C++ reducer: buckets at do_flatten's layout
        layout = inner.bucket_layout()
        out["in_place"] = (reducer.buckets_in_place, len(layout))
        views = [p.grad.data_ptr() == p._bagua_grad_view.data_ptr()
                 for p in model.parameters() if hasattr(p, "_bagua_grad_view")]
        out["grads_at_layout"] = (sum(views), len(views))
    if a.get("autotune"):
        out["autotune"] = wrapped.bagua_ddp._engine._reducer.autotune_state
        out["layout"] = wrapped.bagua_ddp.bucket_layout()
    if a["algorithm"] == "async":
        algo.abort(model)
        algo.abort(model)  # a second abort is a no-op
        out["rounds"] = algo.rounds()
        out["final"] = flat(model)
    if a["algorithm"] == "low_precision_decentralized" and dev.type == "cpu":
        reps = algo.replicas()
        out["replicas"] = {k: torch.tensor(v) for k, v in reps.items()}
        b = wrapped.bagua_buckets
        out["lp_bucket"] = (len(b), torch.norm(b[0]._weight).item(),
                            torch.norm(out["replicas"]["self"]).item())
    if a["algorithm"] == "decentralized":
        # Bagua's tests read the last averaged weight from the (single) bucket.
        b = wrapped.bagua_buckets
        out["peer_weight"] = (len(b), b[0]._peer_weight.detach().cpu().clone())
    if a.get("reference") and r == 0:
        out["reference"] = reference(init, n * accum, a.get("steps", 10), lr, a["algorithm"])
    out["state_dict_keys"] = list(wrapped.state_dict().keys())
    # The usual unwrap loop ends (with_bagua sets no self-referencing .module).
    inner, hops = wrapped, 0
    while hasattr(inner, "module") and hops < 10:
        inner, hops = inner.module, hops + 1
    out["unwrap_hops"] = hops
    out["unwrapped_state_dict_keys"] = list(inner.state_dict().keys())
    return out


class NetUsedOutOfOrder(torch.nn.Module):
    """Registered head first, used last: the head's gradients are ready first, so the reducer's
    rebuild in ready order differs from the wrap's layout (reverse registration order)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 4)
        self.body = torch.nn.Linear(2, 16)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


@worker
def relayout(a):
    """with_bagua(do_flatten=True) on NetUsedOutOfOrder against single-process training on
    every rank's batch; the reducer's layouts seen after each step."""
    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()
    torch.manual_seed(7)  # the same weights everywhere: the reference starts from them too
    ours = NetUsedOutOfOrder()
    ref = NetUsedOutOfOrder()
    ref.load_state_dict(ours.state_dict())
    opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    wrapped = ours.with_bagua([opt], GradientAllReduceAlgorithm())
    red = wrapped.bagua_ddp._engine._reducer
    seen = [(red.layout_generation, red.buckets_in_place, len(red.bucket_layout()))]
    for step in range(6):
        opt.zero_grad(set_to_none=a["set_to_none"])
        x, y = data(r, step)
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()
        seen.append((red.layout_generation, red.buckets_in_place, len(red.bucket_layout())))
        ref_opt.zero_grad()
        for q in range(n):
            x, y = data(q, step)
            (torch.nn.functional.mse_loss(ref(x), y) / n).backward()
        ref_opt.step()
    at_layout = [p.grad.data_ptr() == p._bagua_grad_view.data_ptr() for p in ours.parameters()]
    return {"seen": seen, "final": flat(ours), "reference": flat(ref), "at_layout": at_layout,
            "layout": wrapped.bagua_ddp.bucket_layout()}


class NetWithUnused(Net):
    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Linear(4, 4)


def _steps(model, opt, r, n, offset=0):
    for step in range(n):
        opt.zero_grad()
        x, y = data(r, step + offset)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@worker
def features(a):
    """find_unused_parameters, _bagua_params_and_buffers_to_ignore, algorithm switch."""
    _init()
    r = bagua.get_rank()
    out = {}
    # An unused layer: with find_unused_parameters it gets a zero gradient; without, the
    # backward fails with the parameter's name.
    torch.manual_seed(r)
    m = NetWithUnused()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    w = DistributedDataParallel(m, optimizers=[opt], algorithm=GradientAllReduceAlgorithm(),
                                find_unused_parameters=True)
    before = m.unused.weight.detach().clone()
    _steps(w, opt, r, 3)
    out["unused_unchanged"] = torch.equal(before, m.unused.weight)
    out["unused_final"] = flat(m)
    w.close()
    torch.manual_seed(r)
    m = NetWithUnused()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    w = DistributedDataParallel(m, optimizers=[opt], algorithm=GradientAllReduceAlgorithm())
    try:
        _steps(w, opt, r, 1)
        out["unused_error"] = ""
    except RuntimeError as e:
        out["unused_error"] = str(e)
    # The failure aborted the group (so no rank hangs): start a fresh one.
    bagua.destroy_process_group()
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 7)
    return out


@worker
def features2(a):
    _init()
    r = bagua.get_rank()
    out = {}
    # Ignored parameter: neither broadcast nor averaged.
    torch.manual_seed(r)
    m = Net()
    m._bagua_params_and_buffers_to_ignore = ["fc1.weight"]
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    m.with_bagua([opt], GradientAllReduceAlgorithm())
    _steps(m, opt, r, 3)
    out["ignored_fc1"] = m.fc1.weight.detach().clone()
    out["ignored_rest"] = torch.cat([p.detach().reshape(-1) for n, p in m.named_parameters()
                                     if n != "fc1.weight"])
    # Algorithm switch on one model (Bagua's test_model_switch).
    torch.manual_seed(r)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for k, algo in enumerate([ByteGradAlgorithm(hierarchical=False),
                              DecentralizedAlgorithm(hierarchical=False),
                              LowPrecisionDecentralizedAlgorithm(hierarchical=False),
                              GradientAllReduceAlgorithm()]):
        m.with_bagua([opt], algo)
        _steps(m, opt, r, 3, offset=10 * k)
    out["switch_final"] = flat(m)
    # Bagua's test_model_switch as written: a new DistributedDataParallel on the same module per
    # algorithm, in its order (async before low-precision decentralized, whose wrap lays the
    # weights out anew: the async wrapper must be closed by then, or its hooks rebuild it).
    torch.manual_seed(r)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    wrappers = []
    for k, name in enumerate(["bytegrad", "decentralized", "gradient_allreduce", "qadam",
                              "async", "low_prec_decentralized"]):
        o = opt
        if name == "bytegrad":
            algo = ByteGradAlgorithm(hierarchical=False)
        elif name == "decentralized":
            algo = DecentralizedAlgorithm(hierarchical=False)
        elif name == "gradient_allreduce":
            algo = GradientAllReduceAlgorithm()
        elif name == "qadam":
            o = QAdamOptimizer(m.parameters(), warmup_steps=2)
            algo = QAdamAlgorithm(o, hierarchical=False)
        elif name == "async":
            algo = AsyncModelAverageAlgorithm(sync_interval_ms=20)
        else:
            algo = LowPrecisionDecentralizedAlgorithm(hierarchical=False)
        w = DistributedDataParallel(m, optimizers=[o], algorithm=algo)
        wrappers.append(w)  # kept alive on purpose: only the newest may act
        if name == "async":
            w.bagua_algorithm.resume(w)
        _steps(w, o, r, 4, offset=10 * k)
        if name == "async":
            w.bagua_algorithm.abort(w)
    out["switch_ddp_final"] = flat(m)
    out["switch_ddp_closed"] = [w.inner._closed for w in wrappers]
    return out


# ---- drop-in Bagua: user-written algorithms, fuse_optimizer after with_bagua, wrapper names ----


class TutorialGradientAllReduceImpl(bagua.algorithms.AlgorithmImpl):
    """A user-written algorithm in the shape of Bagua's tutorial: Bagua's default tensors
    (gradients) and hooks, one centralized all-reduce per bucket (or a Python op doing it)."""

    def __init__(self, process_group, python_op=False):
        super().__init__(process_group)
        self.python_op = python_op
        self.ops_run = 0

    def init_operations(self, bagua_ddp, bucket):
        bucket.clear_ops()
        if not self.python_op:
            bucket.append_centralized_synchronous_op(hierarchical=False, average=True,
                                                     group=self.process_group)
            return

        def op(name):
            self.ops_run += 1
            flat = bucket.flattened_tensor()
            bagua.allreduce_inplace(flat, bagua.ReduceOp.AVG,
                                    comm=self.process_group.get_global_communicator())
            off = 0
            for t in bucket.tensors:
                g = t.bagua_getter_closure()
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()

        bucket.append_python_op(op, group=self.process_group)


class UserDecentralizedImpl(bagua.algorithms.AlgorithmImpl):
    """A user-written decentralized SGD ('all' peers) in the shape of Bagua's own
    DecentralizedAlgorithmImpl: weights are the Bagua tensors, marked ready before the forward,
    averaged into a peer weight, copied back after backward; one bucket."""

    def init_tensors(self, bagua_ddp):
        self.tensors = [p.ensure_bagua_tensor(name, bagua_ddp.bagua_module_name)
                        for name, p in reversed(bagua_ddp.bagua_build_params())]
        return self.tensors

    def tensors_to_buckets(self, tensors, do_flatten):
        from bagua.torch_api.bucket import BaguaBucket

        return [BaguaBucket([t for b in tensors for t in b], flatten=do_flatten, name="0")]

    def init_forward_pre_hook(self, bagua_ddp):
        def hook(input):
            for t in self.tensors:
                t.bagua_mark_communication_ready()
        return hook

    def init_backward_hook(self, bagua_ddp):
        return lambda name, param: None

    def init_post_backward_hook(self, bagua_ddp):
        def hook():
            bagua_ddp._bagua_backend.wait_pending_comm_ops()
            for bucket in bagua_ddp.bagua_buckets:
                bucket._decentralized_op.copy_back_peer_weight(bucket.backend_bucket)
        return hook

    def init_operations(self, bagua_ddp, bucket):
        bucket._peer_weight = bucket.flattened_tensor().ensure_bagua_tensor("peer_weight")
        bucket.clear_ops()
        bucket._decentralized_op = bucket.append_decentralized_synchronous_op(
            peer_weight=bucket._peer_weight, hierarchical=False, peer_selection_mode="all",
            group=self.process_group)


class UserDecentralized(bagua.algorithms.Algorithm):
    def reify(self, process_group):
        return UserDecentralizedImpl(process_group)


class TutorialGradientAllReduce(bagua.algorithms.Algorithm):
    def __init__(self, python_op=False):
        self.python_op = python_op

    def reify(self, process_group):
        return TutorialGradientAllReduceImpl(process_group, self.python_op)


def _train_sgd(model, opt, r, steps, fused=False, start=0, device=None):
    losses = []
    for step in range(start, start + steps):
        x, y = data(r, step)
        if device is not None:
            x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        (opt.fuse_step() if fused else opt.step())
        losses.append(loss.item())
    return losses


@worker
def dropin(a):
    """Scenarios of the drop-in issue (17), each against the single-process reference."""
    from bagua.torch_api.contrib import fuse_optimizer
    from bagua.torch_api.data_parallel.distributed import DistributedDataParallel_V1_9_0

    _init()
    r = bagua.get_rank()
    lr, steps = 0.05, 6
    out = {}

    def fresh():
        torch.manual_seed(r)  # different weights per rank: the wrap broadcasts rank 0's
        m = Net()
        return m, torch.optim.SGD(m.parameters(), lr=lr)

    # 1. A user-written algorithm (centralized op, then a Python op), with_bagua.
    for key, python_op in (("user_algo", False), ("user_algo_pyop", True)):
        m, opt = fresh()
        algo = TutorialGradientAllReduce(python_op)
        m = m.with_bagua([opt], algo)
        init = flat(m)
        out[key + "_losses"] = _train_sgd(m, opt, r, steps)
        out[key] = {"init": init, "final": flat(m), "steps": m.bagua_train_step_counter,
                    "impl": type(m.bagua_algorithm).__name__,
                    "buckets": len(m.bagua_buckets),
                    "ops_run": m.bagua_algorithm.ops_run}
        m.bagua_ddp.close()

    # 1b. A user-written decentralized algorithm (weights as Bagua tensors, do_flatten on: the
    #     weights become one buffer) against the step-by-step simulation.
    m, opt = fresh()
    m = m.with_bagua([opt], UserDecentralized(), do_flatten=True)
    init = flat(m)
    _train_sgd(m, opt, r, 8)
    out["user_decentralized"] = {"init": init, "final": flat(m)}
    m.bagua_ddp.close()

    # 2. Bagua's documented order: with_bagua, then fuse_optimizer (which replaces p.data),
    #    with and without do_flatten; and p.data replaced by hand between steps.
    for key, do_flatten in (("fuse_after_wrap_flat", True), ("fuse_after_wrap_noflat", False)):
        m, opt = fresh()
        m = m.with_bagua([opt], GradientAllReduceAlgorithm(), do_flatten=do_flatten)
        init = flat(m)
        from bagua.torch_api.utils import check_contiguous

        grads = [p.grad for p in reversed(list(m.parameters()))]
        grads_adjacent = all(g is not None for g in grads) and check_contiguous(grads)
        before = [p.data_ptr() for p in m.parameters()]
        opt = fuse_optimizer(opt)
        moved = any(p.data_ptr() != b for p, b in zip(m.parameters(), before))
        _train_sgd(m, opt, r, steps // 2, fused=True)
        with torch.no_grad():
            for p in m.parameters():
                p.data = p.data.clone()  # freed below the reducer unless it rebinds
        import gc
        gc.collect()
        _train_sgd(m, opt, r, steps - steps // 2, start=steps // 2)
        out[key] = {"init": init, "final": flat(m), "moved": moved,
                    "grads_adjacent": grads_adjacent,
                    "fused_count": opt._bagua_fused_count}
        m.bagua_ddp.close()

    # 2b. Buffers: with_bagua never broadcasts them (Bagua's behaviour); the DDP wrapper with
    #     broadcast_buffers=True does, before each training forward (torch DDP's).
    for key in ("buffers_with_bagua", "buffers_ddp"):
        m, opt = fresh()
        m.register_buffer("tag", torch.full((3,), float(r)))
        if key == "buffers_with_bagua":
            w = m.with_bagua([opt], GradientAllReduceAlgorithm())
        else:
            w = DistributedDataParallel(m, optimizers=[opt], algorithm=GradientAllReduceAlgorithm())
        _train_sgd(w, opt, r, 1)
        out[key] = m.tag.clone()
        if key == "buffers_ddp":  # .double(): new buffer objects, still broadcast
            with torch.no_grad():
                m.tag.fill_(float(r + 10))
            w.double()
            x, y = data(r, 1)
            opt.zero_grad()
            torch.nn.functional.mse_loss(w(x.double()), y.double()).backward()
            opt.step()
            out["buffers_ddp_double"] = m.tag.clone()
        (w.bagua_ddp if key == "buffers_with_bagua" else w).close()

    # 2c. The model's dtype changed after the wrap (.double()): the reducer rebinds to the new
    #     float64 memory.
    m, opt = fresh()
    m = m.with_bagua([opt], GradientAllReduceAlgorithm())
    init = flat(m)
    m.double()
    for step in range(3):
        x, y = data(r, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x.double()), y.double()).backward()
        opt.step()
    out["double_after_wrap"] = {"init": init, "final": flat(m),
                                "dtype": str(next(m.parameters()).dtype)}
    m.bagua_ddp.close()

    # 3. A parameter changing shape after the wrap is named in the error.
    m, opt = fresh()
    m = m.with_bagua([opt], GradientAllReduceAlgorithm())
    m.fc1.weight.data = torch.zeros(3, 3)
    try:
        m(data(r, 0)[0][:, :3])
        out["reshape_error"] = ""
    except RuntimeError as e:
        out["reshape_error"] = str(e)
    m.bagua_ddp.close()

    # 4. Wrapper names: bagua_module_name, bagua_buckets, .inner, require_backward_grad_sync,
    #    parameters_to_ignore, bagua_build_params (find_unused_parameters), DDP V1_9_0.
    m, opt = fresh()
    m._bagua_params_and_buffers_to_ignore = ["fc3.weight"]
    d = DistributedDataParallel_V1_9_0(m, optimizers=[opt], find_unused_parameters=True)
    names = {"module_name": d.module.bagua_module_name, "inner": type(d.inner).__name__,
             "ignore": d.parameters_to_ignore,
             "build": [nm for nm, _ in d.inner.bagua_build_params()],
             "buckets": [[t.bagua_tensor_name for t in b.tensors] for b in d.bagua_buckets]}
    x, y = data(r, 0)
    d.require_backward_grad_sync = False
    opt.zero_grad()
    torch.nn.functional.mse_loss(d(x), y).backward()
    names["local_grad"] = m.fc1.weight.grad.detach().clone()
    d.require_backward_grad_sync = True
    opt.zero_grad()
    torch.nn.functional.mse_loss(d(x), y).backward()
    names["synced_grad"] = m.fc1.weight.grad.detach().clone()
    names["unwrap"] = type(d.module).__name__
    out["names"] = names
    d.close()
    return out


@worker
def syncbn(a):
    """SyncBatchNorm on CPU: outputs, running statistics and gradients of each rank's part,
    plus (rank 0) plain BatchNorm on the concatenated batch."""
    from bagua.torch_api.contrib.sync_batchnorm import SyncBatchNorm

    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()

    def inputs(k):
        g = torch.Generator().manual_seed(50 + k)
        return torch.randn(4, 3, 5, generator=g) * (k + 1) + k, torch.randn(4, 3, 5, generator=g)

    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    model = SyncBatchNorm.convert_sync_batchnorm(model)
    bn = model[0]
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    x, w = inputs(r)
    x.requires_grad_()
    outs = []
    for _ in range(2):  # two steps: running statistics move twice
        y = model(x)
        (y * w).sum().backward()
        outs.append(y.detach().clone())
    out = {"type": type(bn).__name__, "y": outs[-1], "rm": bn.running_mean.clone(),
           "rv": bn.running_var.clone(), "gx": x.grad.clone(), "gw": bn.weight.grad.clone(),
           "gb": bn.bias.grad.clone(), "batches": int(bn.num_batches_tracked)}
    if r == 0:
        ref = torch.nn.BatchNorm1d(3)
        with torch.no_grad():
            ref.weight.copy_(bn.weight)
            ref.bias.copy_(bn.bias)
        parts = [inputs(k) for k in range(n)]
        xs = torch.cat([p[0] for p in parts]).requires_grad_()
        ws = torch.cat([p[1] for p in parts])
        for _ in range(2):
            y = ref(xs)
            (y * ws).sum().backward()
        out["ref"] = {"y": y.detach(), "rm": ref.running_mean.clone(),
                      "rv": ref.running_var.clone(), "gx": xs.grad.clone(),
                      "gw": ref.weight.grad.clone(), "gb": ref.bias.grad.clone()}
    model.eval()
    out["eval"] = model(x.detach())
    return out


@worker
def broadcast_state(a):
    """Bagua's test_broadcast_state (both copies: with_bagua and the DDP wrapper), whose own
    code calls inspect.getargspec (gone in Python 3.11): each rank trains alone first (5 x 10
    steps from its own seed), then the wrap makes every rank take rank 0's model and optimizer
    state. Bagua's optimizers and hyper-parameters, filtered by each optimizer's signature."""
    import inspect

    _init()
    r = bagua.get_rank()
    out = {}
    hypers = [dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2)]
    for wrapper in ("with_bagua", "ddp"):
        for cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.Rprop):
            for k, hp in enumerate(hypers):
                args = inspect.signature(cls.__init__).parameters
                torch.manual_seed(r)
                m = Net()
                opt = cls(m.parameters(), **{n: v for n, v in hp.items() if n in args})
                for step in range(50):
                    x, y = data(r, 50 + step)
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(m(x), y).backward()
                    opt.step()
                before = flat(m)
                algo = GradientAllReduceAlgorithm(hierarchical=True)
                if wrapper == "with_bagua":
                    w = m.with_bagua([opt], algo)
                else:
                    w = DistributedDataParallel(m, optimizers=[opt], algorithm=algo)
                sd = opt.state_dict()
                state = [(pid, name, v.clone() if torch.is_tensor(v) else v)
                         for pid, st in sorted(sd["state"].items())
                         for name, v in sorted(st.items())]
                out["{}_{}_{}".format(wrapper, cls.__name__, k)] = {
                    "before": before, "after": flat(m),
                    "model": [(n, t.clone()) for n, t in sorted(w.state_dict().items())],
                    "optim": state}
                (w.bagua_ddp if wrapper == "with_bagua" else w).close()
    return out


@worker
def store_init(a):
    """init_process_group(store=..., rank=, world_size=, local_world_size=) with a store the
    script made (Bagua's contract), then a collective and torch.distributed."""
    import datetime
    import torch.distributed as dist

    r = int(os.environ.pop("RANK"))
    w = int(os.environ.pop("WORLD_SIZE"))
    os.environ.pop("LOCAL_RANK")
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), w, r == 0,
                          datetime.timedelta(seconds=60))
    bagua.init_process_group(store=store, rank=r, world_size=w, local_world_size=w)
    t = torch.tensor([float(r + 1)])
    bagua.allreduce_inplace(t)
    x = torch.tensor([float(r)])
    dist.all_reduce(x)
    out = {"sum": t.item(), "dist_sum": x.item(), "rank": bagua.get_rank(),
           "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"])}
    try:
        bagua.init_process_group()
        out["second_init"] = ""
    except RuntimeError as e:
        out["second_init"] = str(e)
    return out


# Bagua's tests/contrib/test_fused_optimizer.py: its model, groups, data and optimizer list.
FUSE_OPTIMIZERS = [
    ("SGD", dict(lr=0.2, momentum=1, dampening=0, weight_decay=1, nesterov=True)),
    ("SGD", dict(lr=0.2, momentum=1, dampening=0.5, weight_decay=1, nesterov=False)),
    ("Adam", dict(weight_decay=1.0, amsgrad=True)),
    ("Adam", dict(weight_decay=1.0, amsgrad=False)),
    ("Adam", dict(weight_decay=0.0, amsgrad=True)),
    ("Adam", dict(weight_decay=0.0, amsgrad=False)),
    ("AdamW", dict(weight_decay=1.0, amsgrad=True)),
    ("AdamW", dict(weight_decay=1.0, amsgrad=False)),
    ("AdamW", dict(weight_decay=0.0, amsgrad=True)),
    ("AdamW", dict(weight_decay=0.0, amsgrad=False)),
    ("RMSprop", dict(weight_decay=1, momentum=1, centered=True)),
    ("RMSprop", dict(weight_decay=1, momentum=0, centered=True)),
    ("RMSprop", dict(weight_decay=1, momentum=1, centered=False)),
    ("RMSprop", dict(weight_decay=0, momentum=1, centered=False)),
    ("Rprop", dict(lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50))),
    ("ASGD", dict(weight_decay=0)),
    ("ASGD", dict(weight_decay=1)),
    ("Adamax", dict(weight_decay=0)),
    ("Adamax", dict(weight_decay=1)),
    ("Adadelta", dict(weight_decay=0)),
    ("Adadelta", dict(weight_decay=1)),
]


def _fuse_model(name, kw):
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sigmoid(),
                                torch.nn.Linear(3, 1), torch.nn.Sigmoid())
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[-0.2109, -0.4976], [-0.1413, -0.3420],
                                            [-0.2524, 0.6976]]))
        model[0].bias.copy_(torch.tensor([-0.1085, -0.2979, 0.6892]))
        model[2].weight.copy_(torch.tensor([[-0.0508, -0.3941, -0.2843]]))
        model[2].bias.copy_(torch.tensor([-0.0711]))
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if "bias" not in n], "weight_decay": 0.1},
              {"params": [p for n, p in named if "bias" in n], "weight_decay": 0.0}]
    return model, getattr(torch.optim, name)(groups, **kw)


def _fuse_train(model, opt, epochs, fused, set_to_none):
    x = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).reshape(3, 2)
    for epoch in range(epochs):
        opt.zero_grad(set_to_none=set_to_none)
        model(x).sum().backward()
        if fused and epoch % 2 == 0:
            opt.fuse_step()
        else:
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


@worker
def fuse_bagua(a):
    """Bagua's fused-optimizer cases with with_bagua: fuse_optimizer(do_flatten=F1), then
    with_bagua(do_flatten=F2), training with fuse_step every other step; the final weights
    against the unwrapped, unfused run and the fused count, for both zero_grad modes (torch 2's
    default set_to_none=True drops the gradients every step)."""
    from bagua.torch_api.contrib import fuse_optimizer

    _init()
    epochs = a["epochs"]
    algos = {"gradient_allreduce": lambda: GradientAllReduceAlgorithm(),
             "decentralized": lambda: DecentralizedAlgorithm(hierarchical=False),
             "bytegrad": lambda: ByteGradAlgorithm()}
    out = {}
    for none in (False, True):
        for k, (name, kw) in enumerate(FUSE_OPTIMIZERS):
            ref = _fuse_train(*_fuse_model(name, kw), epochs, False, none)
            for algo, make in algos.items():
                if algo == "bytegrad":  # compressed: against an unfused bytegrad wrap
                    m, o = _fuse_model(name, kw)
                    m = m.with_bagua([o], make())
                    ref_algo = _fuse_train(m, o, epochs, False, none)
                    m.bagua_ddp.close()
                for f1, f2 in ((True, False), (True, True), (False, True)):
                    if algo == "bytegrad" and (f1, f2) != (True, False):
                        continue  # Bagua checks only this one
                    m, o = _fuse_model(name, kw)
                    o = fuse_optimizer(o, do_flatten=f1)
                    m = m.with_bagua([o], make(), do_flatten=f2)
                    got = _fuse_train(m, o, epochs, True, none)
                    want = ref_algo if algo == "bytegrad" else ref
                    out[(none, k, algo, f1, f2)] = (
                        all(torch.equal(x, y) for x, y in zip(got, want)), o._bagua_fused_count)
                    m.bagua_ddp.close()
    return out


def reference(init, world, steps, lr, algorithm):
    """Single process on the concatenated batch (the mean of the per-rank mean losses)."""
    model = Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(init.clone(), model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        xs, ys = zip(*[data(r, step) for r in range(world)])
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        opt.step()
    return flat(model)


def _default_group_ops():
    """Operations run so far by this rank on the default group's global and intra-node
    communicators (host, then nccl), once every earlier host operation has finished (a barrier:
    the host queue runs in order)."""
    bagua.barrier()
    c = bagua.communication._get_default_group().get_global_communicator()
    out = []
    for g in (c._host, c._nccl):
        if g is not None:  # every rank runs the global and intra-node ones (inter: leaders only)
            by = g.stats()["operations_by_communicator"]
            out += [by["global"], by["intra"]]
    return out


@worker
def drop_unevenly(a):
    """A wrapped model dropped at a different moment on each rank (user code holding it longer
    on one rank; until b2afda1 also any wrap, freed by Python's garbage collector because it sat
    in reference cycles), while the ranks go on training another model. Rank 0 keeps each old
    model until the end; the others free theirs at once. On NCCL, freeing one frees its
    algorithm's communicators (decentralized exchanges on a process group of its own), and
    NCCL's ncclCommDestroy waits until the peers on the host destroy theirs too: before the fix,
    rank 1 blocked in gc.collect() while rank 0 waited for it in the next model's collectives.
    Returns each new model's losses and the seconds each phase took."""
    import gc

    _init()
    r = bagua.get_rank()
    dev = _device(a)

    def wrap(name, kwargs):
        torch.manual_seed(0)
        model = Net().to(dev)
        algo, opt = make_algorithm(name, kwargs, model, 0.05)
        return model.with_bagua([opt], algo), opt

    kept, out = [], {"losses": [], "seconds": []}
    for name in a.get("algorithms", ["decentralized"]):
        wrapped, opt = wrap(name, {"hierarchical": False})
        _train_sgd(wrapped, opt, r, 3, device=dev)
        if r == 0:
            kept.append((wrapped, opt))
        t = time.monotonic()
        del wrapped, opt
        gc.collect()  # rank 0 still holds it: nothing freed there
        wrapped, opt = wrap("gradient_allreduce", {})
        out["losses"].append(_train_sgd(wrapped, opt, r, 3, device=dev))
        out["seconds"].append(time.monotonic() - t)
        del wrapped, opt
        gc.collect()
    kept.clear()
    gc.collect()  # now rank 0 frees the old ones
    bagua.barrier()
    return out


def _holders(obj, depth=3):
    """Who keeps ``obj`` alive, as readable chains (gc referrers, ``depth`` levels up): what a
    failing lifetime test prints instead of a bare True."""
    import gc
    import types

    def describe(o):
        if isinstance(o, types.FrameType):
            return "frame {}:{}".format(o.f_code.co_filename.rsplit("/", 1)[-1], o.f_code.co_name)
        if isinstance(o, types.FunctionType):
            return "function " + o.__qualname__
        if isinstance(o, types.MethodType):
            return "method " + getattr(o.__func__, "__qualname__", "?")
        if isinstance(o, dict):
            return "dict keys {}".format(sorted(map(str, o))[:8])
        if isinstance(o, (list, tuple)):
            return "{} of {}".format(type(o).__name__, len(o))
        return type(o).__module__ + "." + type(o).__qualname__

    seen = {id(obj)}  # ids of what was walked, and of this function's own lists
    chains = []

    def walk(o, path, level):
        refs = gc.get_referrers(o)
        seen.add(id(refs))
        found = False
        for r in refs:
            if id(r) in seen or isinstance(r, types.FrameType) and r.f_code.co_name in (
                    "walk", "_holders") or type(r).__name__ == "list_iterator":
                continue
            found = True
            step = path + [describe(r)]
            seen.add(id(step))
            if level + 1 >= depth or not gc.is_tracked(r):
                chains.append(" <- ".join(step))
            else:
                seen.add(id(r))
                walk(r, step, level + 1)
        if not found:
            chains.append(" <- ".join(path) + " <- (nothing else: a cycle, or untracked)")

    walk(obj, [describe(obj)], 0)
    return chains[:12]


@worker
def device_choice(a):
    """CUDA, 2 GPUs: the device init selected; a model on the other GPU is refused with a clear
    error (it crashed NCCL with an illegal memory access), one on the group's device trains."""
    _init()
    r = bagua.get_rank()
    out = {"device": torch.cuda.current_device()}
    torch.manual_seed(0)
    wrong = torch.device("cuda", 1 - out["device"])
    model = Net().to(wrong)
    try:
        model.with_bagua([torch.optim.SGD(model.parameters(), lr=0.05)],
                         GradientAllReduceAlgorithm())
        out["wrong"] = "accepted"
    except RuntimeError as e:
        out["wrong"] = str(e)
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    wrapped = model.with_bagua([opt], GradientAllReduceAlgorithm())
    out["losses"] = _train_sgd(wrapped, opt, r, 3, device=torch.device("cuda"))
    out["weights"] = flat(model).tolist()
    return out


@worker
def freed_by_refcount(a):
    """Each way of wrapping, trained 3 steps (with a torch LR scheduler made after the wrap, as
    in Bagua's examples), then dropped with the garbage collector off: which of (module,
    optimizer, wrapper) outlived the drop. Before the wrapper held its module weakly, every one
    did (reference cycles: freed, with the reducer and its process groups, only when the
    collector ran, at a different moment on each rank)."""
    import gc
    import weakref

    _init()
    r = bagua.get_rank()
    out = {}
    # torch's own one-time work on a process's first optimizer is not the wrap's: on torch 2.11
    # the first SGD stayed alive through the frames of a caught exception (torch/_compile.py's
    # inner wrapper and SGD.__init__, found by the holder report on the GPU machine).
    warm = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(warm.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    warm(torch.ones(1, 2)).sum().backward()
    opt.step()
    sched.step()
    del warm, opt, sched
    gc.collect()
    gc.disable()
    try:
        for kind in ("with_bagua", "ddp_wrapper", "decentralized", "qadam", "user_algorithm"):
            torch.manual_seed(0)
            model = Net()
            if kind == "qadam":
                opt = QAdamOptimizer(model.parameters(), lr=0.01, warmup_steps=2)
                algo = QAdamAlgorithm(opt, hierarchical=False)
            else:
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
                algo = (DecentralizedAlgorithm(hierarchical=False) if kind == "decentralized"
                        else TutorialGradientAllReduce() if kind == "user_algorithm"
                        else GradientAllReduceAlgorithm())
            if kind == "ddp_wrapper":
                wrapped = DistributedDataParallel(model, optimizers=[opt], algorithm=algo)
                inner = wrapped.inner
            else:
                wrapped = model.with_bagua([opt], algo)
                inner = wrapped.bagua_ddp
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            for step in range(3):
                opt.zero_grad()
                x, y = data(r, step)
                torch.nn.functional.mse_loss(wrapped(x), y).backward()
                opt.step()
                sched.step()
            refs = [weakref.ref(o) for o in (model, opt, inner)]
            lr = opt.param_groups[0]["lr"]
            del model, opt, algo, wrapped, inner, sched
            alive = [ref() is not None for ref in refs]
            out[kind] = {"alive": alive, "lr": lr,
                         "held_by": [_holders(ref()) for ref in refs if ref() is not None]}
    finally:
        gc.enable()
    return out


@worker
def bundle(a):
    """Several scenarios in one process group (one launch: torch's import dominates). After each
    training scenario every rank must have run as many operations on the default group as the
    others (a rank with one collective more or less pairs the later ones wrongly: a hang, or a
    barrier that passes on one rank only); each rank's progress goes to stderr (shown when a
    test fails)."""
    out = {}
    what = "operations on the default group (host global, intra; nccl global, intra)"
    t0, before = time.monotonic(), None
    for name, item in a["items"].items():
        out[name] = WORKERS[item["func"]](item.get("args", {}))
        if not bagua.is_initialized() or bagua.get_world_size() < 2:
            continue
        now = _default_group_ops()
        # The first scenario's count includes the init's.
        ran = [x - y for x, y in zip(now, before or [0] * len(now))]
        print("[rank {}] {:.1f} s: {} done, {} {}".format(
            bagua.get_rank(), time.monotonic() - t0, name, what, ran), file=sys.stderr, flush=True)
        every = bagua.communication.allgather_object(ran)
        before = _default_group_ops()  # the allgather itself left out
        if item["func"] == "train" and any(r != every[0] for r in every):
            raise AssertionError("{}: the ranks ran different numbers of {}: {}".format(
                name, what, every))
    return out


@worker
def launched(a):
    """comm_basic plus what the launcher gave this worker (Bagua's launchers' tests)."""
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                          "NODE_RANK", "BAGUA_DEFAULT_BUCKET_SIZE",
                                          "BAGUA_AUTOTUNE", "NCCL_NET_PLUGIN")}
    before = (bagua.get_rank(), bagua.get_local_rank(), bagua.get_world_size(),
              bagua.get_local_size())  # before init: from the launcher's variables
    out = comm_basic(a)
    out.update({"env": env, "before": before, "local_rank_arg": LOCAL_RANK_ARG})
    return out


LOCAL_RANK_ARG = None


def main():
    global LOCAL_RANK_ARG
    argv = sys.argv[1:]
    if argv and argv[0].startswith("--local_rank="):  # bagua.distributed.launch --set_additional_flag
        LOCAL_RANK_ARG = int(argv.pop(0).split("=", 1)[1])
    func, out, args = argv[0], argv[1], json.loads(argv[2])
    result = WORKERS[func](args)
    torch.save(result, os.path.join(out, "rank{}.pt".format(os.environ.get("RANK", "0"))))
    if bagua.is_initialized():
        bagua.barrier()


if __name__ == "__main__":
    main()
