#!/usr/bin/env python3
"""The house rules that a reader of the tree can count, checked over the tracked files.

usage: house.py [--root DIR] [--max-file-lines N] [--max-function-lines N]

- no source file (C++, CUDA, Python) over 800 lines;
- no function over 120 lines in the libraries: the C++ of every library folder (LIBRARY_DIRS,
  tests and benchmarks excepted) and the Python package (python/bagua);
- no import circle among the Python package's modules: an import at a module's top level (not
  inside a function, which runs later) of another module of the package is an edge; a circle of
  such edges means a module can be seen half-initialised.

Prints one line per breach (FILE:LINE: what, and the bound) and exits 1 when there is any;
prints a one-line summary and exits 0 otherwise.

C++ functions are found by braces: comments and literals are blanked out, and a `{` opened
outside any function whose text since the previous `;`, `{` or `}` holds a `)` (and does not
open a namespace, class, struct, union or enum) starts a function body, ending at its matching
`}`. The length counts the lines from the `{` to the `}`. Lambdas and local classes count with
the function around them.
"""

import argparse
import ast
import os
import re
import subprocess
import sys

LIBRARY_DIRS = ("base", "core", "algorithms", "optimizer", "net_plugin", "dataset_cache",
                "loader", "autotune", "torch", "python/src")
CXX_SUFFIXES = (".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")
PY_PACKAGE = "python/bagua"


def blank_comments_and_literals(text):
    """The text with comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            close = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if close < 0 else close + len(m.group(1)) + 2
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


SCOPE_RE = re.compile(r"\b(namespace|class|struct|union|enum)\b")
FUNCTION_TAIL_RE = re.compile(r"\)[\s\w:,<>()&*\[\]\-.=]*$")


def cxx_functions(text):
    """(first line, last line, header) of every outermost function body in C++ source text."""
    text = blank_comments_and_literals(text)
    found = []
    stack = []  # one entry per open brace: "scope", "function" (outermost) or "inner"
    header_start = 0
    line = 1
    for idx, ch in enumerate(text):
        if ch == "\n":
            line += 1
        elif ch == ";":
            header_start = idx + 1
        elif ch == "{":
            header = " ".join(text[header_start:idx].split())
            if any(kind != "scope" for kind, _, _ in stack):
                kind = "inner"
            elif ")" in header and FUNCTION_TAIL_RE.search(header) and not (
                    SCOPE_RE.search(header.split("(")[0])):
                kind = "function"
            else:
                kind = "scope"  # namespace, class, extern "C", an initialiser list at file scope
            stack.append((kind, line, header))
            header_start = idx + 1
        elif ch == "}":
            if stack:
                kind, first, header = stack.pop()
                if kind == "function":
                    found.append((first, line, header))
            header_start = idx + 1
    return found


def python_functions(source, path):
    """(first line, last line, name) of every function and method in Python source."""
    tree = ast.parse(source, filename=path)
    return [(n.lineno, n.end_lineno, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def module_name(path, package_dir):
    rel = os.path.relpath(path, os.path.dirname(package_dir))[:-len(".py")]
    parts = rel.split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def top_level_imports(tree, module, is_package):
    """The modules a module imports when it is loaded: statements outside any def (inside a
    class body, an if or a try they still run at import time)."""
    names = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                names.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base if is_package else base[:-1]
                    base = base[:len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                names.append(target)
                names.extend(target + "." + a.name for a in child.names)
            visit(child)

    visit(tree)
    return names


def import_circles(modules):
    """modules: {name: [imported names]} -> circles, each a list of module names."""
    edges = {m: sorted({i for i in imports if i in modules and i != m})
             for m, imports in modules.items()}
    # A circle through a package's __init__ that only imports the submodule being loaded is
    # how packages work (importing a.b runs a/__init__ first); such edges from a module to one
    # of its own parent packages are left out.
    for m in edges:
        edges[m] = [i for i in edges[m] if not m.startswith(i + ".")]
    circles, state = [], {}

    def dfs(m, path):
        state[m] = 1
        path.append(m)
        for n in edges[m]:
            if state.get(n) == 1:
                circles.append(path[path.index(n):] + [n])
            elif n not in state:
                dfs(n, path)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            dfs(m, [])
    return circles


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True)
    return [f for f in out.stdout.decode().split("\0") if f]


def check(root, files, max_file, max_function):
    breaches = []
    counted = {"files": 0, "functions": 0, "modules": 0}
    modules = {}
    package = os.path.join(root, PY_PACKAGE)
    for f in files:
        path = os.path.join(root, f)
        if not f.endswith(CXX_SUFFIXES + (".py",)) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        counted["files"] += 1
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > max_file:
            breaches.append("{}:1: {} lines, more than {}".format(f, lines, max_file))
        in_library = any(f.startswith(d + "/") for d in LIBRARY_DIRS) and "/tests/" not in f
        if f.endswith(CXX_SUFFIXES) and in_library:
            for first, last, header in cxx_functions(text):
                counted["functions"] += 1
                if last - first + 1 > max_function:
                    name = header.split("(")[0].split()[-1] if "(" in header else header
                    breaches.append("{}:{}: function {} has {} lines, more than {}".format(
                        f, first, name, last - first + 1, max_function))
        elif f.endswith(".py") and f.startswith(PY_PACKAGE + "/"):
            try:
                functions = python_functions(text, f)
                tree = ast.parse(text, filename=f)
            except SyntaxError as e:
                breaches.append("{}:{}: does not parse: {}".format(f, e.lineno, e.msg))
                continue
            for first, last, name in functions:
                counted["functions"] += 1
                if last - first + 1 > max_function:
                    breaches.append("{}:{}: function {} has {} lines, more than {}".format(
                        f, first, name, last - first + 1, max_function))
            name = module_name(path, package)
            modules[name] = top_level_imports(tree, name, f.endswith("__init__.py"))
            counted["modules"] += 1
    for circle in import_circles(modules):
        breaches.append("{}: import circle: {}".format(PY_PACKAGE, " -> ".join(circle)))
    return breaches, counted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--max-file-lines", type=int, default=800)
    ap.add_argument("--max-function-lines", type=int, default=120)
    args = ap.parse_args()
    breaches, counted = check(args.root, tracked_files(args.root), args.max_file_lines,
                              args.max_function_lines)
    for b in breaches:
        print(b)
    if breaches:
        print("house.py: {} breach(es)".format(len(breaches)))
        return 1
    print("house.py: {files} source files within {max_file} lines, {functions} library functions "
          "within {max_function}, {modules} package modules without an import circle".format(
              max_file=args.max_file_lines, max_function=args.max_function_lines, **counted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
