"""Bagua's PyTorch API on the bagua C++ core.

    import bagua.torch_api as bagua
    torch.cuda.set_device(bagua.get_local_rank())   # from the environment, before init
    bagua.init_process_group()
    model = model.with_bagua([optimizer], bagua.algorithms.gradient_allreduce.GradientAllReduceAlgorithm())
"""

from .communication import (  # noqa: F401
    ReduceOp,
    BaguaProcessGroup,
    get_backend,
    init_process_group,
    destroy_process_group,
    is_initialized,
    get_default_group,
    new_group,
    from_torch_group,
    get_rank,
    get_world_size,
    get_local_rank,
    get_local_size,
    get_node_rank,
    allreduce,
    allreduce_inplace,
    allreduce_coalesced_inplace,
    broadcast_coalesced,
    reduce,
    reduce_inplace,
    broadcast,
    allgather,
    allgather_inplace,
    gather,
    gather_inplace,
    scatter,
    scatter_inplace,
    reduce_scatter,
    reduce_scatter_inplace,
    alltoall,
    alltoall_inplace,
    alltoall_v,
    alltoall_v_inplace,
    send,
    recv,
    barrier,
    broadcast_object,
    allgather_object,
)
from .tensor import BaguaTensor  # noqa: F401
from .distributed import BaguaModule  # noqa: F401
from . import communication  # noqa: F401
from . import env  # noqa: F401
from . import utils  # noqa: F401
from . import algorithms  # noqa: F401
from . import data_parallel  # noqa: F401
from . import contrib  # noqa: F401
from . import checkpoint  # noqa: F401
