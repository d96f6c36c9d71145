"""Lightning's ``BaguaStrategy`` on bagua.torch_api, registered as ``"bagua"``.

    import bagua.lightning  # registers the strategy
    trainer = Trainer(strategy="bagua", accelerator="gpu", devices=2)
    trainer = Trainer(strategy=BaguaStrategy(algorithm="bytegrad"), ...)
    trainer = Trainer(strategy=BaguaStrategy(algorithm="auto"), ...)  # measured, then chosen

Lightning removed its own BaguaStrategy (it needed the unmaintained bagua package); this one
follows the old one's arguments: ``algorithm`` (a registry name or an Algorithm), ``flatten``,
and the algorithm's keyword arguments. ``algorithm="auto"`` (``AutoAlgorithm``: ``pin=``,
``probe_steps=`` as keyword arguments) measures the link during the first steps and picks
gradient_allreduce, bytegrad or powersgd; the choice is in ``strategy.model.bagua_algorithm
.decision()`` and in the log. torch.distributed is still initialised by DDPStrategy
(Lightning's barrier/broadcast/reduce use it); bagua's own group rendezvouses through torch's
default store.
Works with ``lightning.pytorch`` (2.x) or ``pytorch_lightning``.
"""

try:
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
    from lightning.pytorch.trainer.states import TrainerFn
except ImportError:  # pragma: no cover - the older package name
    from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry
    from pytorch_lightning.trainer.states import TrainerFn

import bagua.torch_api as bagua
from bagua.torch_api import communication as _comm
from bagua.torch_api.algorithms import Algorithm
from bagua.torch_api.data_parallel import DistributedDataParallel


class BaguaStrategy(DDPStrategy):
    strategy_name = "bagua"

    def __init__(self, algorithm="gradient_allreduce", flatten=True, accelerator=None,
                 parallel_devices=None, cluster_environment=None, checkpoint_io=None,
                 precision_plugin=None, **bagua_kwargs):
        kwargs = {}
        if precision_plugin is not None:
            kwargs["precision_plugin"] = precision_plugin
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         **kwargs)
        self._bagua_algorithm = algorithm
        self._bagua_flatten = flatten
        self._bagua_kwargs = bagua_kwargs

    def setup_distributed(self):
        # DDPStrategy initialises torch.distributed; bagua's group then rendezvouses through
        # torch's default store (no second fixed port).
        super().setup_distributed()
        if not bagua.is_initialized():
            _comm._init(rank=self.global_rank, world_size=self.world_size,
                        local_rank=self.local_rank, local_world_size=self.num_processes)

    def _make_algorithm(self):
        a = self._bagua_algorithm
        if isinstance(a, Algorithm):
            return a
        kwargs = dict(self._bagua_kwargs)
        if a == "qadam":
            kwargs.setdefault("q_adam_optimizer", self.optimizers[0])
        return Algorithm.init(a, **kwargs)

    def setup(self, trainer):
        if trainer.state.fn != TrainerFn.FITTING:
            return super().setup(trainer)
        # DDPStrategy.setup's order, except that the optimizers exist before the wrap (it
        # broadcasts their state and patches optimizer.step for the post-step hook).
        self.accelerator.setup(trainer)
        if hasattr(self.precision_plugin, "convert_module"):
            self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.setup_optimizers(trainer)
        algorithm = self._make_algorithm()
        self.model = DistributedDataParallel(
            self.model, optimizers=self.optimizers, algorithm=algorithm,
            gradient_as_bucket_view=self._bagua_flatten)
        self.setup_precision_plugin()
        if algorithm.name == "async":
            algorithm.resume(self.model)

    def teardown(self):
        model = self.model
        if isinstance(model, DistributedDataParallel):
            algo = model.bagua_algorithm
            if algo.name == "async":
                algo.abort(model)
            model.close()
            self.model = model.module
        super().teardown()

    def barrier(self, *args, **kwargs):
        if bagua.is_initialized():
            bagua.barrier()
        else:
            super().barrier(*args, **kwargs)

    @classmethod
    def register_strategies(cls, strategy_registry):
        strategy_registry.register(cls.strategy_name, cls,
                                   description="Bagua's algorithms on the bagua C++ core")


if "bagua" not in StrategyRegistry:
    BaguaStrategy.register_strategies(StrategyRegistry)
