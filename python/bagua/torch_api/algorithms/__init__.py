"""Bagua's algorithms by class and by registry name (``GlobalAlgorithmRegistry``)."""

from .base import Algorithm, AlgorithmImpl, GlobalAlgorithmRegistry  # noqa: F401
from . import bytegrad, decentralized, gradient_allreduce  # noqa: F401
from . import q_adam, async_model_average, powersgd, auto  # noqa: F401
from .gradient_allreduce import GradientAllReduceAlgorithm
from .bytegrad import ByteGradAlgorithm
from .decentralized import DecentralizedAlgorithm, LowPrecisionDecentralizedAlgorithm
from .q_adam import QAdamAlgorithm, QAdamOptimizer  # noqa: F401
from .async_model_average import AsyncModelAverageAlgorithm
from .powersgd import PowerSGDAlgorithm
from .auto import AutoAlgorithm

GlobalAlgorithmRegistry.register("gradient_allreduce", GradientAllReduceAlgorithm,
                                 description="Gradient AllReduce Algorithm")
GlobalAlgorithmRegistry.register("bytegrad", ByteGradAlgorithm, description="ByteGrad Algorithm")
GlobalAlgorithmRegistry.register("decentralized", DecentralizedAlgorithm,
                                 description="Decentralized SGD Algorithm")
GlobalAlgorithmRegistry.register("low_precision_decentralized",
                                 LowPrecisionDecentralizedAlgorithm,
                                 description="Low Precision Decentralized SGD Algorithm")
GlobalAlgorithmRegistry.register("qadam", QAdamAlgorithm, description="QAdam Algorithm")
GlobalAlgorithmRegistry.register("async", AsyncModelAverageAlgorithm,
                                 description="Asynchronous Model Average Algorithm")
GlobalAlgorithmRegistry.register("powersgd", PowerSGDAlgorithm,
                                 description="PowerSGD low-rank gradient compression")
GlobalAlgorithmRegistry.register("auto", AutoAlgorithm,
                                 description="Measures the link, then picks the algorithm")
