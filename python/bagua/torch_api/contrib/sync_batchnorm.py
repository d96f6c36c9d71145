"""Bagua's ``SyncBatchNorm``: batch norm whose batch statistics are taken over every rank of the
default group (in training mode), and ``convert_sync_batchnorm``.

CUDA inputs use torch's batch-norm kernels (``batch_norm_stats``,
``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt`` and their backward), as Bagua and
``torch.nn.SyncBatchNorm`` do, with our all-gather / all-reduce in between, so the results are
torch's. CPU inputs (Bagua refused them: those kernels are CUDA-only in torch 1.13) take the
same statistics with plain tensor operations: the global mean, then the global mean squared
deviation (two passes, no cancellation), each summed over ranks by an all-reduce whose backward
is the same all-reduce, so autograd gives the synchronised gradients.
"""

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.nn.modules.batchnorm import _BatchNorm

from .. import communication as comm

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Arguments as ``torch.nn.BatchNorm*d`` (N, C, ...) inputs of any rank >= 2."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def _factor(self):
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked)  # cumulative moving average

    def forward(self, input):
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
        use_batch = self.training or not self.track_running_stats
        if not use_batch or comm.get_world_size() == 1 or not comm.is_initialized():
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, use_batch, self._factor() if use_batch else 0.0,
                                self.eps)
        running = self.track_running_stats and self.training
        if input.is_cuda:
            return _SyncBatchNormCuda.apply(
                input, self.weight, self.bias, self.running_mean if running else None,
                self.running_var if running else None, self.eps, self._factor())
        return self._forward_host(input, running)

    def _forward_host(self, input, running):
        c = input.size(1)
        dims = [0] + list(range(2, input.dim()))
        n_local = input.numel() // c
        count = torch.tensor([float(n_local)], dtype=input.dtype)
        _allreduce_sum_(count)
        n = count.item()
        mean = _AllReduceSum.apply(input.sum(dims)) / n
        shape = [1, c] + [1] * (input.dim() - 2)
        centered = input - mean.view(shape)
        var = _AllReduceSum.apply((centered * centered).sum(dims)) / n
        if running:
            with torch.no_grad():
                f = self._factor()
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - f).add_(mean.detach(), alpha=f)
                self.running_var.mul_(1 - f).add_(unbiased, alpha=f)
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """Replaces every ``BatchNorm*d`` in ``module`` by a ``SyncBatchNorm`` sharing its
        parameters and running statistics (call it before ``with_bagua``); returns the module
        (a new one when ``module`` itself is a batch norm)."""
        out = module
        if isinstance(module, _BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out


def _allreduce_sum_(t):
    comm.allreduce_inplace(t, comm.ReduceOp.SUM)
    return t


class _AllReduceSum(Function):
    """Sum over ranks; the gradient of a sum is the sum of the gradients."""

    @staticmethod
    def forward(ctx, x):
        return _allreduce_sum_(x.detach().clone().contiguous())

    @staticmethod
    def backward(ctx, g):
        return _allreduce_sum_(g.detach().clone().contiguous())


class _SyncBatchNormCuda(Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        input = input.contiguous()
        n = comm.get_world_size()
        count = torch.tensor([float(input.numel() // input.size(1))], device=input.device)
        mean, invstd = torch.batch_norm_stats(input, eps)
        c = mean.numel()
        # One all-gather of (count, mean, invstd) per rank.
        mine = torch.cat([count, mean.float(), invstd.float()])
        every = torch.empty(n * mine.numel(), dtype=mine.dtype, device=mine.device)
        comm.allgather(mine, every)
        every = every.view(n, -1)
        counts = every[:, 0]
        mean_all = every[:, 1:1 + c].to(mean.dtype)
        invstd_all = every[:, 1 + c:].to(invstd.dtype)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            input, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts)
        ctx.save_for_backward(input, weight, mean, invstd, counts.to(torch.int32))
        return torch.batch_norm_elemt(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, grad_output):
        grad_output = grad_output.contiguous()
        saved, weight, mean, invstd, counts = ctx.saved_tensors
        need_in, need_w, need_b = ctx.needs_input_grad[0:3]
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
            grad_output, saved, mean, invstd, weight, need_in, need_w, need_b)
        grad_input = None
        if need_in:
            both = torch.cat([sum_dy, sum_dy_xmu])
            _allreduce_sum_(both)
            sum_dy, sum_dy_xmu = both[:sum_dy.numel()], both[sum_dy.numel():]
            grad_input = torch.batch_norm_backward_elemt(
                grad_output, saved, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)
        if weight is None or not need_w:
            grad_weight = None
        if weight is None or not need_b:
            grad_bias = None
        # Weight and bias gradients stay local: data-parallel training reduces them.
        return grad_input, grad_weight, grad_bias, None, None, None, None
