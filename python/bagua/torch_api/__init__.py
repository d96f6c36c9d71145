"""Bagua's PyTorch API on the bagua C++ core.

    import bagua.torch_api as bagua
    bagua.init_process_group()
    model = model.with_bagua([optimizer], bagua.algorithms.gradient_allreduce.GradientAllReduceAlgorithm())
"""

from .communication import (  # noqa: F401
    ReduceOp,
    BaguaProcessGroup,
    init_process_group,
    destroy_process_group,
    is_initialized,
    get_default_group,
    new_group,
    get_rank,
    get_world_size,
    get_local_rank,
    get_local_size,
    get_node_rank,
    allreduce,
    allreduce_inplace,
    reduce,
    reduce_inplace,
    broadcast,
    allgather,
    allgather_inplace,
    reduce_scatter,
    reduce_scatter_inplace,
    alltoall,
    alltoall_inplace,
    send,
    recv,
    barrier,
    broadcast_object,
    allgather_object,
)
from . import algorithms  # noqa: F401
from . import data_parallel  # noqa: F401
from .data_parallel import distributed as _distributed
from . import env  # noqa: F401

_distributed.install()
