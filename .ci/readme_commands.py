#!/usr/bin/env python3
"""The shell commands of the repository's READMEs, as CI runs them (Python 3 standard library
only).

Every fenced block of a README.md names its language in its info string; a shell block (sh,
bash, shell, console) also says whether CI runs it:

    ```sh ci                        .ci/install_check runs the block as written
    ```sh no-ci: needs a GPU        not run; listed with the reason among the skipped blocks

Other blocks (python, cpp, text for output, ...) carry no marker. A fence without a language,
an indented code block, a shell block without a marker, a no-ci without a reason, a marker on a
block that is not shell and an unclosed fence are errors naming FILE:LINE, so no command goes
unchecked silently.

A ci block runs as one bash script (`set -eo pipefail`, each command echoed with its README
line) from the folder given, with the environment of this process, under a timeout; a failure
names the README, the line of the command that failed and the output's tail. bash does not stop
at a failure left of `&&` or `||`, nor at one inside `export X=$(...)`, so a ci block may use
neither: one command per line, assign then export. A console block is a transcript: each `$ `
line is a command and the lines under it its output, which the command must print exactly
(stdout and stderr together; the exit status is not shown, so not checked).

usage:
  readme_commands.py check [--root DIR]           every README's blocks well marked (exit 1: not)
  readme_commands.py list [--root DIR] [--json]   the blocks that run and those skipped, why
  readme_commands.py run [--root DIR] [--cwd DIR] [--timeout S] [--logs DIR] [FILE[:LINE] ...]
                                                  runs the ci blocks (only those named, if any)
--root: where the READMEs are read (default: the repository holding this script); --cwd: where
the blocks run (default: --root). Exit status: 0, 1 (a block failed, or bad marking), 2 (usage).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

SHELLS = ("sh", "bash", "shell", "console")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^(?P<mark>ci|no-ci)(?P<rest>.*)$")
_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
_INDENTED = re.compile(r"^( {4}|\t)")
# `export X=$(cmd)`: the status is export's, so a failing cmd goes unnoticed.
_MASKED = re.compile(r"^\s*(export|local|declare|readonly|typeset)\s+[A-Za-z_][A-Za-z0-9_]*=.*\$\(")


class Block:
    """One fenced block: where it is, its language and marker, and its text."""

    def __init__(self, path, line, lang, action, reason, text, first_line):
        self.path = path            # as given (relative to the root)
        self.line = line            # the opening fence's line, 1-based
        self.lang = lang
        self.action = action        # "run", "skip" or None (not a shell block)
        self.reason = reason        # why it is skipped
        self.text = text            # the block's lines, joined, with a final newline
        self.first_line = first_line  # the README line of the text's first line

    def where(self):
        return "{}:{}".format(self.path, self.line)

    def as_dict(self):
        d = {"file": self.path, "line": self.line, "lang": self.lang, "action": self.action,
             "commands": self.text}
        if self.reason is not None:
            d["reason"] = self.reason
        return d


def parse(text, path):
    """The fenced blocks of a Markdown text, and the marking errors as "FILE:LINE: message"."""
    blocks, errors = [], []
    lines = text.split("\n")
    i = 0
    in_list = False  # inside a list item, where indented lines continue the item
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m.group("fence")[0] == "`" and "`" in m.group("info")):
            line = lines[i]
            if _LIST_ITEM.match(line):
                in_list = True
            elif line.strip() and not line[0].isspace():
                in_list = False
            elif (not in_list and _INDENTED.match(line) and i > 0 and not lines[i - 1].strip()):
                errors.append("{}:{}: an indented code block: write it as a fenced block that "
                              "names its language ({} with ci or no-ci: REASON for commands; "
                              "text for output, ...)".format(path, i + 1, ", ".join(SHELLS)))
                while i + 1 < len(lines) and (_INDENTED.match(lines[i + 1])
                                              or not lines[i + 1].strip()):
                    i += 1
            i += 1
            continue
        start, indent, fence = i + 1, m.group("indent"), m.group("fence")
        info = m.group("info").strip()
        body = []
        i += 1
        closed = False
        while i < len(lines):
            c = _FENCE.match(lines[i])
            if c and c.group("fence")[0] == fence[0] and len(c.group("fence")) >= len(fence) \
                    and not c.group("info").strip():
                closed = True
                break
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        where = "{}:{}".format(path, start)
        if not closed:
            errors.append("{}: the fence {} is never closed".format(where, fence))
            break
        lang, _, rest = info.partition(" ")
        rest = rest.strip()
        if not lang:
            errors.append("{}: a fence without a language: name one ({} for commands, with ci or "
                          "no-ci: REASON; python, cpp, text for output, ...)".format(
                              where, ", ".join(SHELLS)))
            continue
        mark = _MARKER.match(rest)
        action = reason = None
        if lang in SHELLS:
            if not mark:
                errors.append("{}: a {} block without a marker: `{} ci` (CI runs it) or "
                              "`{} no-ci: REASON` (it cannot run in CI, and why)".format(
                                  where, lang, lang, lang))
                continue
            if mark.group("mark") == "ci":
                if mark.group("rest").strip():
                    errors.append("{}: unexpected text after `ci`: '{}'".format(
                        where, mark.group("rest").strip()))
                    continue
                action = "run"
            else:
                r = mark.group("rest")
                reason = r[1:].strip() if r.startswith(":") else ""
                if not reason:
                    errors.append("{}: `no-ci` needs its reason: `{} no-ci: REASON`".format(
                        where, lang))
                    continue
                action = "skip"
        elif mark:
            errors.append("{}: a {} block marked `{}`: only {} blocks run".format(
                where, lang, mark.group("mark"), "/".join(SHELLS)))
            continue
        block = Block(path, start, lang, action, reason, "\n".join(body) + "\n", start + 1)
        if lang == "console" and not any(l.startswith("$ ") for l in body):
            errors.append("{}: a console block without a `$ ` command line".format(where))
            continue
        if action == "run":
            for n, l in enumerate(body):
                if lang == "console" and not l.startswith("$ "):
                    continue  # output
                code = re.sub(r"(^|\s)#.*$", "", l)
                if re.search(r"&&|\|\|", code):
                    errors.append("{}:{}: `&&` or `||` in a ci block: bash's set -e does not "
                                  "stop at a failure left of them; one command per line".format(
                                      path, start + 1 + n))
                if _MASKED.match(code):
                    errors.append("{}:{}: `{}` with a $(...) in a ci block: its status hides the "
                                  "command's failure; assign first, then export".format(
                                      path, start + 1 + n, code.split()[0]))
        blocks.append(block)
    return blocks, errors


def readmes(root):
    """The README.md files under root, relative paths, sorted: git's tracked ones where root is
    a git checkout, else every one outside build*/ and hidden folders."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", "README.md",
                              "*/README.md"], capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return sorted(files)
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and not x.startswith("build"))
        if "README.md" in files:
            found.append(os.path.relpath(os.path.join(d, "README.md"), root))
    return sorted(found)


def collect(root):
    blocks, errors = [], []
    for f in readmes(root):
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            b, e = parse(fh.read(), f)
        blocks += b
        errors += e
    return blocks, errors


def _script(block):
    """The bash script of a ci block: stops at the first failure and names its README line."""
    header = [
        "set -eo pipefail",
        # The trap's own commands are not echoed: its group's trace goes to /dev/null.
        "trap '{{ rc=$?; set +x; }} 2>/dev/null; "
        "echo \"readme_commands: {}:$((LINENO + @OFF@)): exit $rc\" >&2' ERR".format(block.path),
        "PS4='+ {}:$((LINENO + @OFF@)): '".format(block.path),
        "set -x",
    ]
    offset = block.first_line - (len(header) + 1)
    return "\n".join(header).replace("@OFF@", str(offset)) + "\n" + block.text


def _tail(path, n=40):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def transcript(block):
    """A console block's commands: (README line, command, the output lines it shows)."""
    steps = []
    for n, line in enumerate(block.text.rstrip("\n").split("\n")):
        if line.startswith("$ "):
            steps.append((block.first_line + n, line[2:], []))
        elif steps:
            steps[-1][2].append(line.rstrip())
    return [(n, c, _trim(out)) for n, c, out in steps]


def _trim(lines):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_console(block, cwd, timeout, logs):
    """Runs a console block's commands one by one; each must print what the README shows
    (stdout and stderr together; the exit status is not shown, so not checked)."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", block.where())
    log = os.path.join(logs, name + ".log")
    t0 = time.monotonic()
    with open(log, "w") as f:
        for line, cmd, want in transcript(block):
            f.write("$ {}\n".format(cmd))
            try:
                p = subprocess.run(["bash", "--noprofile", "--norc", "-o", "pipefail", "-c", cmd],
                                   cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, timeout=timeout)
            except subprocess.TimeoutExpired:
                return False, time.monotonic() - t0, "{}:{} (block at line {}): timed out " \
                    "after {:g} s".format(block.path, line, block.line, timeout)
            out = p.stdout.decode(errors="replace")
            f.write(out + "(exit {})\n".format(p.returncode))
            got = _trim(out.split("\n"))
            if got != want:
                return False, time.monotonic() - t0, "{}:{} (block at line {}): the output " \
                    "differs from the README's (exit {}).\n  README:\n{}\n  got:\n{}".format(
                        block.path, line, block.line, p.returncode,
                        "\n".join("    " + l for l in want), "\n".join("    " + l for l in got))
    return True, time.monotonic() - t0, ""


def run_block(block, cwd, timeout, logs):
    """Runs one ci block; returns (ok, seconds, message)."""
    if block.lang == "console":
        return run_console(block, cwd, timeout, logs)
    name = re.sub(r"[^A-Za-z0-9]+", "_", block.where())
    script = os.path.join(logs, name + ".sh")
    log = os.path.join(logs, name + ".log")
    with open(script, "w") as f:
        f.write(_script(block))
    t0 = time.monotonic()
    with open(log, "wb") as out:
        p = subprocess.Popen(["bash", "--noprofile", "--norc", script], cwd=cwd, stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = p.returncode
    took = time.monotonic() - t0
    # A block that leaves a process running holds the session: end what is left of it.
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if timed_out:
        return False, took, "{} (block at line {}): timed out after {:g} s (log {}); its " \
            "output's tail:\n{}".format(block.path, block.line, timeout, log, _tail(log))
    if rc != 0:
        # The ERR trap's last line names the command that failed; a block killed by a signal
        # has none.
        at = None
        with open(log, errors="replace") as f:
            for line in f:
                m = re.match(r"readme_commands: (\S+:\d+): exit \d+$", line.rstrip("\n"))
                if m:
                    at = m.group(1)
        return False, took, "{} (block at line {}): exit {} (log {}); its output's tail:\n{}" \
            .format(at or block.path, block.line, rc, log, _tail(log))
    return True, took, ""


def _selected(block, only):
    if not only:
        return True
    for o in only:
        f, _, line = o.partition(":")
        if block.path == f and (not line or int(line) == block.line):
            return True
    return False


def main(argv=None):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(prog="readme_commands.py",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in ("check", "list", "run"):
        s = sub.add_parser(c)
        s.add_argument("--root", default=here, help="where the READMEs are read")
        if c == "list":
            s.add_argument("--json", action="store_true", help="the blocks as JSON")
        if c == "run":
            s.add_argument("--cwd", help="where the blocks run (default: --root)")
            s.add_argument("--timeout", type=float, default=300, help="seconds per block")
            s.add_argument("--logs", help="folder for each block's script and log (default: a "
                           "new one under the system's temporary folder)")
            s.add_argument("only", nargs="*", metavar="FILE[:LINE]",
                           help="run only these READMEs or blocks")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    blocks, errors = collect(root)
    for e in errors:
        print("readme_commands: {}".format(e), file=sys.stderr)
    if errors:
        print("readme_commands: {} marking error(s) in the READMEs under {}".format(
            len(errors), root), file=sys.stderr)
        return 1
    shell = [b for b in blocks if b.action]
    if args.cmd == "check":
        print("readme_commands: {} shell blocks in {} READMEs: {} run in CI, {} skipped with "
              "their reason".format(len(shell), len({b.path for b in blocks}),
                                    sum(b.action == "run" for b in shell),
                                    sum(b.action == "skip" for b in shell)))
        return 0
    if args.cmd == "list":
        if args.json:
            json.dump([b.as_dict() for b in shell], sys.stdout, indent=1)
            print()
        else:
            for b in shell:
                print("{:5} {}{}".format("run" if b.action == "run" else "skip", b.where(),
                                         ": " + b.reason if b.reason else ""))
        return 0
    if args.only:
        known = {b.path for b in shell} | {b.where() for b in shell}
        unknown = [o for o in args.only if o not in known]
        if unknown:
            print("readme_commands: no shell block at {}".format(", ".join(unknown)),
                  file=sys.stderr)
            return 2
    cwd = os.path.abspath(args.cwd or root)
    logs = args.logs
    if logs:
        os.makedirs(logs, exist_ok=True)
    else:
        import tempfile
        logs = tempfile.mkdtemp(prefix="readme-commands.")
    chosen = [b for b in shell if _selected(b, args.only)]
    failed = ran = 0
    for b in chosen:
        if b.action == "skip":
            print("skip  {}: {}".format(b.where(), b.reason))
            continue
        ran += 1
        ok, took, msg = run_block(b, cwd, args.timeout, logs)
        if ok:
            print("ok    {} ({:.1f} s)".format(b.where(), took))
        else:
            failed += 1
            print("FAIL  {} ({:.1f} s)".format(b.where(), took))
            print("readme_commands: FAIL: {}".format(msg), file=sys.stderr)
        sys.stdout.flush()
    skipped = len(chosen) - ran
    print("readme_commands: {} block(s) ran, {} failed; {} skipped (reasons above); logs in "
          "{}".format(ran, failed, skipped, logs))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
