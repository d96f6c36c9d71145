"""Worker functions: Bagua's drop-in API (user-written algorithms, fuse_optimizer after
with_bagua, wrapper names, SyncBN, optimizer-state broadcast, fused optimizers; run through
workers.py)."""

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import (
    GradientAllReduceAlgorithm,
    ByteGradAlgorithm,
    DecentralizedAlgorithm,
)
from bagua.torch_api.data_parallel import DistributedDataParallel
from worker_base import Net, _init, _train_sgd, data, flat, worker


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
