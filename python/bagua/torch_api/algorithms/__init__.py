"""Bagua's algorithms by class and by registry name."""

from .base import Algorithm, AlgorithmImpl  # noqa: F401
from .gradient_allreduce import GradientAllReduceAlgorithm
from .bytegrad import ByteGradAlgorithm
from .decentralized import DecentralizedAlgorithm, LowPrecisionDecentralizedAlgorithm
from .q_adam import QAdamAlgorithm, QAdamOptimizer  # noqa: F401
from .async_model_average import AsyncModelAverageAlgorithm

GlobalAlgorithmRegistry = {
    "gradient_allreduce": GradientAllReduceAlgorithm,
    "bytegrad": ByteGradAlgorithm,
    "decentralized": DecentralizedAlgorithm,
    "low_precision_decentralized": LowPrecisionDecentralizedAlgorithm,
    "qadam": QAdamAlgorithm,
    "async": AsyncModelAverageAlgorithm,
}
