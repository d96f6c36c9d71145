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
    return {k: (v.default if v.default is not inspect.Parameter.empty else "REQ")
            for k, v in inspect.signature(f).parameters.items()}


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
    assert {"SUM", "AVG", "MIN", "MAX", "PRODUCT"} <= set(bagua.ReduceOp.__members__)


def test_not_initialised_error_is_actionable():
    if bagua.is_initialized():
        pytest.skip("a group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        bagua.get_rank()


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
                                             "weight_decay": 0.0, "hold_zero_variance": True}
    with pytest.raises(ValueError):
        q_adam.QAdamOptimizer([torch.nn.Parameter(torch.zeros(2))], warmup_steps=0)
    with pytest.raises(ValueError):
        decentralized.DecentralizedAlgorithm(peer_selection_mode="ring")
    a = algorithms.Algorithm.init("bytegrad", hierarchical=False)
    assert isinstance(a, bytegrad.ByteGradAlgorithm) and a.hierarchical is False
    with pytest.raises(ValueError, match="known"):
        algorithms.Algorithm.init("nope")
    assert sorted(algorithms.GlobalAlgorithmRegistry) == sorted(
        ["gradient_allreduce", "bytegrad", "decentralized", "low_precision_decentralized",
         "qadam", "async"])


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
