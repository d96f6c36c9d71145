"""The package's shape: no import circle between its modules, no source file over 800 lines.

The import graph is read from the sources (every ``import`` and ``from ... import`` of a
``bagua`` module, at module level or inside a function: a function-level import that closes a
circle is still one), so the test needs neither torch nor the extension. An edge from a module to
one of its own parent packages is left out: Python initialises the parents first, and a package
whose ``__init__`` re-exports its submodules is the usual layout, not a circle."""

import ast
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "python")
MAX_LINES = 800


def _modules():
    """{dotted module name: path} of every module of the ``bagua`` package."""
    out = {}
    base = os.path.join(PACKAGE_DIR, "bagua")
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), PACKAGE_DIR)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = os.path.join(dirpath, f)
    return out


def _imports(name, path, modules):
    """The package modules ``name`` imports (the module itself when ``from m import x`` names a
    submodule of m)."""
    is_pkg = path.endswith("__init__.py")
    pkg = name if is_pkg else name.rpartition(".")[0]
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                mod = base + ("." + node.module if node.module else "")
            else:
                mod = node.module or ""
            targets = [mod] + [mod + "." + a.name for a in node.names]
        else:
            continue
        for t in targets:
            # The longest package module the name starts with (``import bagua.x.y`` loads y).
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_sees_relative_and_function_level_imports():
    modules = _modules()
    name = "bagua.torch_api.data_parallel.bagua_distributed"
    got = _imports(name, modules[name], modules)
    assert "bagua.torch_api.data_parallel._native_engine" in got
    assert "bagua.torch_api.communication" in got
    # _broadcast_optimizer_state imports QAdam inside the function.
    name = "bagua.torch_api.data_parallel._engine"
    assert "bagua.torch_api.algorithms.q_adam" in _imports(name, modules[name], modules)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_package():
    modules = _modules()
    assert "bagua.torch_api.data_parallel.bagua_distributed" in modules
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("folder", ["python", os.path.join("tests", "python")])
def test_no_python_source_over_800_lines(folder):
    long = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                n = sum(1 for _ in open(path))
                if n > MAX_LINES:
                    long[os.path.relpath(path, ROOT)] = n
    assert long == {}, "split these by theme: {}".format(long)
