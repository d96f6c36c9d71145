#!/usr/bin/env python3
"""Tests of .ci/house.py, the checker of the house rules (file length, library function length,
import circles in the Python package).

usage: house_test.py CHECKER REPO_ROOT

A fixture repository (git, made here) with one case of each rule on each side of its bound must
give exactly the expected breaches; braces in comments, strings, raw strings and character
literals must not open or close functions; the repository itself must pass.
"""

import os
import subprocess
import sys
import tempfile


def body(n):
    """A C++ function body of exactly n lines from `{` to `}`."""
    return "{\n" + "  x += 1;\n" * (n - 2) + "}\n"


FIXTURE = {
    # 120 lines: at the bound. 121: one over. The tricky one hides braces where only a lexer
    # sees they do not count, and is 121 lines long.
    "core/src/lengths.cc": (
        "namespace bagua {\nnamespace {\n"
        "int atBound(int x) " + body(120) +
        "}  // namespace\n"
        "int overBound(int x) " + body(121) +
        "class Widget {\n public:\n  int inClass(int x) const " + body(121) + "};\n"
        "Status tricky(int x) {\n"
        "  // a comment with a } brace\n"
        "  const char* s = \"}}}\";\n"
        "  const char* r = R\"x(}})x\";\n"
        "  char c = '}';\n"
        "  /* { */\n"
        "  auto lambda = [&](int y) { return y + 1; };\n"
        + "  x += 1;\n" * 112 +
        "  return lambda(x);\n"
        "}\n"
        "struct Plain {\n  int a;\n};\n"
        "}  // namespace bagua\n"),
    # Not a library: tests may hold long functions.
    "tests/core/long_test.cc": "void longTest(int x) " + body(300),
    # Not C++ of a library folder either.
    "bench/long_bench.cc": "void longBench(int x) " + body(300),
    "core/src/file_at_bound.h": "// x\n" * 800,
    "core/src/file_over_bound.h": "// x\n" * 801,
    "python/bagua/__init__.py": "from . import alpha\n",
    "python/bagua/alpha.py": "from bagua import beta\n\n\ndef f():\n    return beta.g()\n",
    "python/bagua/beta.py": ("import bagua.alpha\n\n\ndef g():\n    return 1\n"),
    "python/bagua/gamma.py": ("def late():\n    from bagua import delta\n    return delta\n"),
    "python/bagua/delta.py": "from bagua import gamma\n",
    "python/bagua/sub/__init__.py": "from bagua.sub import leaf\n",
    "python/bagua/sub/leaf.py": "import bagua.sub\n\n\ndef h():\n"
                                + "    x = 1\n" * 119 + "    return x\n",
}

EXPECTED = sorted([
    "core/src/lengths.cc:{}: function overBound has 121 lines, more than 120",
    "core/src/lengths.cc:{}: function inClass has 121 lines, more than 120",
    "core/src/lengths.cc:{}: function tricky has 121 lines, more than 120",
    "core/src/file_over_bound.h:1: 801 lines, more than 800",
    "python/bagua/sub/leaf.py:4: function h has 121 lines, more than 120",
    "python/bagua: import circle: bagua.alpha -> bagua.beta -> bagua.alpha",
])


def line_of(text, needle):
    return text[:text.index(needle)].count("\n") + 1


def main():
    checker, root = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in FIXTURE.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q", tmp], check=True)
        subprocess.run(["git", "-C", tmp, "add", "-A"], check=True)
        got = subprocess.run([sys.executable, checker, "--root", tmp], capture_output=True,
                             text=True)
        src = FIXTURE["core/src/lengths.cc"]
        lines = {"overBound": line_of(src, "int overBound"), "inClass": line_of(src, "int inClass"),
                 "tricky": line_of(src, "Status tricky")}
        want = sorted(e.format(lines[e.split("function ")[1].split()[0]]) if "{}" in e else e
                      for e in EXPECTED)
        have = sorted(l for l in got.stdout.splitlines() if not l.startswith("house.py:"))
        if got.returncode != 1:
            failures.append("fixture: exit {} (want 1)".format(got.returncode))
        if have != want:
            failures.append("fixture: breaches differ\n  want:\n    {}\n  have:\n    {}".format(
                "\n    ".join(want), "\n    ".join(have)))
        if "house.py: {} breach(es)".format(len(want)) not in got.stdout:
            failures.append("fixture: no count line in\n" + got.stdout)

    mine = subprocess.run([sys.executable, checker, "--root", root], capture_output=True,
                          text=True)
    if mine.returncode != 0:
        failures.append("the repository breaks the house rules:\n" + mine.stdout + mine.stderr)
    else:
        print(mine.stdout.strip())
    for f in failures:
        print("FAIL:", f)
    print("house_test: {} failure(s)".format(len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
