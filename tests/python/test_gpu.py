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
                 "device": "cuda"},
    # The default runs the device buckets at do_flatten's gradients (in_place_device_buckets); these
    # turn it off: gradients copied into reducer buckets and back.
    "gar_core_copies": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                        "device": "cuda", "in_place": False},
    "bytegrad_copies": {"algorithm": "bytegrad", "steps": 10, "reference": True,
                        "device": "cuda", "kwargs": {"hierarchical": False}, "in_place": False},
    "gar_ddp_noflat": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                       "device": "cuda", "wrapper": "ddp"},
    "bytegrad": {"algorithm": "bytegrad", "steps": 10, "reference": True, "device": "cuda",
                 "kwargs": {"hierarchical": False}},
    "decentralized": {"algorithm": "decentralized", "steps": 8, "device": "cuda",
                      "kwargs": {"hierarchical": False}},
    "lp_decentralized": {"algorithm": "low_precision_decentralized", "steps": 6,
                         "device": "cuda", "kwargs": {"hierarchical": False}},
    # QAdam on CUDA parameters (m / v on the device, the core's kernels) through the core reducer.
    "qadam_warmup": {"algorithm": "qadam", "steps": 8, "lr": 1e-2, "device": "cuda",
                     "kwargs": {"opt": {"warmup_steps": 100}, "algo": {"hierarchical": False}}},
    # The default eps (1e-8): elements whose gradient was exactly zero through the warm-up (dead
    # ReLU units: v = 0) are held by hold_zero_variance=True (our option; the default is Bagua's
    # exact update, which diverges here: CPU path 0.973 -> 1.204 over these 16 steps,
    # tests/python/test_training.py).
    "qadam_compressed": {"algorithm": "qadam", "steps": 16, "lr": 1e-2, "device": "cuda",
                         "kwargs": {"opt": {"warmup_steps": 4, "hold_zero_variance": True},
                                    "algo": {"hierarchical": False}}},
    # Async model average on CUDA weights (the averaging thread on its own stream).
    "async": {"algorithm": "async", "steps": 30, "device": "cuda",
              "kwargs": {"sync_interval_ms": 5, "warmup_steps": 3}},
}


@pytest.fixture(scope="module")
def runs():
    items = {k: {"func": "train", "args": v} for k, v in SCENARIOS.items()}
    items["comm"] = {"func": "comm_basic", "args": {"device": "cuda"}}
    outs = harness.run("bundle", 2, {"items": items}, timeout=240)
    return {k: [o[k] for o in outs] for k in items}


def test_nccl_collectives(runs):
    comm_checks.check_collectives(runs["comm"], 2)


@pytest.mark.parametrize("name", ["gar_core", "gar_core_copies", "gar_ddp_noflat"])
def test_gradient_allreduce_cuda_equals_single_process(runs, name):
    outs = runs[name]
    assert torch.equal(outs[0]["init"], outs[1]["init"])
    assert torch.equal(outs[0]["final"], outs[1]["final"])
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["bytegrad", "bytegrad_copies"])
def test_bytegrad_cuda(runs, name):
    outs = runs[name]
    assert torch.equal(outs[0]["final"], outs[1]["final"])
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], atol=2e-3)


@pytest.mark.parametrize("name", ["gar_core", "gar_core_copies", "bytegrad", "bytegrad_copies"])
def test_cuda_buckets_in_place_unless_turned_off(runs, name):
    # Device buckets run at do_flatten's layout by default (in_place_device_buckets): every bucket
    # does, and the gradients are the layout; turned off, none does.
    in_place, buckets = runs[name][0]["in_place"]
    if SCENARIOS[name].get("in_place", True):
        assert buckets >= 1 and in_place == buckets, runs[name][0]["in_place"]
        assert runs[name][0]["grads_at_layout"][0] == runs[name][0]["grads_at_layout"][1] > 0
    else:
        assert in_place == 0


@pytest.mark.parametrize("name", ["decentralized", "lp_decentralized"])
def test_decentralized_cuda_runs(runs, name):
    for o in runs[name]:
        assert torch.isfinite(o["final"]).all()
        assert all(l == l for l in o["losses"])


def _train_loss(weights, steps):
    """MSE of the test model with `weights` (CPU) over every batch both ranks trained on."""
    import worker_base
    model = worker_base.Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(weights.clone(), model.parameters())
        xs, ys = zip(*[worker_base.data(r, s) for r in range(2) for s in range(steps)])
        return torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).item()


def test_qadam_cuda_warmup_equals_adam(runs):
    # Warm-up QAdam is Adam on the averaged gradient: 2 ranks on CUDA == torch Adam (CPU) on the
    # concatenated batch from the same start. Tolerance rtol 1e-4, atol 1e-5: the GPU's
    # reduction order differs from the CPU's (the CPU case holds to 1e-5 / 1e-6).
    import worker_base
    outs = runs["qadam_warmup"]
    assert torch.equal(outs[0]["init"], outs[1]["init"])
    assert torch.equal(outs[0]["final"], outs[1]["final"])
    model = worker_base.Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(outs[0]["init"].clone(), model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(8):
        opt.zero_grad()
        xs, ys = zip(*[worker_base.data(r, step) for r in range(2)])
        torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    ref = worker_base.flat(model)
    assert not torch.equal(outs[0]["final"], outs[0]["init"])
    assert torch.allclose(outs[0]["final"], ref, rtol=1e-4, atol=1e-5), \
        "max |qadam - adam| = {}".format((outs[0]["final"] - ref).abs().max().item())


def test_qadam_cuda_compressed_stage(runs):
    # 16 steps with warmup_steps 4: 12 compressed steps. The ranks stay bitwise equal (every
    # rank applies the same decompressed momentum) and the loss over the training batches falls.
    outs = runs["qadam_compressed"]
    assert torch.equal(outs[0]["init"], outs[1]["init"])
    assert torch.equal(outs[0]["final"], outs[1]["final"])
    assert torch.isfinite(outs[0]["final"]).all()
    assert all(l == l for o in outs for l in o["losses"])
    before = _train_loss(outs[0]["init"], 16)
    after = _train_loss(outs[0]["final"], 16)
    assert after < before, "loss {} -> {}".format(before, after)


def test_async_model_average_cuda(runs):
    # The averaging thread ran (rounds), training moved the weights, everything stayed finite,
    # and abort() (twice: the second is a no-op) shut the thread down on both ranks (the worker
    # returned).
    outs = runs["async"]
    assert torch.equal(outs[0]["init"], outs[1]["init"])  # broadcast at wrap
    for o in outs:
        assert o["rounds"] >= 1
        assert torch.isfinite(o["final"]).all()
        assert all(l == l for l in o["losses"])
        assert not torch.equal(o["final"], o["init"])
    # Training progressed: the loss over every batch both ranks trained on fell on each rank.
    for o in outs:
        before = _train_loss(o["init"], 30)
        after = _train_loss(o["final"], 30)
        assert after < before, "loss {} -> {}".format(before, after)


def test_a_model_freed_at_different_moments_on_each_rank_does_not_hold_the_others():
    # Rank 0 keeps a decentralized model (its exchange group: an NCCL communicator of its own)
    # while rank 1 frees its copy and both train a new model; rank 0 frees the old one at the end.
    # NCCL's ncclCommDestroy waits for the peers on the host to destroy theirs, so rank 1 used to
    # block in the free while rank 0 waited for it in the new model's collectives (a hang until
    # the 30 s collective timeout: how test_nccl_collectives' bundle failed on 2 GPUs).
    outs = harness.run("drop_unevenly", 2, {"device": "cuda"}, timeout=150)
    for o in outs:
        assert all(s < 20 for s in o["seconds"]), o["seconds"]
        assert all(l == l for losses in o["losses"] for l in losses)


def test_a_model_on_another_device_than_the_group_is_refused_clearly():
    # LOCAL_RANK's device at init (nothing selected before); a model on the other GPU is refused
    # with an error naming both devices and the fix (NCCL crashed the process with an illegal
    # memory access before: step 80's link10 on 2 GPUs, 2026-11-26); one on the group's device
    # trains, weights equal on both ranks.
    outs = harness.run("device_choice", 2, {}, timeout=120)
    assert [o["device"] for o in outs] == [0, 1]
    for o in outs:
        assert "is on cuda:{} but the process group communicates on cuda:{}".format(
            1 - o["device"], o["device"]) in o["wrong"], o["wrong"]
        assert "torch.cuda.set_device() before bagua.init_process_group()" in o["wrong"]
        assert all(l == l for l in o["losses"])
    assert outs[0]["weights"] == outs[1]["weights"]
