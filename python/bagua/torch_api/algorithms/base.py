"""Algorithm declarations (Bagua's Algorithm / AlgorithmImpl split).

An ``Algorithm`` holds the user's arguments. Wrapping a model builds the C++ implementation
(``algorithms/`` library, by name through ``createAlgorithm``) for that wrap; a later wrap of
the same model with another algorithm (Bagua's model switch) builds a fresh one.
"""

from .._ext import ext


def _arg(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class AlgorithmImpl:
    """The reified algorithm (what Bagua's ``reify(process_group)`` returns)."""

    def __init__(self, algorithm, process_group):
        self.algorithm = algorithm
        self.process_group = process_group


class Algorithm:
    #: The name the C++ factory knows (``gradient_allreduce``, ``bytegrad``, ...).
    name = None

    def __init__(self):
        self._ext_algorithm = None

    def _kwargs(self):
        return {}

    def _qadam(self):
        return None

    def _make_ext(self):
        """A fresh C++ algorithm for one wrap."""
        args = {k: _arg(v) for k, v in self._kwargs().items()}
        q = self._qadam()
        self._ext_algorithm = ext.Algorithm(self.name, args, q._ext if q is not None else None)
        return self._ext_algorithm

    def reify(self, process_group):
        return AlgorithmImpl(self, process_group)

    @classmethod
    def init(cls, name, **kwargs):
        """Builds an algorithm by its registry name (Bagua's ``Algorithm.init``)."""
        from . import GlobalAlgorithmRegistry

        try:
            klass = GlobalAlgorithmRegistry[name]
        except KeyError:
            raise ValueError(
                "bagua: unknown algorithm '{}' (known: {})".format(
                    name, ", ".join(sorted(GlobalAlgorithmRegistry))
                )
            )
        return klass(**kwargs)

    def __repr__(self):
        return "{}({})".format(
            type(self).__name__, ", ".join("{}={!r}".format(k, v) for k, v in self._kwargs().items())
        )
