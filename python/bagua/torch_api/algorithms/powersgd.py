import math
import numbers

from .base import Algorithm, _native_impl_class


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError("PowerSGDAlgorithm: {}={!r} must be an integer >= {}".format(
            name, value, minimum))
    return int(value)


def _check_number(name, value):
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value < 0):
        raise ValueError("PowerSGDAlgorithm: {}={!r} must be a finite number >= 0".format(
            name, value))
    return float(value)


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError("PowerSGDAlgorithm: {}={!r} must be True or False".format(name, value))
    return value


class PowerSGDAlgorithm(Algorithm):
    """PowerSGD (Vogels et al., NeurIPS 2019): every gradient of two or more dimensions is sent as
    rank-``rank`` factors P and Q from one step of power iteration per training step, with error
    feedback and a warm-started Q; vectors (biases, norms) and matrices not worth compressing are
    all-reduced in full precision. Runs in the C++ reducer on CPU tensors (host backend) and CUDA
    tensors (NCCL). Per step it sends ``sum((rows + cols) * rank)`` elements over the compressed
    matrices plus the others, instead of ``sum(rows * cols)``.

    Args:
        rank: rank of the approximation (>= 1). 1 sends the fewest bytes; raise it by powers of
            two (2, 4, 8) when the loss falls behind gradient all-reduce. A rank larger than
            ``min(rows, cols)`` of every matrix of the model is an error.
        start_iter: training steps of plain all-reduce before compression starts (>= 0).
            The default 10 skips the first steps' large, fast-changing gradients; raise it
            (towards 10% of the training steps) if the final accuracy falls short. torch's
            hook defaults to 1000 partly because its state cannot survive DDP's bucket rebuild
            after the first step; ours follows the tensors.
        min_compression_rate: a matrix is compressed only when
            ``rows * cols > min_compression_rate * (rows + cols) * rank`` (>= 0; 2 as torch);
            smaller ones are all-reduced with the vectors.
        error_feedback: keep what the approximation missed and add it to the next gradient
            (keep it on: PowerSGD is biased without it).
        warm_start: start each step's power iteration from the last step's Q (keep it on).
        orthogonalization_epsilon: added to each column norm in Gram-Schmidt (>= 0; 0 as torch;
            a column of norm 0 is left at 0, or redrawn for Q).
        seed: seed of the random starting Q, the same on every rank (integer >= 0).
        quantize_factors: send P and Q as 8-bit MinMaxUInt8 (ByteGrad's codec and exchange),
            a quarter of the factor bytes at the cost of a second collective per factor; the
            error feedback absorbs the quantisation error. Worth it at ``rank >= 4`` on slow
            links: ``rank=16, quantize_factors=True`` sends about rank 4's bytes and, on an LM,
            needs far fewer steps to a given loss than rank 4 (what ``algorithm="auto"`` picks
            where the link is the step).
    """

    name = "powersgd"

    def __init__(self, rank: int = 1, start_iter: int = 10, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0.0, seed: int = 0,
                 quantize_factors: bool = False):
        super().__init__()
        self.rank = _check_int("rank", rank, 1)
        self.start_iter = _check_int("start_iter", start_iter, 0)
        self.min_compression_rate = _check_number("min_compression_rate", min_compression_rate)
        self.error_feedback = _check_bool("error_feedback", error_feedback)
        self.warm_start = _check_bool("warm_start", warm_start)
        self.orthogonalization_epsilon = _check_number("orthogonalization_epsilon",
                                                       orthogonalization_epsilon)
        self.seed = _check_int("seed", seed, 0)
        self.quantize_factors = _check_bool("quantize_factors", quantize_factors)

    def _kwargs(self):
        return {"rank": self.rank, "start_iter": self.start_iter,
                "min_compression_rate": self.min_compression_rate,
                "error_feedback": self.error_feedback, "warm_start": self.warm_start,
                "orthogonalization_epsilon": self.orthogonalization_epsilon,
                "seed": self.seed, "quantize_factors": self.quantize_factors}

    def snapshot(self):
        """The live reducer's state (debugging, tests): ``steps``, ``compressing``,
        ``elements_per_step``, ``uncompressed_elements`` and, per compressed tensor name,
        ``rows``, ``cols``, ``rank``, ``error`` and ``q`` (flat lists)."""
        if self._ext_algorithm is None:
            raise RuntimeError("PowerSGDAlgorithm.snapshot(): the model is not wrapped yet")
        return self._ext_algorithm.powersgd_snapshot()


#: The implementation ``PowerSGDAlgorithm.reify`` returns (runs in the C++ reducer).
PowerSGDAlgorithmImpl = _native_impl_class("powersgd")
