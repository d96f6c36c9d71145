"""QAdam (arXiv 2102.02888): Adam in warm-up, then compressed momentum with v frozen.

``QAdamOptimizer`` is a torch optimizer with Bagua's update, written with torch operations in
Bagua's order, so its results are Bagua's bit for bit (on CPU and CUDA alike). Parameter groups,
``param_group["lr"]`` (and so LR schedulers), ``weight_decay``, ``betas`` and ``eps`` per group
are read at every step; ``state_dict()`` holds ``step``, ``exp_avg`` (m) and ``exp_avg_sq`` (v)
per parameter, and ``load_state_dict`` restores them.

Update, per parameter with a gradient (t: its step count): ``g = grad + weight_decay * p``;
while ``t < warmup_steps``: ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g^2``;
always ``p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``. After the warm-up
the ``qadam`` algorithm forms m itself (``beta1 m + (1 - beta1) grad``, averaged over ranks with
MinMaxUInt8 compression) and v stays frozen.

Where m and v live: in the C++ core's QAdamOptimizer (float32, on the parameters' device), which
the ``qadam`` algorithm of the C++ reducer reads and writes; the torch state tensors are views
of that memory (numpy / CUDA array interfaces, no copy). The core's own step is not used, only
its step count (advanced with no gradient attached, so it touches no memory), which tells the
algorithm when the warm-up ends.

Why the update is written here and not stepped by the core's ``QAdamOptimizer::step``: a torch
optimizer's ``step()`` updates whatever its ``param_groups`` hold at the call, with each group's
hyperparameters as they are at the call, and the core's step cannot take that. It steps the fixed
parameter list it was created over, with the options it was created with, and keeps one step
count for all of them. The package calls ``step()`` on other tensors than that list:
``fuse_step`` (contrib/fuse) steps fused views of byte-adjacent parameters and their state, and
the optimizer inside the backward pass (data_parallel/step_in_backward.py) steps one bucket's
parameters at a time, several calls per iteration. Per-group ``lr`` (LR schedulers),
``weight_decay``, ``betas`` and ``eps``, and the per-parameter step count of ``state_dict()``
(a parameter without a gradient does not advance), are Bagua's API and are not options the core
takes per call. Nor would the core's step be Bagua's bit for bit: it takes float32
hyperparameters (Bagua's betas=(0.9, 0.999) and 1 - beta are not float32 numbers; torch rounds
the Python floats where it uses them), and it divides m by the denominator before scaling where
torch's ``addcdiv`` scales first, so a parameter may differ in its last bit
(tests/python/test_qadam_state.py compares the two with float32-exact constants: m and v bit
for bit, parameters within that last bit).

``hold_zero_variance`` (our addition, default False = Bagua's maths): in the compression stage
an element whose frozen v is exactly 0 (its gradient was exactly zero through the whole warm-up:
a dead ReLU unit, an unused embedding row) is not updated. Bagua's update there is
``lr / (1 - beta1^t) * m / eps``, i.e. ``m * 1e8 * lr`` with the default eps, and m stops being 0
once the element gets a gradient: training can diverge (Bagua #654 "QAdam NaN"). With True,
elements with v != 0 and the warm-up are unchanged bit for bit.
"""

import math

import torch

from .._ext import ext
from ..communication import dtype_code
from .base import Algorithm, _native_impl_class


class _Memory:
    """Core memory seen through the array interface; holds the owner (the core optimizer) so
    the memory outlives every tensor made from it."""

    def __init__(self, owner, ptr, numel, cuda):
        self.owner = owner
        face = {"shape": (numel,), "typestr": "<f4", "data": (ptr, False), "version": 3}
        if cuda:
            face["version"] = 2
            face["strides"] = None
            self.__cuda_array_interface__ = face
        else:
            self.__array_interface__ = face


def _alias(owner, ptr, p):
    if p.numel() == 0 or ptr == 0:
        return torch.zeros_like(p, dtype=torch.float32)
    mem = _Memory(owner, ptr, p.numel(), p.is_cuda)
    if p.is_cuda:
        t = torch.as_tensor(mem, device=p.device)
    else:
        import numpy as np

        t = torch.from_numpy(np.asarray(mem))
    return t.view(p.shape)


def _spec(i, p):
    return ("p{}".format(i), p.data_ptr(), 0, p.numel(), dtype_code(p.dtype),
            1 if p.is_cuda else 0, p.device.index if p.is_cuda else 0, p.requires_grad)


class QAdamOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        warmup_steps: int = 100,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        hold_zero_variance: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError("Invalid learning rate: {}".format(lr))
        if not 0.0 <= eps:
            raise ValueError("Invalid epsilon value: {}".format(eps))
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError("Invalid beta parameter at index 0: {}".format(betas[0]))
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError("Invalid beta parameter at index 1: {}".format(betas[1]))
        if warmup_steps <= 0:
            raise ValueError("Invalid warmup_steps parameter, must be larger than 0: {}".format(
                warmup_steps))
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.warmup_steps = warmup_steps
        self.hold_zero_variance = bool(hold_zero_variance)
        self._bind([p for g in self.param_groups for p in g["params"]])

    # -- the core state ------------------------------------------------------------------------

    def _bind(self, order):
        """(Re)creates the core optimizer over ``order`` (the wrapped model's parameters, at
        the wrap; ours before) and makes every parameter's m and v views of its memory, keeping
        their values and the step count."""
        for i, p in enumerate(order):
            if p.dtype != torch.float32:
                raise ValueError("QAdamOptimizer: parameter {} is {}; only float32 parameters "
                                 "(CPU or CUDA) are supported".format(i, p.dtype))
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError("QAdamOptimizer: parameter {} is on {}; only CPU and CUDA "
                                 "parameters are supported".format(i, p.device))
            if not p.is_contiguous():
                raise ValueError("QAdamOptimizer: parameter {} is not contiguous".format(i))
        if len({p.device.type for p in order}) > 1:
            raise ValueError("QAdamOptimizer: parameters on both CPU and CUDA; put them on one "
                             "device type")
        g0 = self.param_groups[0]
        core = ext.QAdamOptimizer([_spec(i, p) for i, p in enumerate(order)], g0["lr"],
                                  self.warmup_steps, g0["betas"][0], g0["betas"][1], g0["eps"],
                                  g0["weight_decay"], self.hold_zero_variance)
        old_steps = self._ext.step_count if getattr(self, "_ext", None) is not None else 0
        self._ext = core
        # A reducer built on the previous core object keeps using it: the wrap compares this
        # generation and rebuilds on the new one (data_parallel/_native_engine.py).
        self._generation = getattr(self, "_generation", 0) + 1
        self._order = list(order)
        self._index = {id(p): i for i, p in enumerate(order)}
        for i, p in enumerate(order):
            st = self.state[p]
            m = _alias(core, core.state_ptr(i, False), p)
            v = _alias(core, core.state_ptr(i, True), p)
            with torch.no_grad():
                m.copy_(st["exp_avg"]) if "exp_avg" in st else m.zero_()
                v.copy_(st["exp_avg_sq"]) if "exp_avg_sq" in st else v.zero_()
            st["exp_avg"], st["exp_avg_sq"] = m, v
            st.setdefault("step", 0)
        self._advance_core(old_steps)

    def _advance_core(self, n):
        """Moves the core's step count by ``n`` without touching memory (no gradients)."""
        if n <= 0:
            return
        self._ext.set_pointers([(p.data_ptr(), 0) for p in self._order])
        for _ in range(n):
            self._ext.step()

    def _check_covers(self, params):
        """At the wrap: the core state follows the model's parameter order (the reducer's
        indices); every parameter of this optimizer must be one of the model's."""
        ids = {id(p) for p in params}
        missing = [p for g in self.param_groups for p in g["params"] if id(p) not in ids]
        if missing:
            raise ValueError("bagua: QAdamOptimizer has parameters that the wrapped model does "
                             "not ({} of them)".format(len(missing)))
        if [id(p) for p in self._order] != [id(p) for p in params]:
            self._bind(list(params))

    def _bagua_resync_state(self):
        """Puts m and v back into the core's memory when something replaced the state tensors
        (``fuse_step`` steps a fused copy and leaves views of it; a user may assign them), and
        makes the state view the core's memory again. Called after every (fused) step."""
        core = self._ext
        for i, p in enumerate(self._order):
            st = self.state[p]
            for key, second in (("exp_avg", False), ("exp_avg_sq", True)):
                t = st.get(key)
                ptr = core.state_ptr(i, second)
                if t is None or p.numel() == 0 or t.data_ptr() == ptr:
                    continue
                alias = _alias(core, ptr, p)
                with torch.no_grad():
                    alias.copy_(t)
                st[key] = alias

    @property
    def step_id(self):
        """The step count of the first parameter (what QAdam's stage switch reads)."""
        return self.state[self.param_groups[0]["params"][0]].get("step", 0)

    # -- the update (Bagua's) ------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # No stream wait: like any torch optimizer this runs on torch's current stream; the
        # reducer ordered its gradient copies before it, and the qadam algorithm's momentum
        # (device memory) is complete when finish_backward returns.
        self._bagua_resync_state()
        for group in self.param_groups:
            lr = group["lr"]
            weight_decay = group["weight_decay"]
            beta1, beta2 = group["betas"]
            eps = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                grad = p.grad
                if weight_decay != 0:
                    grad = grad.add(p, alpha=weight_decay)
                warm = t < self.warmup_steps
                if warm:
                    m.mul_(beta1).add_(grad, alpha=1 - beta1)
                    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias_correction1 = 1 - beta1 ** t
                bias_correction2 = 1 - beta2 ** t
                denom = (v.sqrt() / math.sqrt(bias_correction2)).add_(eps)
                step_size = lr / bias_correction1
                if self.hold_zero_variance and not warm:
                    # m * 0 where v == 0, m itself elsewhere: the other elements are bitwise
                    # the same as without the hold.
                    p.addcdiv_(m * (v != 0), denom, value=-step_size)
                else:
                    p.addcdiv_(m, denom, value=-step_size)
        self._advance_core(1)
        return loss

    def load_state_dict(self, state_dict):
        """Restores step, m and v (into the core's memory, which the state keeps viewing)."""
        super().load_state_dict(state_dict)
        steps = self.step_id
        if steps >= self._ext.step_count:
            self._bagua_resync_state()  # the loaded m and v into the same core memory
        else:  # the core's step count only moves forward: a new core object
            self._ext = None
            self._bind(self._order)
        self._advance_core(steps - self._ext.step_count)

    def _state(self, i, second):
        p = [q for g in self.param_groups for q in g["params"]][i]
        return self.state[p]["exp_avg_sq" if second else "exp_avg"].detach().clone()

    def exp_avg(self, i):
        """m of parameter i (a copy, on the parameter's device; i in param-group order)."""
        return self._state(i, False)

    def exp_avg_sq(self, i):
        """v of parameter i (a copy)."""
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
