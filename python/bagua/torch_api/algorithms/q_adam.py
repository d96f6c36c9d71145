"""QAdam (arXiv 2102.02888): Adam in warm-up, then compressed momentum with v frozen.

``QAdamOptimizer`` is a torch optimizer whose arithmetic runs in the C++ core, on float32 CPU
tensors or float32 CUDA tensors (m and v then live on the parameters' device), so it is exactly
the optimizer the ``qadam`` algorithm writes the averaged momentum into.

CUDA ordering: the core runs a step's kernels on the calling thread's per-thread default stream
and waits for them before ``step()`` returns. torch's work may be on another stream (a
non-blocking side stream does not order with the per-thread default stream), so ``step()`` first
waits for torch's current stream on every device that holds a parameter (the gradients, and the
reducer's work that torch's stream was ordered after, are then complete). Later torch work on any
stream sees the new weights because the core's step has finished on the host.

``hold_zero_variance`` (an addition to Bagua's signature, default True): in the compression stage
an element whose frozen second moment is exactly 0 (its gradient was exactly zero through the
whole warm-up: a dead ReLU unit, an unused embedding row) is not updated. Bagua's update there is
``lr / (1 - beta1^t) * m / eps``, i.e. ``m * 1e8 * lr`` with the default eps, and m is not zero
once the element gets a gradient: training diverged (Bagua #654 "QAdam NaN"). Elements with a
non-zero variance and the warm-up are unchanged bit for bit; ``False`` gives Bagua's exact math.
"""


import torch

from .._ext import ext
from ..communication import dtype_code
from .base import Algorithm, _native_impl_class


class QAdamOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        warmup_steps: int = 100,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        hold_zero_variance: bool = True,
    ):
        if warmup_steps <= 0:
            raise ValueError("QAdamOptimizer: warmup_steps must be > 0, got {}".format(warmup_steps))
        if lr < 0.0:
            raise ValueError("QAdamOptimizer: invalid learning rate {}".format(lr))
        defaults = dict(lr=lr, warmup_steps=warmup_steps, betas=betas, eps=eps,
                        weight_decay=weight_decay, hold_zero_variance=bool(hold_zero_variance))
        super().__init__(params, defaults)
        self._params = [p for g in self.param_groups for p in g["params"]]
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32:
                raise ValueError(
                    "QAdamOptimizer: parameter {} is {}; only float32 parameters (CPU or CUDA) "
                    "are supported".format(i, p.dtype))
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError("QAdamOptimizer: parameter {} is on {}; only CPU and CUDA "
                                 "parameters are supported".format(i, p.device))
            if not p.is_contiguous():
                raise ValueError("QAdamOptimizer: parameter {} is not contiguous".format(i))
        if len({p.device.type for p in self._params}) > 1:
            raise ValueError("QAdamOptimizer: parameters on both CPU and CUDA; put them on one "
                             "device type")
        self._cuda_devices = sorted({p.device.index for p in self._params if p.is_cuda})
        specs = [("p{}".format(i), p.data_ptr(), 0, p.numel(), dtype_code(p.dtype),
                  1 if p.is_cuda else 0, p.device.index if p.is_cuda else 0, p.requires_grad)
                 for i, p in enumerate(self._params)]
        self._ext = ext.QAdamOptimizer(specs, lr, warmup_steps, betas[0], betas[1], eps,
                                       weight_decay, bool(hold_zero_variance))

    def _check_covers(self, params):
        if [id(p) for p in self._params] != [id(p) for p in params]:
            raise ValueError(
                "bagua: QAdamAlgorithm needs QAdamOptimizer(model.parameters(), ...) over "
                "exactly the model's parameters, in order")

    @property
    def step_id(self):
        return self._ext.step_count

    def _refresh(self):
        ptrs = []
        for p in self._params:
            g = p.grad
            if g is not None and not g.is_contiguous():
                p.grad = g = g.contiguous()
            ptrs.append((p.data_ptr(), g.data_ptr() if g is not None else 0))
        self._ext.set_pointers(ptrs)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._refresh()
        for d in self._cuda_devices:
            # The core steps on its own (per-thread default) stream: torch's pending work
            # (gradients, the reducer's ordering) must be done first.
            torch.cuda.current_stream(d).synchronize()
        self._ext.step()
        return loss

    def _state(self, i, second):
        p = self._params[i]
        t = torch.frombuffer(bytearray(self._ext.state(i, second)), dtype=torch.float32)
        return t.view_as(p).to(p.device)

    def exp_avg(self, i):
        """m of parameter i (a copy, on the parameter's device)."""
        return self._state(i, False)

    def exp_avg_sq(self, i):
        """v of parameter i (a copy, on the parameter's device)."""
        return self._state(i, True)


class QAdamAlgorithm(Algorithm):
    name = "qadam"

    def __init__(self, q_adam_optimizer: QAdamOptimizer, hierarchical: bool = True):
        super().__init__()
        if not isinstance(q_adam_optimizer, QAdamOptimizer):
            raise TypeError("QAdamAlgorithm needs the QAdamOptimizer that steps the model")
        self.optimizer = q_adam_optimizer
        self.hierarchical = hierarchical

    def _kwargs(self):
        return {"hierarchical": self.hierarchical}

    def _qadam(self):
        return self.optimizer


#: The implementation ``QAdamAlgorithm.reify`` returns (runs in the C++ reducer).
QAdamAlgorithmImpl = _native_impl_class("qadam")
