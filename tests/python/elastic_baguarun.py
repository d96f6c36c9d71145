"""baguarun across nodes: two network namespaces as two nodes.

* static: ``baguarun --nnodes 2 --node_rank R --master_addr node0 --nproc_per_node 2`` on each
  node runs the C++ demo trainer as one world of 4 (hierarchical: two ranks per node), both
  nodes finish and report the same world;
* elastic: ``baguarun --nnodes 2:2 --rdzv_endpoint node0:P`` hands over to
  ``python -m bagua.distributed.run ... --no_python`` (torchrun) on each node, which runs the
  same C++ trainer with torchrun's variables.

Skips with the reason where namespaces are refused. Run by the 'python_elastic_baguarun' meson test.
"""

import os
import sys

import pytest

import harness
from elastic_netns import Nodes


def tools():
    exe = harness.baguarun_exe()
    demo = os.path.join(os.path.dirname(os.path.dirname(exe)), "train_demo", "bagua-train-demo")
    if not os.access(demo, os.X_OK):
        pytest.skip("no bagua-train-demo next to baguarun ({})".format(demo))
    return exe, demo


def run_two_nodes(tmp_path, argv_of, timeout=180):
    env = dict(os.environ, OMP_NUM_THREADS="1", BAGUA_RENDEZVOUS_TIMEOUT_MS="60000",
               BAGUA_COLLECTIVE_TIMEOUT_MS="60000", PYTHONUNBUFFERED="1")
    with Nodes(2) as nodes:
        why = nodes.refused()
        if why:
            pytest.skip("network namespaces unavailable: " + why)
        logs = [str(tmp_path / "node{}.txt".format(i)) for i in range(2)]
        procs = [nodes.start(i, argv_of(nodes, i), env, logs[i]) for i in range(2)]
        for p in procs:
            p.wait(timeout=timeout)
        outs = [open(f, errors="replace").read() for f in logs]
        for i, p in enumerate(procs):
            assert p.returncode == 0, "node {} exited {}\n{}".format(i, p.returncode,
                                                                      outs[i][-4000:])
        return outs


def test_static_two_nodes(tmp_path):
    exe, demo = tools()
    outs = run_two_nodes(tmp_path, lambda nodes, i: [
        exe, "--nnodes", "2", "--node_rank", str(i), "--nproc_per_node", "2",
        "--master_addr", nodes.host(0), "--master_port", "29510", "--",
        demo, "--steps", "30", "--hierarchical"])
    for i, o in enumerate(outs):
        assert "ranks {}..{} of 4".format(2 * i, 2 * i + 1) in o, o[-3000:]
    assert "over 4 ranks" in outs[0], outs[0][-3000:]  # rank 0 reports the whole world


def test_elastic_hands_over_to_torchrun(tmp_path):
    exe, demo = tools()
    outs = run_two_nodes(tmp_path, lambda nodes, i: [
        exe, "--nnodes", "2:2", "--nproc_per_node", "1",
        "--rdzv_endpoint", "{}:29411".format(nodes.addr(0)), "--rdzv_id", "bgr",
        "--rdzv_conf", "is_host={}".format(int(i == 0)),
        "--torchrun", "{} -m bagua.distributed.run".format(sys.executable), "--",
        demo, "--steps", "30"])
    for o in outs:
        assert "handing over to torchrun" in o and "--no_python" in o, o[-3000:]
    assert any("over 2 ranks" in o for o in outs), outs[0][-3000:] + outs[1][-3000:]
