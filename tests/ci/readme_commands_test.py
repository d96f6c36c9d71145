#!/usr/bin/env python3
"""Tests of .ci/readme_commands.py, the extractor and runner of the READMEs' shell blocks.

usage: readme_commands_test.py EXTRACTOR REPO_ROOT

- readme_fixture.md (as a README.md) -> readme_fixture.json: every shell block with its file,
  line, language, marker, skip reason and commands; python and text blocks are not listed;
- running it: the ci blocks run in order from --cwd (a nested README's too), a skipped block is
  listed with its reason, a failing command fails the run naming the README line of that
  command and its block, stops its block and not the later ones; a block past its timeout fails
  naming the timeout, and what it started is ended;
- every marking error (MARKING_CASES) exits 1 naming FILE:LINE;
- the repository's own READMEs are all marked.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (README text, the error it must report; None: it is well marked)
MARKING_CASES = [
    ("# t\n\n```sh\nls\n```\n",
     "README.md:3: a sh block without a marker"),
    ("```bash no-ci\nls\n```\n",
     "README.md:1: `no-ci` needs its reason"),
    ("```sh no-ci:   \nls\n```\n",
     "README.md:1: `no-ci` needs its reason"),
    ("text\n```\nls\n```\n",
     "README.md:2: a fence without a language"),
    ("```python ci\nprint(1)\n```\n",
     "README.md:1: a python block marked `ci`: only sh/bash/shell/console blocks run"),
    ("```sh ci please\nls\n```\n",
     "README.md:1: unexpected text after `ci`: 'please'"),
    ("```sh ci\nls\n", "README.md:1: the fence ``` is never closed"),
    ("```sh ci\nls\nmeson setup b && ninja -C b\n```\n",
     "README.md:3: `&&` or `||` in a ci block"),
    ("```sh ci\ntrue || echo no\n```\n",
     "README.md:2: `&&` or `||` in a ci block"),
    ("```sh ci\nexport PLUGIN=$(python -m bagua.net --path)\n```\n",
     "README.md:2: `export` with a $(...) in a ci block"),
    ("text\n\n    ls -l\n    pwd\n\nmore text\n",
     "README.md:3: an indented code block"),
    ("```console ci\nhello\n```\n", "README.md:1: a console block without a `$ ` command line"),
    # what is well marked: && in a comment or in a block that does not run; a list item's
    # indented continuation; an assignment before its export
    ("- an item\n\n    its second paragraph\n", None),
    ("```sh ci\nPLUGIN=$(python -m bagua.net --path)\nexport PLUGIN\n```\n", None),
    ("```sh ci\nls   # then: make && make install\n```\n", None),
    ("```sh no-ci: two hosts\nssh a && ssh b\n```\n", None),
    ("```c++\nif (a && b) {}\n```\n", None),
]

failures = []
BASE = tempfile.mkdtemp(prefix="readme-commands-test.")  # every folder the test makes


def check(cond, what):
    print("{}: {}".format("ok" if cond else "FAILED", what))
    if not cond:
        failures.append(what)


def tool(extractor, *args, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, extractor] + list(args), capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, TMPDIR=BASE))  # its logs in BASE
    return p, time.monotonic() - t0


def make_root(readmes):
    root = tempfile.mkdtemp(dir=BASE)
    for rel, text in readmes.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    return root


def main():
    extractor, repo = sys.argv[1], sys.argv[2]
    with open(os.path.join(HERE, "readme_fixture.md")) as f:
        fixture = f.read()
    with open(os.path.join(HERE, "readme_fixture.json")) as f:
        expected = json.load(f)

    # The extraction, as data.
    root = make_root({"README.md": fixture})
    p, _ = tool(extractor, "list", "--json", "--root", root)
    check(p.returncode == 0, "list --json exits 0 ({})".format(p.stderr.strip()))
    got = json.loads(p.stdout) if p.returncode == 0 else None
    check(got == expected, "the fixture's blocks, markers, reasons and commands are extracted "
          "exactly\n  got:      {}\n  expected: {}".format(got, expected))
    p, _ = tool(extractor, "list", "--root", root)
    check("skip  README.md:10: needs a GPU" in p.stdout.splitlines(),
          "list names a skipped block with its reason:\n" + p.stdout)

    # Running it, with a nested README, from another folder.
    root = make_root({"README.md": fixture, "sub/README.md": "```sh ci\npwd > where.txt\n```\n"})
    cwd = tempfile.mkdtemp(dir=BASE)
    p, _ = tool(extractor, "run", "--root", root, "--cwd", cwd, "--logs",
                os.path.join(root, "logs"))
    out = p.stdout.splitlines()
    check(p.returncode == 1, "a failing command fails the run (exit {})".format(p.returncode))
    status = [re.sub(r" \([0-9.]+ s\)$", "", l) for l in out if not l.startswith("readme_commands:")]
    check(status == ["ok    README.md:5", "skip  README.md:10: needs a GPU", "ok    README.md:24",
                     "skip  README.md:29: two hosts (node0, node1)", "FAIL  README.md:35",
                     "ok    README.md:41", "ok    README.md:47", "ok    sub/README.md:1"],
          "every block reported in order, skips with their reason:\n" + p.stdout)
    check("readme_commands: FAIL: README.md:37 (block at line 35): exit 1" in p.stderr,
          "the failure names the failing command's README line and its block:\n" + p.stderr)
    check(out[-1].startswith("readme_commands: 6 block(s) ran, 1 failed; 2 skipped"),
          "the summary counts them: " + out[-1])
    with open(os.path.join(cwd, "out.txt")) as f:
        check(f.read() == "first\nindented\nbefore\nlast\n",
              "the blocks ran in order from --cwd; the failing one stopped at its failure")
    with open(os.path.join(cwd, "where.txt")) as f:
        check(f.read().strip() == os.path.realpath(cwd), "a nested README's block runs from --cwd")
    log = os.path.join(root, "logs", "README_md_35.log")
    check(os.path.isfile(log) and "+ README.md:36: echo before" in open(log).read(),
          "the block's log echoes each command with its README line")

    # A transcript whose command prints something else fails, naming that command's line.
    other = make_root({"README.md": "```console ci\n$ echo one\none\n$ echo three\ntwo\n```\n"})
    p, _ = tool(extractor, "run", "--root", other)
    check(p.returncode == 1 and "README.md:4 (block at line 1): the output differs from the "
          "README's (exit 0)" in p.stderr and "    two\n  got:\n    three" in p.stderr,
          "a transcript's differing output fails naming the command's line:\n" + p.stderr)

    # Only some blocks; a block that names none.
    cwd = tempfile.mkdtemp(dir=BASE)
    p, _ = tool(extractor, "run", "--root", root, "--cwd", cwd, "README.md:5", "sub/README.md")
    check(p.returncode == 0 and p.stdout.splitlines()[-1].startswith(
        "readme_commands: 2 block(s) ran, 0 failed; 0 skipped"),
        "FILE:LINE and FILE select blocks:\n" + p.stdout + p.stderr)
    p, _ = tool(extractor, "run", "--root", root, "--cwd", cwd, "README.md:6")
    check(p.returncode == 2 and "no shell block at README.md:6" in p.stderr,
          "a selection that names no block is a usage error: " + p.stderr)

    # A block past its timeout fails, and what it started is ended.
    root = make_root({"README.md": "```sh ci\nsleep 300 &\necho $! > pid.txt\nwait\n```\n"})
    p, took = tool(extractor, "run", "--root", root, "--timeout", "2")
    check(p.returncode == 1 and "README.md (block at line 1): timed out after 2 s" in p.stderr,
          "a block past its timeout fails naming it:\n" + p.stderr)
    check(took < 60, "the timeout ends it (took {:.1f} s)".format(took))
    with open(os.path.join(root, "pid.txt")) as f:
        pid = int(f.read())
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            alive = f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        alive = False
    check(not alive, "the block's background process {} is ended".format(pid))

    # Marking errors name FILE:LINE.
    for text, error in MARKING_CASES:
        root = make_root({"README.md": text})
        p, _ = tool(extractor, "check", "--root", root)
        if error is None:
            check(p.returncode == 0, "well marked: {!r} ({})".format(text, p.stderr.strip()))
        else:
            check(p.returncode == 1 and "readme_commands: " + error in p.stderr,
                  "{!r} -> {!r}; got exit {}: {}".format(text, error, p.returncode,
                                                       p.stderr.strip()))

    # The repository's own READMEs.
    p, _ = tool(extractor, "check", "--root", repo)
    check(p.returncode == 0, "every shell block of the repository's READMEs is marked:\n" +
          p.stdout + p.stderr)

    if failures:
        print("{} check(s) failed".format(len(failures)))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        shutil.rmtree(BASE, ignore_errors=True)
    sys.exit(rc)
