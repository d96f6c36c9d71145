"""QAdamOptimizer's state through the extension: exp_avg / exp_avg_sq after warm-up steps and the
set_state round trip, on CPU parameters and, on a machine with a GPU, on CUDA parameters of the
core optimizer (device m and v, read and written through readState / writeState)."""

import pytest
import torch

from bagua.torch_api._ext import ext
from bagua.torch_api.algorithms import q_adam
from bagua.torch_api.communication import dtype_code

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
    # The core's constants are float32: beta and 1 - beta computed in float32.
    b1, b2 = (torch.tensor(b, dtype=torch.float32) for b in BETAS)
    one = torch.tensor(1.0, dtype=torch.float32)
    for step in range(3):
        for p, g in zip(params, grads(step)):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads(step)):
            m[i] = b1 * m[i] + (one - b1) * g
            v[i] = b2 * v[i] + (one - b2) * g * g
    for i in range(len(SHAPES)):
        assert opt.exp_avg(i).shape == params[i].shape
        assert torch.allclose(opt.exp_avg(i), m[i], rtol=1e-6, atol=1e-8), i
        assert torch.allclose(opt.exp_avg_sq(i), v[i], rtol=1e-6, atol=1e-10), i
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
