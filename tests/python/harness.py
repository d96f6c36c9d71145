"""Runs a worker function in N processes over loopback (env:// like torchrun) with a deadline.

Each process runs ``python workers.py <function> <outdir> <json-args>`` with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT; the function's
return value is written to <outdir>/rank<r>.pt (torch.save) and returned, rank by rank.
"""

import glob
import json
import os
import random
import socket
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


COMMON_ENV = {
    "BAGUA_RENDEZVOUS_TIMEOUT_MS": "30000",
    "BAGUA_COLLECTIVE_TIMEOUT_MS": "30000",
    "OMP_NUM_THREADS": "1",
}


def baguarun_exe():
    """The baguarun launcher that BAGUA_TEST_BAGUARUN names; the test skips, saying so, when it
    names none."""
    exe = os.environ.get("BAGUA_TEST_BAGUARUN", "")
    if not exe or not os.access(exe, os.X_OK):
        import pytest

        pytest.skip("BAGUA_TEST_BAGUARUN does not name the baguarun launcher ({!r})".format(exe))
    return exe


def load_ranks(out, world):
    """What ranks 0..world-1 of a workers.py run returned (``<out>/rank<r>.pt``)."""
    return [torch.load(os.path.join(out, "rank{}.pt".format(r))) for r in range(world)]


def communicate_all(procs, timeout):
    """(exit status, output, timed out) of each process, waiting up to ``timeout`` s for each;
    one that overruns gets every process killed."""
    results = []
    for p in procs:
        timed_out = False
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, _ = p.communicate()
            timed_out = True
        results.append((p.returncode, o.decode(errors="replace"), timed_out))
    return results


def _run_baguarun(func, world, args, timeout, env):
    exe = baguarun_exe()
    with tempfile.TemporaryDirectory(prefix="bagua_py_") as out:
        e = dict(os.environ, **COMMON_ENV)
        e.update(env or {})
        p = subprocess.run(
            [exe, "--nproc_per_node", str(world), "--master_port", "0", "--", sys.executable,
             os.path.join(HERE, "workers.py"), func, out, json.dumps(args or {})],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        o = p.stdout.decode(errors="replace")
        assert p.returncode == 0, "baguarun exited with {}\n{}".format(p.returncode, o[-6000:])
        return load_ranks(out, world)


def free_port():
    """A free port outside the kernel's ephemeral range (as baguarun --master_port 0 picks it):
    a port from bind(0) lies in that range, where any connection opened before rank 0 binds it
    (the suites run in parallel) can take it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    first, last = (10000, lo - 1) if lo - 10000 >= 65535 - hi else (hi + 1, 65535)
    for _ in range(64):
        port = random.randint(first, last)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(func, world, args=None, timeout=90, env=None, local_world=None, launcher=None):
    """``launcher="baguarun"``: one baguarun process starts the ranks (BAGUA_TEST_BAGUARUN)."""
    if launcher == "baguarun":
        return _run_baguarun(func, world, args, timeout, env)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bagua_py_") as out:
        procs = []
        for r in range(world):
            e = dict(os.environ)
            e.update({
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r % (local_world or world)),
                "LOCAL_WORLD_SIZE": str(local_world or world),
                **COMMON_ENV,
            })
            e.update(env or {})
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "workers.py"), func, out,
                 json.dumps(args or {})],
                env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outputs = []
        failed = []
        for r, (rc, o, timed_out) in enumerate(communicate_all(procs, timeout)):
            if timed_out:
                failed.append("rank {} timed out after {} s".format(r, timeout))
            outputs.append(o)
            if rc != 0:
                failed.append("rank {} exited with {}".format(r, rc))
        if failed:
            raise AssertionError("; ".join(failed) + "\n" + "\n".join(
                "---- rank {} ----\n{}".format(r, o[-3000:]) for r, o in enumerate(outputs)))
        return load_ranks(out, world)


def elastic_log_entries(logdir):
    """Every entry of elastic_worker.py's logs in `logdir` (one file a process): (header, kind,
    record) for its "start" header line (the header is the record) and each "step" or "eval"
    line after it, the header being that process's."""
    for path in glob.glob(os.path.join(logdir, "log_*.txt")):
        header = None
        with open(path) as f:
            for line in f:
                kind, _, body = line.partition(" ")
                if kind == "start":
                    header = json.loads(body)
                    yield header, kind, header
                elif kind in ("step", "eval"):
                    yield header, kind, json.loads(body)
