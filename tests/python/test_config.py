"""One configuration: every environment variable the bagua package reads is a knob that
bagua-params lists, read through the C++ catalogues (bagua/_catalogue.py) with their defaults,
strict parsers and error text.

- Static: an AST scan of every .py under python/bagua finds each read of the environment
  (os.environ[...], .get, .setdefault, .pop, `in os.environ`, os.getenv, and the catalogue
  accessor with a literal name); each name read or set must be listed by bagua-params, and any
  other use of the environment (a non-literal name, a copy of the whole environment) fails.
- Defaults and parsing: env.py's getters and the launchers' flags against bagua-params' own
  output (defaults, values, error messages).
"""

import argparse
import ast
import json
import os
import subprocess

import pytest

import bagua
import _bagua_ext
from bagua import _catalogue
from bagua.torch_api import env

PACKAGE = os.path.dirname(os.path.abspath(_catalogue.__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Variables the package may touch that no bagua catalogue declares, each with its reason.
ALLOWED_UNDECLARED = {
    # NCCL's own variable (NCCL reads it): --enable_bagua_net sets it for the workers.
    "NCCL_NET_PLUGIN": "set for the workers' NCCL",
}

# The accessor's functions (bagua/_catalogue.py and env.py's wrapper): the one way to read.
ACCESSORS = {("_catalogue", "value"), ("_catalogue", "is_set"), ("_catalogue", "default"),
             ("env", "_is_set"), ("ext", "param"), ("_bagua_ext", "param")}
ENV_METHODS_READ = {"get", "setdefault", "pop"}
ENV_METHODS_WRITE = {"update"}  # writes whole dicts for child processes (the launchers)


def bagua_params():
    """bagua-params' path: BAGUA_TEST_PARAMS (set by meson), else the build tree's."""
    exe = os.environ.get("BAGUA_TEST_PARAMS") or os.path.join(ROOT, "build", "tools", "params",
                                                               "bagua-params")
    if not os.access(exe, os.X_OK):
        pytest.skip("bagua-params not found ({!r}; meson sets BAGUA_TEST_PARAMS)".format(exe))
    return exe


def run_params(args, extra_env=None, drop=()):
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update(extra_env or {})
    p = subprocess.run([bagua_params()] + args, env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    return p.stdout.decode(), p.stderr.decode(), p.returncode


@pytest.fixture(scope="module")
def listed():
    """{key: entry} of bagua-params --json (declarations and values as it reads them)."""
    out, err, rc = run_params(["--json"])
    assert rc == 0, err
    return {p["key"]: p for p in json.loads(out)}


class _Scan(ast.NodeVisitor):
    """Environment uses in one module: reads and writes of literal names, and the rest."""

    def __init__(self, path):
        self.path = path
        self.os_names = set()       # names bound to the os module
        self.environ_names = set()  # names bound to os.environ
        self.getenv_names = set()   # names bound to os.getenv
        self.reads, self.writes, self.bad = [], [], []

    def where(self, node):
        return "{}:{}".format(os.path.relpath(self.path, ROOT), node.lineno)

    def visit_Import(self, node):
        for a in node.names:
            if a.name == "os":
                self.os_names.add(a.asname or "os")

    def visit_ImportFrom(self, node):
        if node.module == "os":
            for a in node.names:
                if a.name in ("environ", "environb"):
                    self.environ_names.add(a.asname or a.name)
                elif a.name in ("getenv", "getenvb"):
                    self.getenv_names.add(a.asname or a.name)

    def is_environ(self, node):
        if isinstance(node, ast.Name):
            return node.id in self.environ_names
        return (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb") and
                isinstance(node.value, ast.Name) and node.value.id in self.os_names)

    def is_getenv(self, node):
        if isinstance(node, ast.Name):
            return node.id in self.getenv_names
        return (isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb") and
                isinstance(node.value, ast.Name) and node.value.id in self.os_names)

    def literal(self, args, node, what, sink):
        if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
            sink.append((args[0].value, self.where(node)))
        else:
            self.bad.append("{}: {} with a name that is not a literal".format(
                self.where(node), what))

    def visit_Call(self, node):
        f = node.func
        if self.is_getenv(f):
            self.literal(node.args, node, "os.getenv", self.reads)
        elif isinstance(f, ast.Attribute) and self.is_environ(f.value):
            if f.attr in ENV_METHODS_READ:
                self.literal(node.args, node, "os.environ." + f.attr, self.reads)
            elif f.attr not in ENV_METHODS_WRITE:
                self.bad.append("{}: os.environ.{}() reads names no catalogue declares".format(
                    self.where(node), f.attr))
            for a in node.args:
                self.visit(a)
            return
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and
              (f.value.id, f.attr) in ACCESSORS):
            if node.args and isinstance(node.args[0], ast.Constant):
                self.reads.append((node.args[0].value, self.where(node)))
            # A name computed at run time goes through the catalogue too: an undeclared one
            # raises KeyError there.
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if self.is_environ(node.value):
            sink = self.reads if isinstance(node.ctx, ast.Load) else self.writes
            self.literal([node.slice], node, "os.environ[...]", sink)
            self.visit(node.slice)
            return
        self.generic_visit(node)

    def visit_Compare(self, node):
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)) and self.is_environ(right):
                self.literal([node.left], node, "`in os.environ`", self.reads)
                return
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.environ_names and isinstance(node.ctx, ast.Load):
            self.bad.append("{}: the environment used as a whole".format(self.where(node)))

    def check_bare(self, tree):
        """os.environ used other than as above (iterated, copied, passed along)."""
        used = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Subscript) and self.is_environ(n.value):
                used.add(id(n.value))
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                    self.is_environ(n.func.value):
                used.add(id(n.func.value))
            elif isinstance(n, ast.Compare):
                used.update(id(c) for c in n.comparators if self.is_environ(c))
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and self.is_environ(n) and id(n) not in used:
                self.bad.append("{}: the environment used as a whole (iterated, copied or "
                                "passed along)".format(self.where(n)))


def scan_package():
    reads, writes, bad = [], [], []
    files = 0
    for d, dirs, names in os.walk(PACKAGE):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for n in sorted(names):
            if not n.endswith(".py"):
                continue
            path = os.path.join(d, n)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            s = _Scan(path)
            for node in ast.walk(tree):  # imports first, wherever they are
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    s.visit(node)
            s.visit(tree)
            s.check_bare(tree)
            reads += s.reads
            writes += s.writes
            bad += s.bad
            files += 1
    return files, reads, writes, bad


def test_scanner_finds_every_kind_of_read(tmp_path, monkeypatch):
    # The scanner itself, on a module with each form: if it missed one, the package test below
    # could pass on a package that reads an undeclared variable.
    src = '''
import os
import os as o2
from os import environ as E, getenv
from bagua import _catalogue
a = os.environ["R1"]
b = os.environ.get("R2")
c = o2.getenv("R3")
d = getenv("R4")
os.environ.setdefault("R5", "x")
e = "R6" in os.environ
f = _catalogue.value("R7")
g = E["R8"]
os.environ["W1"] = "1"
k = "K"
h = os.environ[k]
i = dict(os.environ)
j = list(os.environ.keys())
os.environ.update({"W2": "2"})
'''
    path = tmp_path / "m.py"
    path.write_text(src)
    tree = ast.parse(src)
    s = _Scan(str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            s.visit(node)
    s.visit(tree)
    s.check_bare(tree)
    assert sorted(n for n, _ in s.reads) == ["R{}".format(i) for i in range(1, 9)]
    assert [n for n, _ in s.writes] == ["W1"]
    assert len(s.bad) == 3, s.bad  # os.environ[k], dict(os.environ), os.environ.keys()


def test_package_reads_only_what_bagua_params_lists(listed):
    files, reads, writes, bad = scan_package()
    assert files > 30, "scanned only {} files under {}".format(files, PACKAGE)
    assert not bad, "environment used outside the catalogue accessor:\n" + "\n".join(bad)
    missing = ["{} ({})".format(n, w) for n, w in reads + writes
               if n not in listed and n not in ALLOWED_UNDECLARED]
    assert not missing, ("the bagua package reads or sets variables that bagua-params does not "
                         "list (declare them in a catalogue, e.g. "
                         "python/include/bagua/python/params.h):\n" + "\n".join(missing))
    # The accessor's reads are found too (env.py reads RANK through it).
    assert any(n == "RANK" and "env.py" in w for n, w in reads), reads
    for name in ALLOWED_UNDECLARED:
        assert name not in listed, "{} is declared now: drop it from the allow-list".format(name)


# Catalogues of the command-line tools alone (their knobs are read by the tool, never by the
# package): bagua-params lists them, the extension does not link them.
TOOL_ONLY_LIBRARIES = {"baguarun"}


def test_extension_and_bagua_params_list_the_same_knobs(listed):
    mine = {p["key"]: p for p in _bagua_ext.params()}
    tools = {k for k, p in listed.items() if p["library"] in TOOL_ONLY_LIBRARIES}
    assert tools, "bagua-params lists baguarun's catalogue"
    assert not tools & set(mine), "a tool's knob in the extension's catalogues"
    assert set(mine) == set(listed) - tools
    for k, p in mine.items():
        assert (p["library"], p["type"], p["default"]) == (
            listed[k]["library"], listed[k]["type"], listed[k]["default"]), k
    assert listed["BAGUA_DEFAULT_BUCKET_SIZE"]["library"] == "python"


GETTERS = {
    "get_world_size": "WORLD_SIZE",
    "get_rank": "RANK",
    "get_master_addr": "MASTER_ADDR",
    "get_master_port": "MASTER_PORT",
    "get_restart_count": "TORCHELASTIC_RESTART_COUNT",
    "get_default_bucket_size": "BAGUA_DEFAULT_BUCKET_SIZE",
    "get_bagua_service_port": "BAGUA_SERVICE_PORT",
    "is_report_metrics_switch_on": "BAGUA_REPORT_METRICS",
    "get_autotune_level": "BAGUA_AUTOTUNE",
    "get_autotune_max_samples": "BAGUA_AUTOTUNE_MAX_SAMPLES",
    "get_autotune_sampling_confidence_time_s": "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S",
    "get_autotune_warmup_time_s": "BAGUA_AUTOTUNE_WARMUP_TIME_S",
    "get_is_output_autotune_log": "BAGUA_IS_OUTPUT_AUTOTUNE_LOG",
    "get_autotune_server_wait_time": "BAGUA_AUTOTUNE_SERVER_WAIT_TIME",
}
KEYS = sorted(set(GETTERS.values()) | {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                       "GROUP_RANK"})
UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def typed(entry, text):
    """bagua-params' text of a value as the Python type the getters return."""
    t = entry["type"]
    if t == "int":
        return int(text)
    if t == "double":
        return float(text)
    if t == "bool":
        return {"true": True, "false": False}[text]
    if t == "bytes":
        n, _, unit = text.partition(" ")
        return int(n) * UNITS[unit]
    return text


@pytest.fixture
def clean(monkeypatch):
    for k in KEYS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_getter_defaults_are_the_catalogues(clean, listed):
    out, err, rc = run_params(["--json"], drop=KEYS)
    assert rc == 0, err
    fresh = {p["key"]: p for p in json.loads(out)}
    for getter, key in GETTERS.items():
        assert fresh[key]["source"] == "default", key
        want = typed(fresh[key], fresh[key]["value"])
        got = getattr(env, getter)()
        assert got == want and type(got) is type(want), (getter, got, want)
    assert env.DEFAULT_BUCKET_SIZE == 25 << 20 == env.get_default_bucket_size()
    # The core's -1 for the local variables: the whole world on one node (torchrun's meaning).
    assert typed(fresh["LOCAL_WORLD_SIZE"], fresh["LOCAL_WORLD_SIZE"]["value"]) == -1
    assert typed(fresh["LOCAL_RANK"], fresh["LOCAL_RANK"]["value"]) == -1
    assert (env.get_local_size(), env.get_local_rank(), env.get_node_rank()) == (1, 0, 0)
    clean.setenv("RANK", "5")
    clean.setenv("WORLD_SIZE", "8")
    assert (env.get_local_size(), env.get_local_rank()) == (8, 5)
    clean.setenv("LOCAL_WORLD_SIZE", "4")
    assert (env.get_local_size(), env.get_local_rank()) == (4, 1)
    clean.setenv("LOCAL_RANK", "3")
    assert env.get_local_rank() == 3


def test_getters_read_the_environment_at_each_call(clean):
    clean.setenv("BAGUA_DEFAULT_BUCKET_SIZE", "10M")
    assert env.get_default_bucket_size() == 10 << 20
    clean.setenv("BAGUA_DEFAULT_BUCKET_SIZE", "4096")
    assert env.get_default_bucket_size() == 4096
    clean.setenv("BAGUA_REPORT_METRICS", "1")
    assert env.is_report_metrics_switch_on() is True
    clean.setenv("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", "0")  # Bagua took "0" as on
    assert env.get_is_output_autotune_log() is False
    # NODE_RANK, unless torchrun's four variables say an elastic launch (then GROUP_RANK).
    clean.setenv("NODE_RANK", "2")
    clean.setenv("GROUP_RANK", "3")
    assert env.get_node_rank() == 2
    for k, v in (("RANK", "1"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        clean.setenv(k, v)
    assert env.get_node_rank() == 3


@pytest.mark.parametrize("getter,key,bad", [
    ("get_rank", "RANK", "abc"),
    ("get_world_size", "WORLD_SIZE", "0"),        # out of range: [1, ...]
    ("get_local_size", "LOCAL_WORLD_SIZE", "2x"),
    ("get_local_rank", "LOCAL_RANK", ""),         # empty is not a number, as in C++
    ("get_node_rank", "NODE_RANK", "1.5"),
    ("get_master_port", "MASTER_PORT", "70000"),
    ("get_default_bucket_size", "BAGUA_DEFAULT_BUCKET_SIZE", "abc"),
    ("is_report_metrics_switch_on", "BAGUA_REPORT_METRICS", "2"),
    ("get_autotune_level", "BAGUA_AUTOTUNE", "abc"),
    ("get_autotune_warmup_time_s", "BAGUA_AUTOTUNE_WARMUP_TIME_S", "soon"),
])
def test_bad_value_raises_the_catalogues_error(clean, getter, key, bad):
    out, _, _ = run_params([], extra_env={key: bad}, drop=KEYS)
    cpp = [line.strip()[len("ERROR: "):] for line in out.splitlines()
           if line.strip().startswith("ERROR: {}=".format(key))]
    assert len(cpp) == 1, out[-3000:]
    clean.setenv(key, bad)
    with pytest.raises(ValueError) as e:
        getattr(env, getter)()
    msg = str(e.value)
    assert msg.endswith(cpp[0]), (msg, cpp[0])
    assert "{}='{}' is invalid".format(key, bad) in msg


def test_unknown_key_is_refused():
    with pytest.raises(KeyError, match="NOT_A_BAGUA_KNOB"):
        _catalogue.value("NOT_A_BAGUA_KNOB")


def test_launcher_defaults_are_the_catalogues(clean):
    from bagua.distributed import _bagua_flags, launch

    a = launch.parser().parse_args(["train.py"])
    assert (a.master_addr, a.master_port, a.node_rank) == (
        _catalogue.default("MASTER_ADDR"), _catalogue.default("MASTER_PORT"),
        _catalogue.default("NODE_RANK")) == ("127.0.0.1", 29500, 0)
    f = _bagua_flags.add_bagua_flags(argparse.ArgumentParser()).parse_args([])
    e = _bagua_flags.bagua_env(f)
    # What the launchers export by default is what a worker reads with nothing set.
    for key, text in e.items():
        clean.setenv(key, text)
        assert _catalogue.value(key) == _catalogue.default(key), (key, text)
    assert set(e) == {"BAGUA_SERVICE_PORT", "BAGUA_AUTOTUNE", "BAGUA_AUTOTUNE_MAX_SAMPLES",
                      "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S", "BAGUA_AUTOTUNE_WARMUP_TIME_S",
                      "BAGUA_IS_OUTPUT_AUTOTUNE_LOG"}


def test_job_key_reads_go_through_the_catalogue(clean):
    from bagua.distributed import _bagua_flags

    clean.delenv("BAGUA_JOB_KEY", raising=False)
    clean.delenv("BAGUA_JOB_KEY_FILE", raising=False)
    assert len(_bagua_flags.job_key_env(True)["BAGUA_JOB_KEY"]) == 64
    clean.setenv("BAGUA_JOB_KEY_FILE", "/nonexistent/key")
    assert _bagua_flags.job_key_env(True) == {}


def test_engine_options_refuse_an_unknown_option():
    from bagua.torch_api.data_parallel.engine_options import EngineOptions

    with pytest.raises(TypeError, match="cuda_reducer"):
        EngineOptions(cuda_reducer="python")
    with pytest.raises(TypeError):
        EngineOptions("python")  # keyword-only
    assert bagua.torch_api.env is env
