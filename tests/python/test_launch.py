"""torchrun launches bagua programs too (its agent's store holds MASTER_PORT; bagua finds its
own port through it)."""

import os
import subprocess
import sys
import tempfile

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
        outs = harness.load_ranks(out, 2)
    comm_checks.check_collectives(outs, 2)


def _bagua_launcher(module, flags):
    with tempfile.TemporaryDirectory(prefix="bagua_py_") as out:
        env = dict(os.environ, **harness.COMMON_ENV)
        p = subprocess.run(
            [sys.executable, "-m", module] + flags +
            [os.path.join(harness.HERE, "workers.py"), "launched", out, "{}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        o = p.stdout.decode(errors="replace")
        assert p.returncode == 0, o[-6000:]
        return harness.load_ranks(out, 2)


def test_bagua_distributed_launch():
    """Bagua's static launcher: its flags, --set_additional_flag, Bagua's variables; the
    script reads its rank before init_process_group, as Bagua's examples do."""
    outs = _bagua_launcher("bagua.distributed.launch", [
        "--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(harness.free_port()),
        "--set_additional_flag", "--default_bucket_size", "4096", "--autotune_level", "0"])
    comm_checks.check_collectives(outs, 2)
    for r, o in enumerate(outs):
        assert o["before"] == (r, r, 2, 2) and o["local_rank_arg"] == r
        e = o["env"]
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"],
                e["NODE_RANK"]) == (str(r), str(r), "2", "2", "0")
        assert e["BAGUA_DEFAULT_BUCKET_SIZE"] == "4096" and e["BAGUA_AUTOTUNE"] == "0"


def test_bagua_distributed_run():
    """torchrun's flags (--standalone) plus Bagua's; --enable_bagua_net points NCCL at our
    plugin (its path, when this build has it)."""
    from bagua.distributed import _bagua_flags

    plugin = _bagua_flags.bagua_net_plugin()
    flags = ["--standalone", "--nproc_per_node", "2", "--default_bucket_size", "8192"]
    if plugin is not None:
        flags.append("--enable_bagua_net")
    outs = _bagua_launcher("bagua.distributed.run", flags)
    comm_checks.check_collectives(outs, 2)
    for r, o in enumerate(outs):
        assert o["before"] == (r, r, 2, 2) and o["local_rank_arg"] is None
        assert o["env"]["BAGUA_DEFAULT_BUCKET_SIZE"] == "8192"
        assert o["env"]["NCCL_NET_PLUGIN"] == plugin


def test_launcher_reports_a_failed_worker(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    p = subprocess.run(
        [sys.executable, "-m", "bagua.distributed.launch", "--nproc_per_node", "2",
         "--master_port", str(harness.free_port()), str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode == 1
    assert b"bagua: FAILED: rank 0 exited with code 3" in p.stdout


def test_launcher_help_lists_bagua_flags():
    for module in ("bagua.distributed.launch", "bagua.distributed.run"):
        p = subprocess.run([sys.executable, "-m", module, "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        assert p.returncode == 0
        for flag in (b"--enable_bagua_net", b"--default_bucket_size", b"--autotune_level"):
            assert flag in p.stdout, (module, flag)
        if module.endswith(".run"):  # torchrun's own flags too
            assert b"--rdzv_backend" in p.stdout and b"--max_restarts" in p.stdout


def test_bucket_size_unset_unless_given(monkeypatch):
    # The launchers leave BAGUA_DEFAULT_BUCKET_SIZE alone unless --default_bucket_size is given,
    # so with_bagua's default (25 MiB, torch DDP's; Bagua's launchers set 10 MiB) applies.
    import argparse

    from bagua.distributed import _bagua_flags
    from bagua.torch_api import env

    parser = _bagua_flags.add_bagua_flags(argparse.ArgumentParser())
    assert "BAGUA_DEFAULT_BUCKET_SIZE" not in _bagua_flags.bagua_env(parser.parse_args([]))
    given = parser.parse_args(["--default_bucket_size", "10485760"])
    assert _bagua_flags.bagua_env(given)["BAGUA_DEFAULT_BUCKET_SIZE"] == "10485760"
    monkeypatch.delenv("BAGUA_DEFAULT_BUCKET_SIZE", raising=False)
    assert env.get_default_bucket_size() == 25 * 1024 ** 2
    monkeypatch.setenv("BAGUA_DEFAULT_BUCKET_SIZE", "10485760")
    assert env.get_default_bucket_size() == 10 * 1024 ** 2
