"""Drop-in Bagua: what the CPU pre-flight of Bagua's unreached GPU tests found,
single process. lightning-Bagua's strategy tests (tests/test_strategy.py: test_configuration,
test_qadam_configuration) build its DistributedDataParallel_V1_9_0 wrap with Bagua's engine
constructor mocked out and ``bagua.torch_api.communication.is_initialized`` patched to True,
without init_process_group: the wrap must then find "the default group" through
``is_initialized()``, as Bagua's ``_get_default_group`` does."""

from unittest import mock

import pytest
import torch

import bagua.torch_api as bagua
from bagua.torch_api import communication
from bagua.torch_api.algorithms import Algorithm
from bagua.torch_api.algorithms.q_adam import QAdamOptimizer
from bagua.torch_api.data_parallel.distributed import DistributedDataParallel_V1_9_0

ENGINE = "bagua.torch_api.data_parallel.bagua_distributed.BaguaDistributedDataParallel.__init__"


@pytest.mark.parametrize("name", ["gradient_allreduce", "bytegrad", "qadam", "decentralized",
                                  "low_precision_decentralized", "async"])
def test_lightning_bagua_configure_with_mocked_engine(name):
    model = torch.nn.Linear(4, 2)
    if name == "qadam":
        opt = QAdamOptimizer(model.parameters(), lr=0.05, warmup_steps=20)
        kwargs = {"q_adam_optimizer": opt}
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kwargs = {}
    # No group, whatever other tests of this process did; is_initialized() says there is one.
    with mock.patch(ENGINE, return_value=None) as engine, \
            mock.patch.object(communication, "_default_pg", None), \
            mock.patch("bagua.torch_api.communication.is_initialized", return_value=True):
        wrapped = DistributedDataParallel_V1_9_0(
            module=model, optimizers=[opt], algorithm=Algorithm.init(name, **kwargs),
            gradient_as_bucket_view=True)
    assert engine.call_count == 1
    args, kw = engine.call_args
    assert args[0] is model and args[1] == [opt]
    assert type(args[2]).__name__ == type(Algorithm.init(name, **kwargs)).__name__
    assert kw["process_group"] is None  # Bagua's: the (uninitialised) default group
    assert wrapped.module is model


def test_default_group_still_refused_before_init():
    with mock.patch.object(communication, "_default_pg", None):
        assert not bagua.is_initialized()
        with pytest.raises(RuntimeError, match="init_process_group"):
            communication._get_default_group()
