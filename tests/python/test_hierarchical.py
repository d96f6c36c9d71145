"""Algorithms with Bagua's hierarchical=True defaults on the default group, on new_group and on
from_torch_group (Bagua's groups always carry intra- and inter-node communicators): one node of
2 ranks and 2 nodes of 2 ranks, launched by baguarun."""

import os
import subprocess
import sys
import tempfile

import pytest
import torch

import harness
import worker_base

LR = 0.05
STEPS = 6
# Bagua's defaults: hierarchical=True everywhere (gradient_allreduce: asked for).
ALGOS = {
    "lpd": ("low_precision_decentralized", {}),
    "bytegrad": ("bytegrad", {}),
    "decentralized": ("decentralized", {}),
    "qadam": ("qadam", {"opt": {"warmup_steps": 3}}),
    "gar": ("gradient_allreduce", {"hierarchical": True}),
}
GROUPS = ("default", "new_group", "torch")


def _items():
    items = {}
    for name, (algo, kw) in ALGOS.items():
        for g in GROUPS:
            args = {"algorithm": algo, "steps": STEPS, "lr": LR if algo != "qadam" else 1e-2,
                    "kwargs": kw, "reference": algo == "gradient_allreduce"}
            if g != "default":
                args["group"] = g
            # The upstream LPD test wraps with DistributedDataParallel.
            if algo == "low_precision_decentralized" and g == "new_group":
                args["wrapper"] = "ddp"
            items["{}_{}".format(name, g)] = {"func": "train", "args": args}
    return items


def _run_nodes(nodes, local, items, timeout=240):
    """``nodes`` baguarun processes on this host (--nnodes, --node_rank), ``local`` ranks each."""
    exe = harness.baguarun_exe()
    import json

    port = harness.free_port()
    with tempfile.TemporaryDirectory(prefix="bagua_py_") as out:
        # With GPUs, each node is a host of its own to NCCL (NCCL_HOSTID): node k's local rank j
        # takes cuda:j like node 0's, which NCCL refuses within one host ("invalid usage"); the
        # nodes then talk over the network path, as real ones do.
        env = [dict(os.environ, **harness.COMMON_ENV, NCCL_HOSTID="bagua-test-node{}".format(k),
                    NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1") for k in range(nodes)]
        procs = [subprocess.Popen(
            [exe, "--nproc_per_node", str(local), "--nnodes", str(nodes), "--node_rank", str(k),
             "--master_addr", "127.0.0.1", "--master_port", str(port), "--", sys.executable,
             os.path.join(harness.HERE, "workers.py"), "bundle", out,
             json.dumps({"items": items})],
            env=env[k], stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for k in range(nodes)]
        logs = [(rc, o) for rc, o, _ in harness.communicate_all(procs, timeout)]
        assert all(rc == 0 for rc, _ in logs), "\n".join(
            "---- node {} (exit {}) ----\n{}".format(k, rc, o[-4000:])
            for k, (rc, o) in enumerate(logs))
        outs = harness.load_ranks(out, nodes * local)
    return {k: [o[k] for o in outs] for k in items}


@pytest.fixture(scope="module")
def one_node():
    return _run_nodes(1, 2, _items())


@pytest.fixture(scope="module")
def two_nodes():
    items = {k: v for k, v in _items().items() if k.split("_")[0] in ("lpd", "bytegrad", "gar")}
    return _run_nodes(2, 2, items)


def _q(d):
    """MinMaxUInt8 (Bagua's compressor) round trip, float32, round half to even."""
    mn, mx = d.min(), d.max()
    scale = 255.0 / (mx - mn + 1e-7)
    upper = torch.round(mx * scale)
    lower = upper - 255.0
    level = torch.clamp(torch.round(d * scale), max=upper) - lower
    return (level.clamp(0, 255).to(torch.uint8).float() + lower) / scale


def _lpd_reference(init, nodes, local, steps, lr):
    """Bagua's hierarchical low-precision decentralized SGD (its test's torch model): each
    node averages its ranks' locally stepped weights, the node leaders run the low-precision
    ring among themselves (one node: the leader is its own left and right peer), the node's
    ranks take the result."""
    model = worker_base.Net()
    cur = [init.clone() for _ in range(nodes)]
    w = [init.clone() for _ in range(nodes)]
    left = [init.clone() for _ in range(nodes)]
    right = [init.clone() for _ in range(nodes)]
    for step in range(steps):
        xs = []
        for k in range(nodes):
            acc = torch.zeros_like(init)
            for j in range(local):
                with torch.no_grad():
                    torch.nn.utils.vector_to_parameters(cur[k].clone(), model.parameters())
                model.zero_grad()
                x, y = worker_base.data(k * local + j, step)
                torch.nn.functional.mse_loss(model(x), y).backward()
                torch.optim.SGD(model.parameters(), lr=lr).step()  # the rank's local step
                acc += worker_base.flat(model)
            xs.append(acc / local)
        # The core's arithmetic: x + l / 3 + r / 3 - 5 / 3 w with float32 thirds.
        ds = [_q(xs[k] + left[k] * (1.0 / 3) + right[k] * (1.0 / 3) - w[k] * (5.0 / 3))
              for k in range(nodes)]
        for k in range(nodes):
            left[k] += ds[(k - 1) % nodes]
            right[k] += ds[(k + 1) % nodes]
            cur[k] = w[k] + ds[k]
            w[k] = cur[k].clone()
    return cur


def _check(outs, nodes, local, name):
    algo = name.split("_")[0]
    for o in outs:
        assert torch.isfinite(o["final"]).all() and not torch.equal(o["final"], o["init"])
        assert torch.equal(o["init"], outs[0]["init"])  # rank 0's weights at the wrap
    if algo == "decentralized":
        return  # per-rank models by design; it trained (finite, moved)
    per_node = [outs[k * local:(k + 1) * local] for k in range(nodes)]
    for node in per_node:  # bitwise equal inside a node (the leader's result, broadcast)
        for o in node[1:]:
            assert torch.equal(o["final"], node[0]["final"]), name
    if algo == "lpd":
        ref = _lpd_reference(outs[0]["init"], nodes, local, STEPS, LR)
        for k in range(nodes):
            assert torch.allclose(per_node[k][0]["final"], ref[k], rtol=1e-5, atol=1e-5), \
                (name, k, (per_node[k][0]["final"] - ref[k]).abs().max())
        if nodes == 1:
            # One node: the replicas are the leader's own compressed steps.
            reps = outs[0]["replicas"]
            assert torch.equal(reps["left"], reps["right"])
    if algo in ("gar", "bytegrad"):
        for o in outs[1:]:  # all-reduced: every rank equal
            assert torch.equal(o["final"], outs[0]["final"]), name
    if algo == "gar":
        assert torch.allclose(outs[0]["final"], outs[0]["reference"], rtol=1e-5, atol=1e-6)
    if algo == "bytegrad":  # compressed, close to the exact average's training
        ref = worker_base.reference(outs[0]["init"], nodes * local, STEPS, LR, "gradient_allreduce")
        assert torch.allclose(outs[0]["final"], ref, atol=2e-2)


@pytest.mark.parametrize("name", sorted(_items()))
def test_hierarchical_defaults_one_node(one_node, name):
    _check(one_node[name], 1, 2, name)


@pytest.mark.parametrize("name", [k for k in sorted(_items())
                                  if k.split("_")[0] in ("lpd", "bytegrad", "gar")])
def test_hierarchical_defaults_two_nodes(two_nodes, name):
    _check(two_nodes[name], 2, 2, name)


def test_node_layout_of_groups(monkeypatch):
    # 2 ranks per node: a group has hierarchical sub-groups when every node of it holds the
    # same number of its members.
    from bagua.torch_api.communication import _node_layout

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _node_layout([0, 1, 2, 3], 2) == (0, 2)
    assert _node_layout([0, 1, 2, 3], 1) == (1, 2)
    assert _node_layout([1, 3], 3) == (0, 1)  # one member per node: leaders only
    assert _node_layout([2, 3], 3) == (1, 2)  # one node
    assert _node_layout([0, 1, 2], 2) is None  # 2 + 1: no even layout
