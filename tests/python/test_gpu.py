"""CUDA tensors over NCCL on 2 GPUs (the GPU machine; skips elsewhere with the reason)."""

import pytest
import torch

import comm_checks
import harness

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 visible CUDA GPUs (found {})".format(
        torch.cuda.device_count() if torch.cuda.is_available() else 0), allow_module_level=True)

import _bagua_ext  # noqa: E402

if not _bagua_ext.HAVE_NCCL:
    pytest.skip("the extension was built without NCCL", allow_module_level=True)

SCENARIOS = {
    "gar_core": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                 "device": "cuda", "cuda_reducer": "core"},
    "gar_python": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                   "device": "cuda", "cuda_reducer": "python"},
    "gar_ddp_noflat": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                       "device": "cuda", "wrapper": "ddp"},
    "bytegrad": {"algorithm": "bytegrad", "steps": 10, "reference": True, "device": "cuda",
                 "kwargs": {"hierarchical": False}},
    "decentralized": {"algorithm": "decentralized", "steps": 8, "device": "cuda",
                      "kwargs": {"hierarchical": False}},
    "lp_decentralized": {"algorithm": "low_precision_decentralized", "steps": 6,
                         "device": "cuda", "kwargs": {"hierarchical": False}},
}


@pytest.fixture(scope="module")
def runs():
    items = {k: {"func": "train", "args": v} for k, v in SCENARIOS.items()}
    items["comm"] = {"func": "comm_basic", "args": {"device": "cuda"}}
    outs = harness.run("bundle", 2, {"items": items}, timeout=240)
    return {k: [o[k] for o in outs] for k in items}


def test_nccl_collectives(runs):
    comm_checks.check_collectives(runs["comm"], 2)


@pytest.mark.parametrize("name", ["gar_core", "gar_python", "gar_ddp_noflat"])
def test_gradient_allreduce_cuda_equals_single_process(runs, name):
    outs = runs[name]
    assert torch.equal(outs[0]["init"], outs[1]["init"])
    assert torch.equal(outs[0]["final"], outs[1]["final"])
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], rtol=1e-4, atol=1e-5)


def test_bytegrad_cuda(runs):
    outs = runs["bytegrad"]
    assert torch.equal(outs[0]["final"], outs[1]["final"])
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], atol=2e-3)


@pytest.mark.parametrize("name", ["decentralized", "lp_decentralized"])
def test_decentralized_cuda_runs(runs, name):
    for o in runs[name]:
        assert torch.isfinite(o["final"]).all()
        assert all(l == l for l in o["losses"])
