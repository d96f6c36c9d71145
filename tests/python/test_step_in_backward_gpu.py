"""The optimizer inside the backward pass on CUDA, 2 GPUs over NCCL (the GPU machine; skips
elsewhere with the reason): with_bagua + fuse_optimizer(AdamW), each bucket stepped inside the
backward pass on the side stream (in-place buckets: fuse_optimizer before with_bagua) or, for
buckets copied back on the trainer's stream (Bagua's order: with_bagua, then fuse_optimizer),
after finish_backward, equals the same run stepped after backward bit for bit over 110 steps
(weights and losses), zero_grad(set_to_none=True), torch's default (foreach) AdamW; every bucket
of the last backward was stepped there."""

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 visible CUDA GPUs (found {})".format(
        torch.cuda.device_count() if torch.cuda.is_available() else 0), allow_module_level=True)

import _bagua_ext  # noqa: E402

if not _bagua_ext.HAVE_NCCL:
    pytest.skip("the extension was built without NCCL", allow_module_level=True)

import test_step_in_backward as cpu  # noqa: E402

SPECS = {}
for order in ("fuse_first", "wrap_first"):
    for mode in ("in", "after"):
        SPECS["{}_{}".format(order, mode)] = {
            "scenario": "train", "opt": "adamw", "order": order, "set_to_none": True,
            "call": "fuse_step", "in_backward": mode == "in", "device": "cuda"}


@pytest.fixture(scope="module")
def runs():
    return cpu.launch(SPECS, timeout=240)


@pytest.mark.parametrize("order", ["fuse_first", "wrap_first"])
def test_cuda_stepping_inside_backward_equals_stepping_after(runs, order):
    for rank, o in enumerate(runs):
        got, ref = o[order + "_in"], o[order + "_after"]
        assert got["mode"] == "on", got["reason"]
        assert torch.equal(got["weights"], ref["weights"]), "rank {}".format(rank)
        assert torch.equal(got["losses"], ref["losses"]), "rank {}".format(rank)
        assert got["buckets"] >= 3 and got["stepped"][-1] == got["buckets"]
    assert torch.equal(runs[0][order + "_in"]["weights"], runs[1][order + "_in"]["weights"])
