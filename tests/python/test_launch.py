"""torchrun launches bagua programs too (its agent's store holds MASTER_PORT; bagua finds its
own port through it)."""

import os
import subprocess
import sys
import tempfile

import torch

import comm_checks
import harness


def test_torchrun_launch():
    with tempfile.TemporaryDirectory(prefix="bagua_py_") as out:
        env = dict(os.environ, **harness.COMMON_ENV)
        p = subprocess.run(
            # --redirects/--tee 2: Debian's torch 1.13 on Python 3.11 cannot parse the default
            # "0" (its Std flag enum lost NONE in iteration); 2 (stderr) parses everywhere.
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--redirects", "2", "--tee", "2",
             "--master_addr", "127.0.0.1", "--master_port", str(harness.free_port()),
             os.path.join(harness.HERE, "workers.py"), "comm_basic", out, "{}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        o = p.stdout.decode(errors="replace")
        assert p.returncode == 0, o[-6000:]
        outs = [torch.load(os.path.join(out, "rank{}.pt".format(r))) for r in range(2)]
    comm_checks.check_collectives(outs, 2)
