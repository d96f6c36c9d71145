"""Worker functions run by harness.run in separate processes (one per rank)."""

import json
import os
import sys

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


def flat(model):
    return torch.cat([p.detach().reshape(-1).cpu().clone() for p in model.parameters()])


def make_algorithm(name, kwargs, model, lr):
    if name == "qadam":
        opt = QAdamOptimizer(model.parameters(), lr=lr, **kwargs.get("opt", {}))
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
    sd = [sum(sc[:j]) for j in range(n)]
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
    dev = torch.device(a.get("device", "cpu"))
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
        from bagua.torch_api.data_parallel import bagua_distributed
        bagua_distributed.CUDA_REDUCER = a.get("cuda_reducer", "core")
    torch.manual_seed(r)  # different initial weights per rank: the wrap must broadcast rank 0's
    model = Net().to(dev)
    init = None
    lr = a.get("lr", 0.05)
    algo, opt = make_algorithm(a["algorithm"], a.get("kwargs", {}), model, lr)
    if a.get("wrapper") == "ddp":
        wrapped = DistributedDataParallel(model, optimizers=[opt], algorithm=algo,
                                          find_unused_parameters=a.get("find_unused", False))
        ctx = wrapped.no_sync
    else:
        wrapped = model.with_bagua([opt], algo, do_flatten=a.get("do_flatten", True))
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
    if a["algorithm"] == "async":
        algo.abort(model)
        algo.abort(model)  # a second abort is a no-op
        out["rounds"] = algo.rounds()
        out["final"] = flat(model)
    if a["algorithm"] == "low_precision_decentralized" and dev.type == "cpu":
        reps = algo.replicas()
        out["replicas"] = {k: torch.tensor(v) for k, v in reps.items()}
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


@worker
def bundle(a):
    """Several scenarios in one process group (one launch: torch's import dominates)."""
    return {name: WORKERS[item["func"]](item.get("args", {})) for name, item in a["items"].items()}


def main():
    func, out, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    result = WORKERS[func](args)
    torch.save(result, os.path.join(out, "rank{}.pt".format(os.environ.get("RANK", "0"))))
    if bagua.is_initialized():
        bagua.barrier()


if __name__ == "__main__":
    main()
