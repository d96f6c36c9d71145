"""How the cache stores a sample: never a bare pickle.

A value read from a cache that another process can write (a Redis server) must not be
unpickled: pickle runs code while loading. Samples are encoded by the dataset_cache library's
typed codec (``value_codec.h``: None, bool, int, float, str, bytes, list, tuple, dict with any
of these as keys, torch tensors and numpy arrays as element type + shape + bytes), decoded
without running anything. A sample holding anything else (a PIL image, a custom class) is
pickled, and the pickle is stored behind an HMAC-SHA256 under a key derived from the job key
(BAGUA_JOB_KEY) and bound to the cache key, and unpickled only when the tag verifies. Without a
job key, each process makes its own random key: its pickled samples are then readable by itself
only (typed ones by every process).

``decode`` raises ``CodecError`` for a damaged, foreign or planted value; the cache loader
counts it as corrupt, logs it, and reloads the sample from the source.
"""

import hashlib
import hmac
import os
import pickle

from ..._ext import ext

__all__ = ["CodecError", "encode", "decode", "value_key"]

_PICKLED = b"BGP1"
_TYPED = b"BGV1"

# value_codec.h's tags and element types.
_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _LIST, _TUPLE, _DICT, _ARRAY = range(11)
_TORCH, _NUMPY = 0, 1
_ELEMS = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64", "complex64", "complex128"]
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_DEPTH = 64

_process_key = None


class CodecError(ValueError):
    """A cached value that is damaged, foreign (another job's key) or planted."""


class _Unsupported(Exception):
    pass


def value_key():
    """The key pickled samples are authenticated with: derived from the job key, else a random
    key of this process."""
    global _process_key
    if _process_key is None:
        k = ext.cache_value_key()
        _process_key = k if k is not None else os.urandom(32)
    return _process_key


def _torch():
    import torch

    return torch


def _elem_of_torch(dtype):
    torch = _torch()
    table = {torch.bool: 0, torch.uint8: 1, torch.int8: 2, torch.int16: 3, torch.int32: 4,
             torch.int64: 5, torch.float16: 6, torch.bfloat16: 7, torch.float32: 8,
             torch.float64: 9, torch.complex64: 10, torch.complex128: 11}
    return table.get(dtype)


def _items(obj, out, depth=0):
    if depth > _MAX_DEPTH:
        raise _Unsupported()
    if obj is None:
        out.append((_NONE,))
    elif obj is True:
        out.append((_TRUE,))
    elif obj is False:
        out.append((_FALSE,))
    elif type(obj) is int:
        if not _INT64[0] <= obj <= _INT64[1]:
            raise _Unsupported()
        out.append((_INT, obj))
    elif type(obj) is float:
        out.append((_FLOAT, obj))
    elif type(obj) is str:
        out.append((_STR, obj))
    elif type(obj) in (bytes, bytearray):
        out.append((_BYTES, bytes(obj)))
    elif type(obj) in (list, tuple):
        out.append((_LIST if type(obj) is list else _TUPLE, len(obj)))
        for x in obj:
            _items(x, out, depth + 1)
    elif type(obj) is dict:
        out.append((_DICT, len(obj)))
        for k, v in obj.items():
            _items(k, out, depth + 1)
            _items(v, out, depth + 1)
    else:
        _array_item(obj, out)


def _array_item(obj, out):
    torch = _torch()
    if type(obj) is torch.Tensor:  # not a subclass (nn.Parameter and friends carry more)
        elem = _elem_of_torch(obj.dtype)
        if elem is None or obj.is_sparse or obj.device.type != "cpu" or obj.requires_grad:
            raise _Unsupported()
        flat = obj.detach().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        out.append((_ARRAY, elem, _TORCH, list(obj.shape), data))
        return
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch
        raise _Unsupported()
    if type(obj) is np.ndarray and obj.dtype.name in _ELEMS and obj.dtype.name != "bfloat16":
        a = np.ascontiguousarray(obj)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        out.append((_ARRAY, _ELEMS.index(a.dtype.name), _NUMPY, list(a.shape), a.tobytes()))
        return
    raise _Unsupported()


def _array(elem, flavor, shape, data):
    if elem >= len(_ELEMS):
        raise CodecError("unknown element type {}".format(elem))
    name = _ELEMS[elem]
    if flavor == _NUMPY:
        import numpy as np

        if name == "bfloat16":
            raise CodecError("a numpy array of bfloat16")
        return np.frombuffer(data, dtype=np.dtype(name).newbyteorder("<")).reshape(shape).copy()
    if flavor != _TORCH:
        raise CodecError("unknown array flavor {}".format(flavor))
    torch = _torch()
    dtype = getattr(torch, name)
    if len(data) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def _build(items):
    """The value of pre-order items (the codec checked their structure)."""
    pos = 0

    def one():
        nonlocal pos
        it = items[pos]
        pos += 1
        tag = it[0]
        if tag == _NONE:
            return None
        if tag == _TRUE:
            return True
        if tag == _FALSE:
            return False
        if tag in (_INT, _FLOAT, _STR, _BYTES):
            return it[1]
        if tag == _LIST:
            return [one() for _ in range(it[1])]
        if tag == _TUPLE:
            return tuple(one() for _ in range(it[1]))
        if tag == _DICT:
            d = {}
            for _ in range(it[1]):
                k = one()
                try:
                    d[k] = one()
                except TypeError:  # an unhashable key: not something we wrote
                    raise CodecError("a dict key of type {}".format(type(k).__name__))
            return d
        if tag == _ARRAY:
            return _array(it[1], it[2], list(it[3]), it[4])
        raise CodecError("unknown tag {}".format(tag))

    return one()


def _tag(key, cache_key, pickled):
    m = hmac.new(key, digestmod=hashlib.sha256)
    m.update(_PICKLED)
    m.update(cache_key.encode())
    m.update(b"\0")
    m.update(pickled)
    return m.digest()


def encode(obj, cache_key):
    """``obj`` as cache bytes (typed when it can be, else an authenticated pickle)."""
    items = []
    try:
        _items(obj, items)
        return ext.cache_encode(items)
    except _Unsupported:
        pass
    pickled = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _PICKLED + _tag(value_key(), cache_key, pickled) + pickled


def decode(data, cache_key):
    """The value of cache bytes written by ``encode`` for ``cache_key``; ``CodecError`` when they
    are damaged, another job's, or not ours at all (a bare pickle is never loaded)."""
    data = bytes(data)
    if data[:4] == _TYPED:
        try:
            items = ext.cache_decode(data)
        except RuntimeError as e:
            raise CodecError(str(e)) from None
        try:
            return _build(items)
        except (ValueError, TypeError, RuntimeError, RecursionError) as e:
            raise CodecError("typed value: {}".format(e)) from None
    if data[:4] == _PICKLED and len(data) >= 36:
        tag, pickled = data[4:36], data[36:]
        if not hmac.compare_digest(tag, _tag(value_key(), cache_key, pickled)):
            raise CodecError("a pickled value whose tag does not verify under this job's key "
                             "(planted, damaged, or another job's)")
        return pickle.loads(pickled)
    raise CodecError("neither a typed nor an authenticated value ({} bytes, starting {!r})"
                     .format(len(data), data[:8]))
