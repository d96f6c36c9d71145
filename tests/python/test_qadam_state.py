"""QAdamOptimizer's state through the extension: exp_avg / exp_avg_sq after warm-up steps and the
set_state round trip, on CPU parameters and, on a machine with a GPU, on CUDA parameters of the
core optimizer (device m and v, read and written through readState / writeState)."""

import math

import pytest
import torch

from bagua.torch_api._ext import ext
from bagua.torch_api.algorithms import q_adam
from bagua.torch_api.communication import dtype_code

import worker_base

SHAPES = [(3, 5), (7,), (64, 33)]
BETAS = (0.9, 0.999)


def grads(step):
    # Index- and step-dependent, so a state swapped between parameters or elements shows.
    out = []
    for k, shape in enumerate(SHAPES):
        n = 1
        for d in shape:
            n *= d
        g = (torch.arange(n, dtype=torch.float32) * (0.013 * (k + 1)) - 0.4 * k + 0.1 * step)
        out.append(g.reshape(shape))
    return out


def weights():
    return [torch.linspace(-1.0, 1.0, steps=torch.Size(s).numel(), dtype=torch.float32)
            .reshape(s) + k for k, s in enumerate(SHAPES)]


def bits(t):
    return t.contiguous().view(torch.int32)


def test_cpu_state_after_steps_and_round_trip():
    params = [torch.nn.Parameter(w) for w in weights()]
    opt = q_adam.QAdamOptimizer(params, lr=1e-2, warmup_steps=10, betas=BETAS)
    m = [torch.zeros(s) for s in SHAPES]
    v = [torch.zeros(s) for s in SHAPES]
    # Bagua's update (torch operations, Python-float constants), bit for bit.
    b1, b2 = BETAS
    for step in range(3):
        for p, g in zip(params, grads(step)):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads(step)):
            m[i].mul_(b1).add_(g, alpha=1 - b1)
            v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
    for i in range(len(SHAPES)):
        assert opt.exp_avg(i).shape == params[i].shape
        assert torch.equal(opt.exp_avg(i), m[i]), i
        assert torch.equal(opt.exp_avg_sq(i), v[i]), i
    # Written state reads back bit for bit, on the parameter it was written to only.
    before = [opt.exp_avg_sq(i).clone() for i in range(len(SHAPES))]
    pattern = torch.arange(SHAPES[2][0] * SHAPES[2][1], dtype=torch.float32) * 0.37 - 5.0
    opt._ext.set_state(2, False, pattern.numpy().tobytes())
    assert torch.equal(bits(opt.exp_avg(2)), bits(pattern.reshape(SHAPES[2])))
    for i in range(len(SHAPES)):
        assert torch.equal(bits(opt.exp_avg_sq(i)), bits(before[i])), i
    assert torch.allclose(opt.exp_avg(0), m[0], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="bytes for a parameter of 7 float32"):
        opt._ext.set_state(1, True, b"\0" * 12)
    with pytest.raises(IndexError):
        opt._ext.state(len(SHAPES), False)


def make_ext(tensors, device_type, device_index):
    specs = [("p{}".format(i), t.data_ptr(), 0, t.numel(), dtype_code(t.dtype), device_type,
              device_index, True) for i, t in enumerate(tensors)]
    return ext.QAdamOptimizer(specs, 1e-2, 2, BETAS[0], BETAS[1], 1e-8, 0.0)


def run_steps(opt, params, steps, first_step, device):
    keep = []  # the gradients must outlive the steps that read them
    for step in range(first_step, first_step + steps):
        gs = [g.to(device) for g in grads(step)]
        keep.append(gs)
        opt.set_pointers([(p.data_ptr(), g.data_ptr()) for p, g in zip(params, gs)])
        opt.step()
    if device != "cpu":
        torch.cuda.synchronize()


def test_cuda_state_equals_cpu_and_round_trip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch: the device QAdam state case runs on the "
                    "GPU machine")
    dev = torch.cuda.current_device()
    host = [w.clone() for w in weights()]
    gpu = [w.clone().cuda() for w in weights()]
    cpu_opt = make_ext(host, 0, 0)
    try:
        gpu_opt = make_ext(gpu, 1, dev)
    except RuntimeError as e:
        if "without CUDA" in str(e):
            pytest.skip("the extension was built without the CUDA kernels: " + str(e))
        raise
    # Warm-up (2 steps) then the compression stage's local step: both sides bit for bit.
    run_steps(cpu_opt, host, 4, 0, "cpu")
    run_steps(gpu_opt, gpu, 4, 0, "cuda")
    for i in range(len(SHAPES)):
        for second in (False, True):
            assert gpu_opt.state(i, second) == cpu_opt.state(i, second), (i, second)
        assert torch.equal(bits(gpu[i].cpu()), bits(host[i])), i
    # The same state written on both sides, then one more step: still equal, and the written
    # values were really used (the momentum differs from the unwritten run's).
    unwritten = gpu_opt.state(1, False)
    for i, s in enumerate(SHAPES):
        n = torch.Size(s).numel()
        m = (torch.arange(n, dtype=torch.float32) * 0.01 - 0.2 * i).numpy().tobytes()
        v = (torch.arange(n, dtype=torch.float32) * 1e-4 + 1e-3).numpy().tobytes()
        for opt in (cpu_opt, gpu_opt):
            opt.set_state(i, False, m)
            opt.set_state(i, True, v)
        assert gpu_opt.state(i, False) == m and gpu_opt.state(i, True) == v, i
    run_steps(cpu_opt, host, 1, 4, "cpu")
    run_steps(gpu_opt, gpu, 1, 4, "cuda")
    for i in range(len(SHAPES)):
        for second in (False, True):
            assert gpu_opt.state(i, second) == cpu_opt.state(i, second), (i, second)
        assert torch.equal(bits(gpu[i].cpu()), bits(host[i])), i
    assert gpu_opt.state(1, False) != unwritten


# ---- Bagua's QAdamOptimizer contract -------------------------------------------------------------


def _train(opt_cls, flags, steps, seed=13, groups=False, sched=None):
    torch.manual_seed(seed)
    model = worker_base.Net()  # Bagua's tests/torch_api/test_qadam.py model
    params = model.parameters()
    if groups:
        params = [{"params": [model.fc1.weight]},
                  {"params": [model.fc2.weight, model.fc2.bias], "lr": flags["lr"] / 2},
                  {"params": [model.fc3.weight], "weight_decay": 0.0}]
    opt = opt_cls(params, **flags)
    s = sched(opt) if sched else None
    for _ in range(steps):
        data, target = torch.randn(4, 2), torch.randn(4, 4)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        if s is not None:
            s.step()
    return model, opt, loss


def test_warmup_is_torch_adam_bit_for_bit():
    # Bagua's test_qadam: during the warm-up QAdam is torch.optim.Adam, loss for loss (exact).
    _, _, l1 = _train(torch.optim.Adam, {"lr": 0.001, "weight_decay": 0.1}, 300)
    _, _, l2 = _train(q_adam.QAdamOptimizer, {"lr": 0.001, "weight_decay": 0.1,
                                              "warmup_steps": 2000}, 300)
    assert l1.item() == l2.item()


def test_param_groups_and_lr_scheduler_are_honoured():
    # Per-group lr and weight_decay, and a scheduler changing param_group["lr"]: the same as
    # torch Adam with the same groups and scheduler, bit for bit, during the warm-up.
    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5)  # noqa: E731
    m1, _, _ = _train(torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}, 30, groups=True,
                      sched=sched)
    m2, opt, _ = _train(q_adam.QAdamOptimizer, {"lr": 0.01, "weight_decay": 0.1,
                                                "warmup_steps": 100}, 30, groups=True,
                        sched=sched)
    # torch >= 2.0's Adam updates exp_avg with lerp_ (Bagua's QAdam, as torch 1.x's Adam, with
    # mul_ + add_), so the two agree to rounding there and bit for bit only on torch 1.x.
    exact = int(torch.__version__.split(".")[0]) < 2
    for a, b in zip(m1.parameters(), m2.parameters()):
        if exact:
            assert torch.equal(a, b)
        else:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()
    assert opt.param_groups[1]["lr"] == 0.005 * 0.5 ** 6


def _bagua_reference(params, grads_per_step, lr, warmup, betas, eps, wd, hold=False):
    """Bagua's update, written out: m and v only in the warm-up, then frozen v."""
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2 = betas
    for t, grads in enumerate(grads_per_step, start=1):
        for i, (p, g) in enumerate(zip(params, grads)):
            g = g.add(p, alpha=wd) if wd else g
            if t < warmup:
                m[i].mul_(b1).add_(g, alpha=1 - b1)
                v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v[i].sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
            upd = m[i] * (v[i] != 0) if hold and t >= warmup else m[i]
            p.addcdiv_(upd, denom, value=-lr / (1 - b1 ** t))
    return params, m, v


@pytest.mark.parametrize("hold", [False, True])
def test_compression_stage_update_and_state_dict(hold):
    # Single process: after the warm-up the optimizer alone keeps m (the algorithm would mix and
    # average it) and freezes v; the update is Bagua's bit for bit. m and v are in state_dict()
    # and load back.
    ws = weights()
    ws[0][0, 0] = 0.0
    params = [torch.nn.Parameter(w.clone()) for w in ws]
    opt = q_adam.QAdamOptimizer(params, lr=1e-2, warmup_steps=3, betas=BETAS, eps=1e-8,
                                weight_decay=0.01, hold_zero_variance=hold)
    steps = [grads(s) for s in range(6)]
    for s in steps:
        s[0][0, 0] = 0.0  # one element never gets a gradient: v stays 0
    for s in steps:
        for p, g in zip(params, s):
            p.grad = g.clone()
        opt.step()
    ref, m, v = _bagua_reference([w.clone() for w in ws], steps, 1e-2, 3, BETAS, 1e-8, 0.01,
                                 hold)
    for p, r in zip(params, ref):
        assert torch.equal(p.detach(), r), (p, r)
    sd = opt.state_dict()
    for i in range(len(SHAPES)):
        st = sd["state"][i]
        assert st["step"] == 6
        assert torch.equal(st["exp_avg"], m[i]) and torch.equal(st["exp_avg_sq"], v[i])
    # load_state_dict: a fresh optimizer continues exactly like the original.
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = q_adam.QAdamOptimizer(params2, lr=1e-2, warmup_steps=3, betas=BETAS, eps=1e-8,
                                 weight_decay=0.01, hold_zero_variance=hold)
    opt2.load_state_dict(sd)
    assert opt2._ext.step_count == 6 and opt2.step_id == 6
    for p, p2, g in zip(params, params2, grads(9)):
        p.grad, p2.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    for p, p2 in zip(params, params2):
        assert torch.equal(p, p2)
    # The core holds the same m the state shows (the algorithm reads it there).
    for i in range(len(SHAPES)):
        core_m = torch.frombuffer(bytearray(opt2._ext.state(i, False)), dtype=torch.float32)
        assert torch.equal(core_m.view(SHAPES[i]), opt2.state[params2[i]]["exp_avg"])


def test_fuse_step_keeps_state_in_the_core():
    # fuse_optimizer + fuse_step on QAdam: bitwise the plain step, and m / v stay views of the
    # core's memory (what the qadam algorithm reads) after fused steps.
    from bagua.torch_api.contrib import fuse_optimizer

    def run(fused):
        params = [torch.nn.Parameter(w) for w in weights()]
        opt = q_adam.QAdamOptimizer(params, lr=1e-2, warmup_steps=4, betas=BETAS)
        if fused:
            opt = fuse_optimizer(opt)
        for step in range(6):
            for p, g in zip(params, grads(step)):
                p.grad = g.clone()
            opt.fuse_step() if fused else opt.step()
        return params, opt

    p1, _ = run(False)
    p2, opt = run(True)
    assert opt._bagua_fused_count > 0
    for a, b in zip(p1, p2):
        assert torch.equal(a, b)
    for i, p in enumerate(opt._order):
        assert opt.state[p]["exp_avg"].data_ptr() == opt._ext.state_ptr(i, False)
        assert opt.state[p]["exp_avg_sq"].data_ptr() == opt._ext.state_ptr(i, True)


def test_load_state_dict_keeps_or_replaces_the_core():
    # Loading a later step keeps the core object (a wrapped reducer keeps reading it); loading
    # an earlier one needs a new core (its step count only grows): the generation says so, and
    # the engine rebuilds on it.
    params = [torch.nn.Parameter(w) for w in weights()]
    opt = q_adam.QAdamOptimizer(params, lr=1e-2, warmup_steps=3, betas=BETAS)
    for step in range(2):
        for p, g in zip(params, grads(step)):
            p.grad = g.clone()
        opt.step()
    early = opt.state_dict()
    early = {"state": {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in st.items()}
                       for k, st in early["state"].items()}, "param_groups": early["param_groups"]}
    for step in range(2, 5):
        for p, g in zip(params, grads(step)):
            p.grad = g.clone()
        opt.step()
    later = opt.state_dict()
    gen, core = opt._generation, opt._ext
    opt.load_state_dict(later)
    assert opt._generation == gen and opt._ext is core and opt._ext.step_count == 5
    opt.load_state_dict(early)
    assert opt._generation == gen + 1 and opt._ext.step_count == 2
    for i, p in enumerate(params):
        assert torch.equal(opt.state[p]["exp_avg"], early["state"][i]["exp_avg"])
        assert opt.state[p]["exp_avg"].data_ptr() == opt._ext.state_ptr(i, False)


@pytest.mark.parametrize("hold", [False, True])
def test_python_update_agrees_with_the_core_step(hold):
    # QAdamOptimizer.step (the torch update; q_adam.py says why it is not the core's step) and
    # the core's QAdamOptimizer::step: warm-up (1 step) and the compression stage's local step,
    # weight decay on, three elements of each parameter at 0 with a gradient of exactly 0 in the
    # warm-up (frozen v = 0: what hold_zero_variance holds) and then a momentum (as the qadam
    # algorithm's would give them). The constants are exact in float32 (the core takes float32
    # hyperparameters, torch Python floats). m and v agree bit for bit; a parameter may differ in
    # its last bit: torch's addcdiv computes x + (value * m) / denom, the core
    # x + value * (m / denom).
    lr, betas, eps, wd = 2.0 ** -7, (1 - 2.0 ** -3, 1 - 2.0 ** -7), 2.0 ** -20, 2.0 ** -5

    def grad(step):
        out = grads(step)
        for g in out:
            g.view(-1)[:3] = 0.0
        return out

    def start():
        out = weights()
        for w in out:
            w.view(-1)[:3] = 0.0
        return out

    params = [torch.nn.Parameter(w) for w in start()]
    opt = q_adam.QAdamOptimizer(params, lr=lr, warmup_steps=2, betas=betas, eps=eps,
                                weight_decay=wd, hold_zero_variance=hold)
    host = start()
    specs = [("p{}".format(i), t.data_ptr(), 0, t.numel(), dtype_code(t.dtype), 0, 0, True)
             for i, t in enumerate(host)]
    core = ext.QAdamOptimizer(specs, lr, 2, betas[0], betas[1], eps, wd, hold)
    after_warmup = None
    for step in range(5):
        for p, g in zip(params, grad(step)):
            p.grad = g
        opt.step()
        gs = grad(step)
        core.set_pointers([(t.data_ptr(), g.data_ptr()) for t, g in zip(host, gs)])
        core.step()
        for i, (p, t) in enumerate(zip(params, host)):
            if step == 0:
                assert torch.equal(bits(p.detach()), bits(t)), i
            assert torch.allclose(p.detach(), t, rtol=1e-6, atol=0), (step, i)
            for second in (False, True):
                got = opt.exp_avg_sq(i) if second else opt.exp_avg(i)
                want = torch.frombuffer(bytearray(core.state(i, second)), dtype=torch.float32)
                assert torch.equal(bits(got.reshape(-1)), bits(want)), (step, i, second)
        if step == 0:
            after_warmup = [p.detach().view(-1)[:3].clone() for p in params]
            for i, p in enumerate(params):
                m = opt.state[p]["exp_avg"]
                m.view(-1)[:3] = 0.25
                core.set_state(i, False, m.reshape(-1).numpy().tobytes())
    for p, t, w in zip(params, host, after_warmup):
        assert torch.equal(opt.state[p]["exp_avg_sq"].view(-1)[:3], torch.zeros(3))
        # Held (both updates): the compression stage left the v = 0 elements alone; not held:
        # Bagua's update moved them (by lr / (1 - b1^t) * m / eps).
        assert torch.equal(p.detach().view(-1)[:3], w) == hold
        assert torch.equal(t.view(-1)[:3], w) == hold
