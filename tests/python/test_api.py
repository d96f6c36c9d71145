"""API compatibility: Bagua's documented names, arguments and defaults."""

import inspect

import pytest
import torch

import bagua.torch_api as bagua
from bagua.torch_api import algorithms
from bagua.torch_api.algorithms import (
    async_model_average,
    bytegrad,
    decentralized,
    gradient_allreduce,
    q_adam,
)
from bagua.torch_api import contrib
from bagua.torch_api.data_parallel import DistributedDataParallel


def params(f):
    """Bagua's parameters of ``f``: ours that are private and keyword-only (``_engine_options``)
    are left out, as no Bagua caller can pass them."""
    return {k: (v.default if v.default is not inspect.Parameter.empty else "REQ")
            for k, v in inspect.signature(f).parameters.items()
            if not (k.startswith("_") and v.kind is inspect.Parameter.KEYWORD_ONLY)}


def test_communication_names_and_signatures():
    assert params(bagua.init_process_group) == {
        "store": None, "rank": -1, "world_size": -1, "local_world_size": -1}
    for name in ("get_rank", "get_world_size", "get_local_rank", "get_local_size", "new_group",
                 "allreduce", "allreduce_inplace", "broadcast", "allgather", "allgather_inplace",
                 "reduce", "reduce_inplace", "reduce_scatter", "reduce_scatter_inplace",
                 "alltoall", "alltoall_inplace", "send", "recv", "barrier", "broadcast_object",
                 "is_initialized"):
        assert callable(getattr(bagua, name)), name
    assert params(bagua.allreduce) == {"send_tensor": "REQ", "recv_tensor": "REQ",
                                       "op": bagua.ReduceOp.SUM, "comm": None}
    assert params(bagua.broadcast) == {"tensor": "REQ", "src": 0, "comm": None}
    assert params(bagua.reduce) == {"send_tensor": "REQ", "recv_tensor": "REQ", "dst": "REQ",
                                    "op": bagua.ReduceOp.SUM, "comm": None}
    assert params(bagua.send) == {"tensor": "REQ", "dst": "REQ", "comm": None}
    assert params(bagua.recv) == {"tensor": "REQ", "src": "REQ", "comm": None}
    # Bagua's values (its Aluminum codes), bitwise ops included.
    assert {k: int(v) for k, v in bagua.ReduceOp.__members__.items()} == {
        "SUM": 0, "PRODUCT": 1, "MIN": 2, "MAX": 3, "BOR": 7, "BAND": 8, "BXOR": 9, "AVG": 10}


def test_not_initialised_error_is_actionable():
    if bagua.is_initialized():
        pytest.skip("a group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        bagua.new_group([0])
    with pytest.raises(RuntimeError, match="init_process_group"):
        bagua.allreduce_inplace(torch.zeros(1))


def test_env_getters_before_init(monkeypatch):
    """Bagua's scripts call get_rank() / get_local_rank() before init_process_group (e.g.
    torch.cuda.set_device(bagua.get_local_rank())): they read the launcher's variables."""
    if bagua.is_initialized():
        pytest.skip("a group exists in this process")
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                 "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(k, v)
    assert (bagua.get_rank(), bagua.get_world_size(), bagua.get_local_rank(),
            bagua.get_local_size()) == (5, 8, 1, 4)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(k, raising=False)
    # Bagua's defaults when nothing is set.
    assert (bagua.get_rank(), bagua.get_world_size(), bagua.get_local_rank(),
            bagua.get_local_size(), bagua.get_node_rank()) == (0, 1, 0, 1, 0)
    monkeypatch.setenv("NODE_RANK", "3")
    assert bagua.get_node_rank() == 3


def test_algorithm_classes_and_defaults():
    assert params(gradient_allreduce.GradientAllReduceAlgorithm) == {
        "hierarchical": False, "average": True}
    assert params(bytegrad.ByteGradAlgorithm) == {"hierarchical": True, "average": True}
    assert params(decentralized.DecentralizedAlgorithm) == {
        "hierarchical": True, "peer_selection_mode": "all", "communication_interval": 1}
    assert params(decentralized.LowPrecisionDecentralizedAlgorithm) == {
        "hierarchical": True, "communication_interval": 1}
    assert params(async_model_average.AsyncModelAverageAlgorithm) == {
        "peer_selection_mode": "all", "sync_interval_ms": 500, "warmup_steps": 0}
    assert params(q_adam.QAdamAlgorithm) == {"q_adam_optimizer": "REQ", "hierarchical": True}
    assert params(q_adam.QAdamOptimizer) == {"params": "REQ", "lr": 1e-3, "warmup_steps": 100,
                                             "betas": (0.9, 0.999), "eps": 1e-8,
                                             "weight_decay": 0.0, "hold_zero_variance": False}
    with pytest.raises(ValueError):
        q_adam.QAdamOptimizer([torch.nn.Parameter(torch.zeros(2))], warmup_steps=0)
    with pytest.raises(ValueError):
        decentralized.DecentralizedAlgorithm(peer_selection_mode="ring")
    a = algorithms.Algorithm.init("bytegrad", hierarchical=False)
    assert isinstance(a, bytegrad.ByteGradAlgorithm) and a.hierarchical is False
    with pytest.raises(ValueError, match="known"):
        algorithms.Algorithm.init("nope")
    # Bagua's six, and ours beside them (algorithm="auto", the low-rank powersgd).
    assert sorted(set(algorithms.GlobalAlgorithmRegistry) - {"auto", "powersgd"}) == sorted(
        ["gradient_allreduce", "bytegrad", "decentralized", "low_precision_decentralized",
         "qadam", "async"])
    assert "auto" in algorithms.GlobalAlgorithmRegistry
    assert "powersgd" in algorithms.GlobalAlgorithmRegistry


def test_with_bagua_and_ddp_signatures():
    assert params(torch.nn.Module.with_bagua) == {
        "self": "REQ", "optimizers": "REQ", "algorithm": "REQ", "process_group": None,
        "do_flatten": True}
    p = params(DistributedDataParallel.__init__)
    assert p["bucket_cap_mb"] == 25 and p["find_unused_parameters"] is False
    assert p["gradient_as_bucket_view"] is True and p["broadcast_buffers"] is True
    assert "optimizers" in p and "algorithm" in p and "process_group" in p


def test_contrib_signatures():
    assert params(contrib.CachedDataset) == {"dataset": "REQ", "backend": "redis",
                                             "dataset_name": "", "writer_buffer_size": 20,
                                             "kwargs": "REQ"}
    assert params(contrib.LoadBalancingDistributedSampler) == {
        "dataset": "REQ", "complexity_fn": "REQ", "num_replicas": None, "rank": None,
        "shuffle": True, "seed": 0, "drop_last": False, "random_level": 0}
    assert params(contrib.LoadBalancingDistributedBatchSampler) == {
        "sampler": "REQ", "batch_fn": "REQ", "drop_last": False}
    assert params(contrib.fuse_optimizer) == {"optimizer": "REQ", "do_flatten": True,
                                              "check_flatten": True}


def test_names_lightning_bagua_imports():
    # lightning_bagua's strategy.py (the Lightning strategy Bagua users have) imports these
    # names and calls these attributes; Lightning itself is on the GPU machine only.
    import importlib

    from bagua.torch_api.algorithms.q_adam import QAdamOptimizer  # noqa: F401
    from bagua.torch_api.communication import (  # noqa: F401
        ReduceOp, allreduce_inplace, barrier, broadcast_object, is_initialized)
    from bagua.torch_api.data_parallel.distributed import DistributedDataParallel_V1_9_0

    assert importlib.util.find_spec("bagua.torch_api") is not None  # module_available()
    for op in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        assert hasattr(ReduceOp, op)
    p = params(DistributedDataParallel_V1_9_0.__init__)
    assert {"module", "optimizers", "algorithm", "gradient_as_bucket_view"} <= set(p)
    for attr in ("require_backward_grad_sync", "bagua_algorithm", "bagua_optimizers",
                 "bagua_buckets", "parameters_to_ignore", "no_sync"):
        assert hasattr(DistributedDataParallel_V1_9_0, attr), attr
    assert callable(bagua.algorithms.Algorithm.init)


def test_bagua_module_level_names():
    # Names Bagua's tests and examples reach through the package.
    import bagua.torch_api.contrib as contrib_mod

    assert bagua.contrib is contrib_mod  # an attribute, as in Bagua
    for name in ("BaguaModule", "BaguaTensor", "get_backend", "gather", "gather_inplace",
                 "scatter", "scatter_inplace", "alltoall_v", "alltoall_v_inplace",
                 "allreduce_coalesced_inplace", "broadcast_coalesced", "from_torch_group"):
        assert hasattr(bagua, name), name
    for name in ("_get_default_group", "_rank_not_in_group", "_rank_not_in_comm", "CommMember",
                 "_torch_to_bagua_pg_map", "_pg_group_ranks"):
        assert hasattr(bagua.communication, name), name
    for name in ("flatten", "unflatten", "apply_flattened_call", "to_bagua_datatype",
                 "StatisticalAverage", "check_contiguous", "get_flattened_tensor",
                 "average_by_removing_extreme_values"):
        assert hasattr(bagua.utils, name), name
    for name in ("get_bagua_service_port", "is_report_metrics_switch_on", "get_autotune_level",
                 "find_free_network_port", "get_default_bucket_size", "get_node_rank"):
        assert callable(getattr(bagua.env, name)), name
    from bagua.torch_api.contrib.sync_batchnorm import SyncBatchNorm

    assert callable(SyncBatchNorm.convert_sync_batchnorm)
    from bagua.torch_api.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
    from bagua.torch_api.data_parallel import functional

    assert callable(functional.all_reduce)
    from bagua.bagua_define import BaguaHyperparameter, TensorDeclaration, TensorDtype

    hp = BaguaHyperparameter(is_hierarchical_reduce=False)
    buckets = [[TensorDeclaration({"name": "A", "num_elements": 123, "dtype": TensorDtype.F32})]]
    assert hp.update({"buckets": buckets}) is hp and hp.buckets == buckets
    assert hp.is_hierarchical_reduce is False


def test_init_device_keeps_a_selected_device_else_local_rank():
    from bagua.torch_api.communication import _init_device

    assert _init_device(0, 3, 8) == 3  # nothing selected: LOCAL_RANK's
    assert _init_device(0, 9, 8) == 1  # more local ranks than GPUs: wraps around
    assert _init_device(5, 0, 8) == 5  # selected before init (a launcher's own mapping): kept
    assert _init_device(2, 2, 8) == 2


def test_with_bagua_refuses_parameters_off_the_group_device():
    from types import SimpleNamespace

    from bagua.torch_api.data_parallel._engine import _check_devices

    on = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
    off = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    stream = SimpleNamespace(device=torch.device("cuda", 1))
    _check_devices([("a", on)], stream)
    _check_devices([("a", off)], None)  # no CUDA stream: nothing to compare with
    with pytest.raises(RuntimeError, match=r"parameter 'b' is on cuda:0 but the process group "
                                           r"communicates on cuda:1.*set_device\(\) before"):
        _check_devices([("a", on), ("b", off)], stream)
