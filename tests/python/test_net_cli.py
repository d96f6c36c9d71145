"""``python -m bagua.net``: the plugin's path and ``--check``, which validates every Bagua-Net
setting with the plugin's own parameter catalogues (through the extension) and loads the plugin;
the package's second name for the plugin, ``libnccl-net-bagua.so``."""

import os
import re
import subprocess
import sys

import pytest

import bagua
import bagua.net
import harness

# The plugin's catalogue, whose BAGUA_NET_* keys --check must all validate.
NET_PARAMS_H = os.path.join(harness.HERE, "..", "..", "net_plugin", "include", "bagua", "net",
                            "params.h")


def _clean_env(**settings):
    """This process's environment without any Bagua-Net or NCCL socket setting, plus `settings`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BAGUA_NET_", "NCCL_SOCKET_", "NCCL_P2P_", "NCCL_SHM_"))}
    env.update(settings)
    return env


def _check(**settings):
    p = subprocess.run([sys.executable, "-m", "bagua.net", "--check"], env=_clean_env(**settings),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def test_check_passes_with_defaults():
    rc, out, err = _check()
    assert rc == 0, out + err
    assert err == ""
    assert "export NCCL_NET_PLUGIN={}".format(bagua.net_plugin_path()) in out.splitlines()
    assert re.search(r"^loads: exports ncclNetPlugin_v\d+", out, re.M), out
    assert "settings: valid (all defaults)" in out.splitlines(), out


def test_check_passes_and_lists_good_settings():
    rc, out, err = _check(BAGUA_NET_NSTREAMS="16", BAGUA_NET_MIN_CHUNKSIZE="512K",
                          BAGUA_NET_CHUNK_POLICY="FIXED", BAGUA_NET_TUNER_MIN_CHANNELS="0x4",
                          NCCL_SOCKET_FAMILY="AF_INET")
    assert rc == 0, out + err
    line = [x for x in out.splitlines() if x.startswith("settings: valid")]
    assert len(line) == 1, out
    # The values as the catalogue parsed them (K suffix, enum spelling, hex), in its order.
    assert line[0] == ("settings: valid (from the environment: BAGUA_NET_NSTREAMS=16, "
                       "BAGUA_NET_CHUNK_POLICY=fixed, BAGUA_NET_MIN_CHUNKSIZE=512 KiB, "
                       "NCCL_SOCKET_FAMILY=AF_INET, BAGUA_NET_TUNER_MIN_CHANNELS=4)"), line[0]


@pytest.mark.parametrize("key,value,why,accepted", [
    ("BAGUA_NET_NSTREAMS", "abc", "'abc' is not an integer", "an integer in [1, 64]"),
    ("BAGUA_NET_NSTREAMS", "65", "out of range", "an integer in [1, 64]"),
    ("BAGUA_NET_NSTREAMS", "010", "'010' has a leading zero (octal is not accepted)",
     "an integer in [1, 64]"),
    ("BAGUA_NET_MAX_CHUNKSIZE", "1Q", "'1Q' has an unknown size suffix 'q' (use K, M, G or T)",
     "a byte size in [4 KiB, 1 GiB], optionally with a K/M/G/T suffix"),
    ("BAGUA_NET_DEVICES", "fastest", "unknown name", "one of per-interface ("),
    ("BAGUA_NET_TUNER_LL_MAX", "-1", None,
     "a byte size in [0, 1 GiB], optionally with a K/M/G/T suffix"),
    ("NCCL_SOCKET_FAMILY", "AF_UNIX", None, "empty, AF_INET or AF_INET6"),
])
def test_check_names_a_bad_setting(key, value, why, accepted):
    rc, out, err = _check(**{key: value})
    assert rc == 1, out + err
    assert out == "", out  # nothing that looks like a usable plugin line
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = "bagua.net: {}='{}' is invalid (".format(key, value)
    assert lines[0].startswith(prefix), lines[0]
    if why is not None:
        assert lines[0].startswith(prefix + why + "); accepted: "), lines[0]
    assert "; accepted: " + accepted in lines[0], lines[0]


def test_check_validates_every_bagua_net_parameter():
    # Every BAGUA_NET_* key that the catalogue header declares, each set to a value no knob of
    # these kinds accepts: one error line for each, naming it.
    with open(NET_PARAMS_H) as f:
        declared = set(re.findall(r'"(BAGUA_NET_[A-Z0-9_]+)"', f.read()))
    assert {"BAGUA_NET_NSTREAMS", "BAGUA_NET_MIN_CHUNKSIZE", "BAGUA_NET_DEVICES"} <= declared
    import _bagua_ext
    listed = [p["key"] for p in _bagua_ext.net_params()]
    assert declared <= set(listed), declared - set(listed)
    bad = {k: "no-such-value" for k in listed if k.startswith("BAGUA_NET_")}
    rc, out, err = _check(**bad)
    assert rc == 1, out + err
    named = re.findall(r"^bagua\.net: (BAGUA_NET_[A-Z0-9_]+)='no-such-value' is invalid \(.*\); "
                       r"accepted: .+$", err, re.M)
    assert sorted(named) == sorted(bad), err
    assert len(err.splitlines()) == len(bad), err


def test_check_runs_the_checks_across_settings():
    # Each value is valid alone; the engine refuses a floor above the ceiling.
    rc, out, err = _check(BAGUA_NET_MIN_CHUNKSIZE="1M", BAGUA_NET_MAX_CHUNKSIZE="64K")
    assert rc == 1, out + err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bagua.net: "), lines[0]
    assert "BAGUA_NET_MIN_CHUNKSIZE <= BAGUA_NET_MAX_CHUNKSIZE" in lines[0], lines[0]


def test_without_check_settings_are_not_read():
    p = subprocess.run([sys.executable, "-m", "bagua.net", "--path"],
                       env=_clean_env(BAGUA_NET_NSTREAMS="abc"), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().strip() == bagua.net_plugin_path()


def test_plugin_also_named_for_nccl_net_plugin_bagua():
    # NCCL_NET_PLUGIN=bagua makes NCCL dlopen libnccl-net-bagua.so: the package has it beside
    # libnccl-net.so, the same library.
    path = bagua.net_plugin_path()
    alias = os.path.join(os.path.dirname(path), "libnccl-net-bagua.so")
    assert os.path.isfile(alias), alias
    with open(path, "rb") as a, open(alias, "rb") as b:
        assert a.read() == b.read(), "{} differs from {}".format(alias, path)
    assert bagua.net.exported_versions(alias) == bagua.net.exported_versions(path) != []
