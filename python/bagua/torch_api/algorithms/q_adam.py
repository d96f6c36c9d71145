"""QAdam (arXiv 2102.02888): Adam in warm-up, then compressed momentum with v frozen.

``QAdamOptimizer`` is a torch optimizer whose arithmetic runs in the C++ core (f32 CPU tensors),
so it is exactly the optimizer the ``qadam`` algorithm writes the averaged momentum into.
"""

import torch

from .._ext import ext
from ..communication import dtype_code
from .base import Algorithm


class QAdamOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        warmup_steps: int = 100,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if warmup_steps <= 0:
            raise ValueError("QAdamOptimizer: warmup_steps must be > 0, got {}".format(warmup_steps))
        if lr < 0.0:
            raise ValueError("QAdamOptimizer: invalid learning rate {}".format(lr))
        defaults = dict(lr=lr, warmup_steps=warmup_steps, betas=betas, eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self._params = [p for g in self.param_groups for p in g["params"]]
        for p in self._params:
            if p.is_cuda or p.dtype != torch.float32:
                raise ValueError(
                    "QAdamOptimizer: only float32 CPU parameters are supported in this version")
        specs = [("p{}".format(i), p.data_ptr(), 0, p.numel(), dtype_code(p.dtype), 0, 0,
                  p.requires_grad) for i, p in enumerate(self._params)]
        self._ext = ext.QAdamOptimizer(specs, lr, warmup_steps, betas[0], betas[1], eps,
                                       weight_decay)

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
        self._ext.step()
        return loss

    def exp_avg(self, i):
        return torch.frombuffer(bytearray(self._ext.state(i, False)), dtype=torch.float32).view_as(
            self._params[i])

    def exp_avg_sq(self, i):
        return torch.frombuffer(bytearray(self._ext.state(i, True)), dtype=torch.float32).view_as(
            self._params[i])


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
