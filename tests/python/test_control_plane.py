"""The control plane from Python: cached samples are never a bare pickle (a value planted in the
cache is a miss that runs nothing), the codec returns what it was given, and the launchers give
a single-node job a key of its own."""

import os
import pickle
import shutil

import numpy as np
import pytest
import torch

from bagua.distributed import _bagua_flags
from bagua.torch_api.contrib.cache_loader import CacheLoader
from bagua.torch_api.contrib.utils import codec


class Evil:
    """What an attacker plants: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch {}".format(self.marker),))


class Opaque:
    """A sample the typed codec does not know (it goes through the authenticated pickle)."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.v == self.v


def same(a, b):
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(same(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_tensor_dtype_round_trips_typed(dtype):
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(3, 5, generator=g) * 50).to(dtype)
    for x in (t, t.t(), t[1], torch.zeros((0, 4), dtype=dtype), t[0, 0].clone()):
        data = codec.encode(x, "ds_1")
        assert data[:4] == b"BGV1"  # typed, not a pickle
        assert same(codec.decode(data, "ds_1"), x.contiguous())


def test_samples_round_trip_and_only_unknown_types_are_pickled():
    sample = {"image": torch.arange(12, dtype=torch.float32).reshape(3, 4), "label": 7,
              "name": "café", "raw": b"\0\1", "weights": np.arange(6, dtype=np.float64),
              "aug": [None, True, 2.5, (False, -(1 << 63))], 3: "int key"}
    data = codec.encode(sample, "ds_1")
    assert data[:4] == b"BGV1"
    assert same(codec.decode(data, "ds_1"), sample)
    for odd in (Opaque(5), 1 << 70, torch.ones(2, requires_grad=True)):
        data = codec.encode(odd, "ds_2")
        assert data[:4] == b"BGP1"
        got = codec.decode(data, "ds_2")
        assert got == odd if not isinstance(odd, torch.Tensor) else torch.equal(got, odd)
        # Bound to its cache key: the same bytes under another key do not verify.
        with pytest.raises(codec.CodecError):
            codec.decode(data, "ds_3")


def test_damaged_foreign_and_bare_values_are_refused():
    data = codec.encode({"x": torch.ones(4)}, "ds_1")
    for cut in (5, len(data) // 2, len(data) - 1):
        with pytest.raises(codec.CodecError):
            codec.decode(data[:cut], "ds_1")
    with pytest.raises(codec.CodecError):
        codec.decode(data + b"!", "ds_1")
    with pytest.raises(codec.CodecError):
        codec.decode(pickle.dumps([1, 2, 3]), "ds_1")  # Bagua's format: never loaded
    pickled = codec.encode(Opaque(1), "ds_1")
    flipped = pickled[:-1] + bytes([pickled[-1] ^ 1])
    with pytest.raises(codec.CodecError):
        codec.decode(flipped, "ds_1")
    saved = codec._process_key
    try:
        codec._process_key = b"another job's key, not this one!"
        foreign = codec.encode(Opaque(1), "ds_1")
    finally:
        codec._process_key = saved
    with pytest.raises(codec.CodecError):
        codec.decode(foreign, "ds_1")


def planted_value_is_a_miss(backend, tmp_path, **kwargs):
    marker = tmp_path / "planted-code-ran"
    loader = CacheLoader(backend=backend, dataset_name="planted", writer_buffer_size=1, **kwargs)
    # What an outsider writes: Bagua's format (a bare pickle) holding a command, and a pickle
    # in our envelope with a made-up tag.
    loader.store.set("planted_0", pickle.dumps(Evil(str(marker))))
    evil = pickle.dumps(Evil(str(marker)))
    loader.store.set("planted_1", b"BGP1" + b"\0" * 32 + evil)
    loader.store.set("planted_2", b"BGV1\x07" + b"\xff" * 8)  # a list of 2^64-1 elements
    calls = []

    def load(k):
        calls.append(k)
        return {"sample": k, "t": torch.full((2,), float(k))}

    for k in range(3):
        got = loader.get(k, load)
        assert got["sample"] == k and torch.equal(got["t"], torch.full((2,), float(k)))
    assert calls == [0, 1, 2]
    assert not marker.exists(), "a planted pickle ran"
    stats = loader.stats()
    assert stats["corrupt"] == 3
    # The planted values were replaced by the loaded ones: hits now, decoded typed.
    loader.flush()
    for k in range(3):
        got = loader.get(k, load)
        assert got["sample"] == k
    assert calls == [0, 1, 2]
    assert loader.stats()["hits"] == 3


def test_a_value_planted_in_the_embedded_cache_is_a_miss(tmp_path):
    planted_value_is_a_miss("embedded", tmp_path)


@pytest.mark.skipif(shutil.which("redis-server") is None and
                    not os.path.exists("/usr/bin/redis-server"),
                    reason="redis-server is not installed")
def test_a_value_planted_in_redis_is_a_miss(tmp_path):
    planted_value_is_a_miss("redis", tmp_path, capacity_per_node=64 << 20)


def test_launchers_give_a_single_node_job_its_own_key(monkeypatch):
    monkeypatch.delenv("BAGUA_JOB_KEY", raising=False)
    monkeypatch.delenv("BAGUA_JOB_KEY_FILE", raising=False)
    a = _bagua_flags.job_key_env(True)["BAGUA_JOB_KEY"]
    b = _bagua_flags.job_key_env(True)["BAGUA_JOB_KEY"]
    assert len(a) == 64 and int(a, 16) >= 0 and a != b
    assert _bagua_flags.job_key_env(False) == {}
    monkeypatch.setenv("BAGUA_JOB_KEY", "the-users-own-key-0123456789abcdef")
    assert _bagua_flags.job_key_env(True) == {}
    assert _bagua_flags.single_node("1") and _bagua_flags.single_node("1:1")
    assert not _bagua_flags.single_node("2") and not _bagua_flags.single_node("1:4")
