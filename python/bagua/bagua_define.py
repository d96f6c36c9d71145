"""Bagua's tensor and hyper-parameter declarations (``bagua.bagua_define``), as plain Python
(Bagua used pydantic): what its autotune service exchanged. Our autotuner is the C++ autotune
library; these remain for code that builds or reads them."""

import enum
from typing import List, TypedDict

__all__ = ["TensorDtype", "TensorDeclaration", "get_tensor_declaration_bytes",
           "BaguaHyperparameter", "BaguaCoreTelemetrySpan"]


class TensorDtype(str, enum.Enum):
    F32 = "f32"
    F16 = "f16"
    U8 = "u8"


class TensorDeclaration(TypedDict):
    name: str
    num_elements: int
    dtype: TensorDtype


_BYTES = {TensorDtype.F32.value: 4, TensorDtype.F16.value: 2, TensorDtype.U8.value: 1}


def get_tensor_declaration_bytes(td):
    """Bytes of a declared tensor."""
    dtype = td["dtype"]
    return td["num_elements"] * _BYTES[dtype.value if isinstance(dtype, TensorDtype) else dtype]


class BaguaHyperparameter:
    """``buckets`` (lists of TensorDeclaration), ``bucket_size``, ``is_hierarchical_reduce``;
    ``update(dict)`` sets the known keys and returns self; ``dict()`` gives them back."""

    _FIELDS = ("buckets", "bucket_size", "is_hierarchical_reduce")

    def __init__(self, buckets=None, bucket_size=0, is_hierarchical_reduce=False):
        self.buckets: List[List[TensorDeclaration]] = list(buckets or [])
        self.bucket_size = int(bucket_size)
        self.is_hierarchical_reduce = bool(is_hierarchical_reduce)

    def dict(self):
        return {k: getattr(self, k) for k in self._FIELDS}

    def update(self, param_dict):
        for key, value in param_dict.items():
            if key in self._FIELDS:
                setattr(self, key, value)
        return self

    def __eq__(self, other):
        return isinstance(other, BaguaHyperparameter) and self.dict() == other.dict()

    def __repr__(self):
        return "BaguaHyperparameter({})".format(self.dict())


class BaguaCoreTelemetrySpan(TypedDict):
    trace_id: int
    action: str
    tensor_name: str
    start_time: int
    end_time: int
