"""The optimizer inside the backward pass, and gradient hooks with no Python per gradient
(data_parallel/step_in_backward.py, python/src/ext_hooks.cc), on CPU over the host backend,
2 ranks; every scenario runs in one launch (step_in_backward_workers.py).

* Bit for bit: 110 steps of with_bagua + fuse_optimizer with each bucket stepped inside the
  backward pass equal the same run stepped after backward (weights and every loss), for SGD
  (momentum, Nesterov, weight decay) and AdamW, both orders of with_bagua / fuse_optimizer,
  zero_grad(set_to_none) both ways, step() and fuse_step(); every bucket of the last backward
  was stepped inside it, and several buckets exist; under fuse_step() each bucket's fusion is
  kept from step to step, under step() it is made anew.
* Gradient clipping and a GradScaler (torch's CPU GradScaler where this torch has one, else its
  unscale_ done by hand): the optimizer steps after backward, the reason is logged, and the run
  equals the one that never steps inside backward.
* The loss curve equals torch DDP's (gloo, AdamW) bit for bit over 110 steps, and so do the
  weights.
* Structure: every gradient hook is the C++ GradReadyHook; the hooks call into Python once per
  backward (python_calls) however many parameters there are, and the Python calls made from
  bagua's package during loss.backward() do not grow with the parameter count (4 against 16
  layers).
* A loop that changes after stepping in backward started (a second backward before step(),
  clipping after the fact) gets a RuntimeError that names the switch.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import harness

HERE = os.path.dirname(os.path.abspath(__file__))

SPECS = {}
for opt, order, set_to_none, call in (("sgd", "fuse_first", False, "step"),
                                      ("adamw", "wrap_first", True, "fuse_step"),
                                      ("adamw", "fuse_first", True, "step")):
    for mode in ("in", "after"):
        SPECS["{}_{}_{}".format(opt, order, mode)] = {
            "scenario": "train", "opt": opt, "order": order, "set_to_none": set_to_none,
            "call": call, "in_backward": mode == "in"}
for extra in ("clip", "scaler"):
    for mode in ("in", "after"):
        SPECS["{}_{}".format(extra, mode)] = {
            "scenario": "train", "opt": "adamw", "order": "wrap_first", "set_to_none": True,
            "call": "fuse_step", "in_backward": mode == "in", "extra": extra}
SPECS["ddp"] = {"scenario": "torch_ddp"}
SPECS["count"] = {"scenario": "count_python", "layers": [4, 16]}
SPECS["misuse"] = {"scenario": "misuse"}


def launch(specs, timeout=240, world=2):
    """Runs step_in_backward_workers.py on `world` ranks over loopback with `specs`; each rank's
    {scenario: result}."""
    port = harness.free_port()
    with tempfile.TemporaryDirectory(prefix="bagua_sib_") as out:
        procs = []
        for r in range(world):
            env = dict(os.environ, **harness.COMMON_ENV)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                       BAGUA_DEFAULT_BUCKET_SIZE=str(128 * 1024))
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "step_in_backward_workers.py"), out,
                 json.dumps(specs)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        results = harness.communicate_all(procs, timeout)
        failed = ["rank {}: exit {}{}\n{}".format(r, rc, " (timed out)" if t else "", o[-4000:])
                  for r, (rc, o, t) in enumerate(results) if rc != 0 or t]
        assert not failed, "\n".join(failed)
        return harness.load_ranks(out, world)


@pytest.fixture(scope="module")
def runs():
    return launch(SPECS)


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("run", ["sgd_fuse_first", "adamw_wrap_first", "adamw_fuse_first"])
def test_stepping_inside_backward_equals_stepping_after(runs, run):
    for rank, o in enumerate(runs):
        got, ref = o[run + "_in"], o[run + "_after"]
        assert got["mode"] == "on", got["reason"]
        assert ref["mode"] == "off" and "BAGUA_OPTIM_STEP_IN_BACKWARD is off" in ref["reason"]
        assert _same(got["weights"], ref["weights"]), "rank {}: weights differ".format(rank)
        assert _same(got["losses"], ref["losses"]), "rank {}: losses differ".format(rank)
        assert len(got["losses"]) == 110
        # Several buckets, every one of the last backward stepped inside it; the first
        # iteration observes (nothing stepped inside it), every later one steps.
        assert got["buckets"] >= 3, got["buckets"]
        assert got["stepped"][-1] == got["buckets"]
        assert got["stepped"][0] == 0 and all(s > 0 for s in got["stepped"][1:])
        assert ref["stepped"] == [0] * 110
        assert got["fused_count"] == ref["fused_count"]
        # Each bucket keeps its fusion from step to step (no fusion derived, no state moved
        # inside backward) where the user calls fuse_step(); a plain step() retires the plans
        # (the per-parameter state is the optimizer's own again after it).
        plans = got["plans"]
        if SPECS[run + "_in"]["call"] == "fuse_step":
            assert len(plans[-1]) == got["buckets"], plans[-1]
            assert all(p == plans[-1] for p in plans[3:]), plans[:6]
        else:
            assert plans == [[]] * 110, plans[:6]
        assert ref["plans"] == [[]] * 110
    assert _same(runs[0][run + "_in"]["weights"], runs[1][run + "_in"]["weights"])


@pytest.mark.parametrize("extra", ["clip", "scaler"])
def test_what_needs_every_gradient_steps_after_backward(runs, extra):
    for rank, o in enumerate(runs):
        got, ref = o[extra + "_in"], o[extra + "_after"]
        assert got["mode"] == "off"
        assert "gradients changed between backward and optimizer.step()" in got["reason"] or \
            "called with arguments" in got["reason"], got["reason"]
        assert any("steps after the backward pass" in m for m in got["log"]), got["log"]
        assert got["stepped"] == [0] * 110
        assert _same(got["weights"], ref["weights"]), "rank {}".format(rank)
        assert _same(got["losses"], ref["losses"])


def test_loss_curve_equals_torch_ddp(runs):
    for rank, o in enumerate(runs):
        got, ddp = o["adamw_fuse_first_in"], o["ddp"]
        assert got["mode"] == "on"
        # Rank-local losses on rank-local batches: equal step for step, and so are the weights.
        assert _same(got["losses"], ddp["losses"]), "rank {}: max difference {}".format(
            rank, (got["losses"] - ddp["losses"]).abs().max())
        assert _same(got["weights"], ddp["weights"])


def test_gradient_hooks_run_no_python_per_gradient(runs):
    for o in runs:
        small, large = o["count"][4], o["count"][16]
        for c in (small, large):
            assert c["hook_state"] == "HookState"
            # Each parameter's hook ran once per backward (4 steps), Python once per backward.
            assert c["hook_calls"] == 4 * c["params"]
            assert c["python_calls"] == 4
            if torch.__version__ >= "2.1":
                assert c["hook_types"] == ["GradReadyHook"] * c["params"]
        assert large["params"] == 4 * small["params"]
        # The same Python work per backward with 4 times the parameters (the first backward
        # also rebuilds the buckets: compare the steady ones).
        assert small["calls"][1:] == large["calls"][1:], (small["calls"], large["calls"])
        assert max(large["calls"][1:]) <= 40, large["calls"]


def test_a_loop_that_changes_after_stepping_in_backward_is_an_error(runs):
    for o in runs:
        m = o["misuse"]
        assert "optimizer.step() was not called before this backward pass" in \
            m["two_backwards"]["error"]
        assert "BAGUA_OPTIM_STEP_IN_BACKWARD=0" in m["two_backwards"]["error"]
        assert "gradients changed between backward and optimizer.step()" in \
            m["clip_later"]["error"]
        assert m["clip_later"]["mode"] == "off"
