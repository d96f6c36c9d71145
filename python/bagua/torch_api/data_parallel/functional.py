"""Differentiable collectives (Bagua's ``data_parallel.functional``): ``all_reduce`` whose
backward all-reduces the gradient, on a ``torch.distributed`` group through its Bagua twin
(``ProcessGroup.bagua_patch()``), as SyncBatchNorm uses it."""

import torch.distributed as dist
from torch.autograd import Function

from ..communication import CommMember, ReduceOp

__all__ = ["ReduceOp", "all_reduce", "torch_reduce_op_to_bagua"]


def torch_reduce_op_to_bagua(op):
    """torch's ReduceOp.SUM / MAX as Bagua's (the two Bagua mapped)."""
    if op == dist.ReduceOp.SUM:
        return ReduceOp.SUM
    if op == dist.ReduceOp.MAX:
        return ReduceOp.MAX
    raise ValueError("bagua: unsupported reduce op {} (SUM or MAX)".format(op))


def _comm(group):
    from .. import communication

    if group is None or group is dist.group.WORLD:
        return communication._get_default_group().get_global_communicator()
    return group.bagua_patch().bagua_get_global_communicator()


def all_reduce(tensor, op=dist.ReduceOp.SUM, group=dist.group.WORLD):
    """A new tensor holding the reduction of ``tensor`` over ``group``; its gradient is the
    same reduction of the output's gradient."""
    return _AllReduce.apply(op, group, tensor)


class _AllReduce(Function):
    @staticmethod
    def forward(ctx, op, group, tensor):
        ctx.op, ctx.group = op, group
        out = tensor.clone().contiguous()
        c = _comm(group)
        if c is not CommMember.NON_COMM_MEMBER:
            c.allreduce_inplace(out, torch_reduce_op_to_bagua(op))
        return out

    @staticmethod
    def backward(ctx, grad_output):
        return (None, None, _AllReduce.apply(ctx.op, ctx.group, grad_output))
