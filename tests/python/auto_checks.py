"""algorithm="auto": the rule through ``AutoAlgorithm.choose`` with injected link speeds and
gradient volumes; two ranks training with auto (a choice made, the same on every rank, the
ranks' weights equal after it); pinning by argument, the argument beating BAGUA_ALGORITHM, and
unknown pins (argument or BAGUA_ALGORITHM) failing with the setting's name. The environment pin
training is the C++ suite's (algorithms_auto)."""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import harness
from bagua.torch_api.algorithms import Algorithm, AutoAlgorithm, GlobalAlgorithmRegistry

HERE = os.path.dirname(os.path.abspath(__file__))

# A GPT-like gradient layout: 4 buckets of 26 MB (768 x 3072 and 768 x 2304 matrices, vectors).
BUCKETS = [[768 * 3072, 3072, 768 * 3072, 768, 768 * 768 * 3, 768]] * 4
GRAD_BYTES = 4 * sum(sum(b) for b in BUCKETS)


def at(bandwidth, compute=0.02, registered=None):
    """The rule for a link of ``bandwidth`` bytes/s, the measured all-reduce step as its overlap
    model has it with half the compute hideable."""
    work = 4 * 50e-6 + GRAD_BYTES / bandwidth
    step = compute + max(0.0, work - 0.5 * compute)
    return AutoAlgorithm.choose(4, BUCKETS, compute, step, 50e-6, bandwidth, codec=200e9,
                                registered=registered)


def test_rule_follows_the_link():
    fast = at(100e9)
    assert fast["algorithm"] == "gradient_allreduce", fast["reason"]
    assert "0% of it exposed" in fast["reason"]
    slow = at(20e6)
    assert slow["algorithm"] == "powersgd" and "rank" in slow["args"], slow["reason"]
    labels = [c["label"] for c in slow["candidates"]]
    assert labels == ["gradient_allreduce", "bytegrad", "powersgd rank 16, 8-bit factors",
                      "powersgd rank 4", "powersgd rank 1"]
    assert slow["args"] == {"rank": "16", "quantize_factors": "true"}, slow["reason"]
    # The payload of the choice never grows as the link slows down.
    last = float("inf")
    bw = 100e9
    while bw >= 10e6:
        d = at(bw)
        pick = [c for c in d["candidates"]
                if c["algorithm"] == d["algorithm"] and c["args"] == d["args"]][0]
        assert pick["wire_bytes"] <= last, (bw, d["reason"])
        last = pick["wire_bytes"]
        bw /= 3


def test_rule_falls_back_when_powersgd_is_not_registered():
    d = at(20e6, registered=["gradient_allreduce", "bytegrad"])
    assert d["algorithm"] == "bytegrad", d["reason"]
    assert "is not registered in this build: fell back to bytegrad" in d["reason"]
    assert not [c for c in d["candidates"] if c["label"] == "powersgd rank 1"][0]["registered"]


def test_rule_rejects_impossible_figures():
    try:
        AutoAlgorithm.choose(2, BUCKETS, 0.0, 0.1, 0.0, 1e9)
    except Exception as e:  # the extension's InvalidArgument
        assert "measurements out of range" in str(e)
    else:
        raise AssertionError("a zero compute time was accepted")


def test_registry_and_arguments():
    a = Algorithm.init("auto", pin="bytegrad", probe_steps=3)
    assert isinstance(a, AutoAlgorithm) and a.pin == "bytegrad" and a.probe_steps == 3
    assert a._kwargs() == {"pin": "bytegrad", "probe_steps": 3}
    assert Algorithm.init("auto", start_iter=30)._kwargs() == {"start_iter": 30}
    for bad in (-1, 2.5, "10"):
        try:
            AutoAlgorithm(start_iter=bad)
        except ValueError as e:
            assert "start_iter" in str(e)
        else:
            raise AssertionError("start_iter={!r} accepted".format(bad))
    assert AutoAlgorithm()._kwargs() == {}
    assert GlobalAlgorithmRegistry["auto"]["algorithm"] is AutoAlgorithm
    for bad in (0, -1, 1.5):
        try:
            AutoAlgorithm(probe_steps=bad)
        except ValueError as e:
            assert "probe_steps" in str(e)
        else:
            raise AssertionError("probe_steps={} accepted".format(bad))
    assert AutoAlgorithm().decision()["algorithm"] == ""


def run_ranks(world, scenarios, env=None, timeout=150):
    """Each rank's list of scenario results (auto_worker.py, one process a rank)."""
    port = harness.free_port()
    with tempfile.TemporaryDirectory(prefix="bagua_auto_") as out:
        procs = []
        for r in range(world):
            e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                     WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                     **harness.COMMON_ENV)
            e.pop("BAGUA_ALGORITHM", None)
            e.update(env or {})
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "auto_worker.py"), out,
                 json.dumps(scenarios)],
                env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        failed = []
        outputs = []
        for r, (rc, o, timed_out) in enumerate(harness.communicate_all(procs, timeout)):
            outputs.append(o)
            if rc != 0 or timed_out:
                failed.append("rank {}: exit {}{}".format(r, rc, " (timed out)" if timed_out
                                                          else ""))
        assert not failed, "; ".join(failed) + "\n" + "\n".join(o[-3000:] for o in outputs)
        return harness.load_ranks(out, world)


@pytest.fixture(scope="module")
def two_ranks():
    """One launch of 2 ranks: auto measuring and choosing, pinned by argument, a bad pin."""
    return run_ranks(2, [{"kwargs": {"probe_steps": 2}, "steps": 14},
                         {"kwargs": {"pin": "bytegrad"}, "steps": 4},
                         {"kwargs": {"pin": "decentralized"}, "steps": 1}])


def test_two_ranks_probe_choose_and_agree(two_ranks):
    r0, r1 = two_ranks[0][0], two_ranks[1][0]
    d0, d1 = r0["decision"], r1["decision"]
    assert d0["algorithm"] in ("gradient_allreduce", "bytegrad", "powersgd"), d0
    assert d0["reason"].startswith("chose "), d0["reason"]
    # probe_steps 2: decided at the early check (2 warm-up + 2 timed steps) or after one
    # compute-only step more.
    assert d0["probe_steps"] in (4, 5), d0
    assert "[decided after {} probe steps]".format(d0["probe_steps"]) in d0["reason"], d0
    assert (d0["algorithm"], d0["args"], d0["reason"]) == (d1["algorithm"], d1["args"],
                                                           d1["reason"])
    assert [c["label"] for c in d0["candidates"]][:2] == ["gradient_allreduce", "bytegrad"]
    if d0["algorithm"] != "powersgd":  # exact averaging: the ranks stay bitwise equal
        assert torch.equal(r0["weights"], r1["weights"])
    for r in (r0, r1):
        assert all(torch.isfinite(torch.tensor(r["losses"])))


def test_pinned_by_argument(two_ranks):
    r0, r1 = two_ranks[0][1], two_ranks[1][1]
    assert r0["decision"]["algorithm"] == "bytegrad"
    assert r0["decision"]["reason"] == "pinned to bytegrad by pin"
    assert torch.equal(r0["weights"], r1["weights"])


def test_unknown_pins_name_the_setting(two_ranks):
    err = two_ranks[0][2].get("error", "")
    assert "pin='decentralized' is not an algorithm auto can pin" in err, err
    # BAGUA_ALGORITHM is read once a process: its own launch (one rank), where the argument
    # still beats it.
    res = run_ranks(1, [{"steps": 1}, {"kwargs": {"pin": "gradient_allreduce"}, "steps": 2}],
                    env={"BAGUA_ALGORITHM": "bytegard"})[0]
    err = res[0].get("error", "")
    assert "BAGUA_ALGORITHM='bytegard'" in err and "gradient_allreduce, bytegrad, powersgd" in err, \
        err
    assert res[1]["decision"]["reason"] == "pinned to gradient_allreduce by pin", res[1]
