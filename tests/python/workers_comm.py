"""Worker functions: collectives and process-group set-up (run through workers.py)."""

import os

import torch

import bagua.torch_api as bagua
from worker_base import _init, worker


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
