"""Worker functions: training through the wrap, the algorithms, relayout and the features of the
wrapper, and freeing a wrap (run through workers.py)."""

import os
import time

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import (
    GradientAllReduceAlgorithm,
    ByteGradAlgorithm,
    DecentralizedAlgorithm,
    LowPrecisionDecentralizedAlgorithm,
    AsyncModelAverageAlgorithm,
)
from bagua.torch_api.algorithms.q_adam import QAdamAlgorithm, QAdamOptimizer
from bagua.torch_api.data_parallel import DistributedDataParallel
from worker_base import (Net, _device, _init, _train_sgd, data, flat, make_algorithm,
                         reference, worker)
from workers_dropin import TutorialGradientAllReduce


@worker
def train(a):
    """Trains Net with an algorithm; returns losses and final weights (and, on rank 0, the
    single-process reference on the concatenated batches when asked)."""
    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()
    dev = _device(a)
    from bagua.torch_api.data_parallel.engine_options import EngineOptions

    options = EngineOptions(autotune=True if a.get("autotune") else None,
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


def _steps(model, opt, r, n, offset=0, set_to_none=False):
    for step in range(n):
        opt.zero_grad(set_to_none=set_to_none)
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
        # Gradients set to None, torch 2's zero_grad default: the unused layer has none at all.
        _steps(w, opt, r, 1, set_to_none=True)
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
