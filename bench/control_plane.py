#!/usr/bin/env python3
"""What the job key costs: the same jobs with the key (baguarun's fresh BAGUA_JOB_KEY, what a
single-node launch gets) and without it (an empty BAGUA_JOB_KEY: nothing authenticated),
alternating run by run so that the machine's load hits both alike.

For each round and each contestant: bagua-train-demo on 4 ranks (samples/s over the run, and the
wall time of a 20-step run: process start, rendezvous and connection set-up, the steps), once on
the default transport (shared memory on one host) and once with BAGUA_HOST_TRANSPORT=engine (the
engine's per-connection key challenge), and bagua-allreduce-bench (busbw at a few sizes, shm
and engine groups). Prints the medians and the ratio keyed / keyless with the spread of the
per-round ratios.

    python3 bench/control_plane.py --build build --rounds 5
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time


def run(cmd, env, timeout=600):
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("failed ({}): {}\n{}".format(p.returncode, " ".join(cmd), p.stdout[-3000:]))
    return p.stdout, wall


def env_for(keyed, extra):
    env = dict(os.environ)
    env.pop("BAGUA_JOB_KEY", None)
    env.pop("BAGUA_JOB_KEY_FILE", None)
    if not keyed:
        env["BAGUA_JOB_KEY"] = ""  # baguarun then makes none; the ranks run unauthenticated
    env["BAGUA_LOG_LEVEL"] = "error"  # the keyless ranks' warning is not what is measured
    env.update(extra)
    return env


def samples_per_s(out):
    m = re.findall(r"([0-9.]+) samples/s", out)
    if not m:
        sys.exit("no samples/s in:\n" + out[-2000:])
    return float(m[-1])


def busbw(out):
    """{(transport, size): busbw GB/s} from bagua-allreduce-bench's table, whose lines read
    "  64K   200 |   955.3   0.103 GB/s |   567.3   0.173 GB/s" under a header naming the
    contestants ("size iters |  shm us  busbw | engine us  busbw")."""
    got = {}
    names = None
    for line in out.splitlines():
        cells = [c.split() for c in line.split("|")]
        if len(cells) < 2 or not cells[0]:
            continue
        if cells[0][0] == "size":
            names = [c[0] for c in cells[1:] if c]
            continue
        if names is None or not re.match(r"^[0-9]+[KMG]?$", cells[0][0]):
            continue
        for name, cell in zip(names, cells[1:]):
            if len(cell) >= 3 and cell[2] == "GB/s":
                got[(name, cells[0][0])] = float(cell[1])
    if not got:
        sys.exit("no busbw table in:\n" + out[-2000:])
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sizes", default="64K,1M,16M")
    args = ap.parse_args()
    launcher = os.path.join(args.build, "tools/baguarun/baguarun")
    demo = os.path.join(args.build, "tools/train_demo/bagua-train-demo")
    bench = os.path.join(args.build, "bench/allreduce/bagua-allreduce-bench")
    base = [launcher, "--nproc_per_node", "4", "--master_port", "0"]
    results = {}  # (figure, keyed) -> [value per round]

    def add(figure, keyed, value):
        results.setdefault((figure, keyed), []).append(value)

    for r in range(args.rounds):
        for keyed in ((True, False) if r % 2 == 0 else (False, True)):
            for transport in ("auto", "engine"):
                env = env_for(keyed, {"BAGUA_HOST_TRANSPORT": transport})
                out, _ = run(base + [demo, "--steps", str(args.steps)], env)
                add("train demo samples/s ({})".format(transport), keyed, samples_per_s(out))
                _, wall = run(base + [demo, "--steps", "20"], env)
                add("train demo, 20 steps: wall s ({})".format(transport), keyed, wall)
            out, _ = run(base + [bench, "--sizes", args.sizes, "--no_gloo", "--reps", "3",
                                 "--transports", "shm,engine"], env_for(keyed, {}))
            for (t, size), v in busbw(out).items():
                add("all-reduce busbw GB/s, {} {}".format(t, size), keyed, v)
        print("round {} of {} done".format(r + 1, args.rounds), file=sys.stderr, flush=True)

    print("| figure | with the key (median) | without | ratio with / without (median, "
          "per-round range) |")
    print("| --- | --- | --- | --- |")
    for figure in sorted({f for f, _ in results}):
        on = results[(figure, True)]
        off = results[(figure, False)]
        ratios = sorted(a / b for a, b in zip(on, off))
        print("| {} | {:.3f} | {:.3f} | {:.3f} ({:.3f}-{:.3f}) |".format(
            figure, statistics.median(on), statistics.median(off), statistics.median(ratios),
            ratios[0], ratios[-1]))


if __name__ == "__main__":
    main()
