"""Time from a node's death to training going on again, on torchrun.

    PYTHONPATH=python:build/python python3 bench/elastic_recovery.py [--kills 5] [--nodes 3]

Nodes are network namespaces on a bridge (tests/python/elastic_netns.py; root needed), one
``python -m bagua.distributed.run --nnodes 2:N --rdzv_backend c10d`` agent per node, one worker
each (tests/python/elastic_worker.py: checkpoint every step, resume from the newest). Per kill:
SIGKILL the last node (agent and worker), time until the survivors' new workers have trained
their first step, then bring the node back and wait for the full world before the next kill.
Two configurations in the same run: bagua's rendezvous defaults (keep-alive 2 s x 3, last call
5 s) and torch's (5 s x 3, 30 s), each --kills times; prints the medians and their ratio, and
the split of the bagua median into re-rendezvous (kill -> new worker process started) and
worker start (import, init_process_group, checkpoint load, first step).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "python")
sys.path.insert(0, TESTS)

from elastic_netns import Nodes  # noqa: E402
import elastic_torchrun as T  # noqa: E402


def run(config, kills, n, env):
    times, splits = [], []
    with tempfile.TemporaryDirectory(prefix="bagua_recovery_") as d, Nodes(n) as nodes:
        why = nodes.refused()
        if why:
            raise SystemExit("bench: network namespaces unavailable: " + why)
        logs, pace = os.path.join(d, "logs"), os.path.join(d, "pace")
        T.set_pace(pace, 0.2)
        args = T.worker_args(os.path.join(d, "ckpt"), logs, pace)
        args[args.index("--epochs") + 1] = "1000"  # runs until stopped

        def agent(i):
            conf = "is_host={},join_timeout=300".format(int(i == 0))
            if config:
                conf += "," + config
            argv = [sys.executable, "-m", "bagua.distributed.run", "--nnodes",
                    "2:{}".format(n), "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                    "--rdzv_endpoint", "{}:29400".format(nodes.addr(0)), "--rdzv_id", "bench",
                    "--rdzv_conf", conf, "--max_restarts", "100", "--monitor_interval", "1"]
            return nodes.start(i, argv + args, env, os.path.join(d, "agent{}.txt".format(i)))

        def latest():
            att = T.read_logs(logs) if os.path.isdir(logs) else []
            return att[-1] if att else None

        def training(world, steps, after=0.0):
            a = latest()
            ok = a and a["world"] == world and len(a["steps"]) >= steps and a["start"] > after
            return a if ok else None

        def logs_of():
            return open(os.path.join(d, "agent0.txt"), errors="replace").read()[-3000:]

        for i in range(n):
            agent(i)
        T.wait_for(lambda: training(n, 2), 300, "the first full world", logs_of)
        for k in range(kills):
            t = time.time()
            nodes.kill_node(n - 1)
            a = T.wait_for(lambda: training(n - 1, 1, t), 300, "the survivors", logs_of)
            first = min(r["time"] for r in a["steps"][min(a["steps"])].values())
            times.append(first - t)
            splits.append((a["process_start"] - t, first - a["process_start"]))
            print("  kill {}: training again after {:.1f} s (new workers started after {:.1f} s)"
                  .format(k + 1, first - t, a["process_start"] - t), flush=True)
            if k + 1 < kills:
                agent(n - 1)
                T.wait_for(lambda: training(n, 2, t), 300, "the node back", logs_of)
    return times, splits


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--nodes", type=int, default=3)
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               BAGUA_RENDEZVOUS_TIMEOUT_MS="120000", BAGUA_COLLECTIVE_TIMEOUT_MS="120000")
    results = {}
    for name, conf in (("bagua defaults (keep-alive 2 s x 3, last call 5 s)", ""),
                       ("torch defaults (keep-alive 5 s x 3, last call 30 s)",
                        "keep_alive_interval=5,keep_alive_max_attempt=3,last_call_timeout=30")):
        print(name, flush=True)
        results[name] = run(conf, a.kills, a.nodes, env)
    meds = {k: statistics.median(v[0]) for k, v in results.items()}
    for k, v in results.items():
        rdzv = statistics.median(s[0] for s in v[1])
        start = statistics.median(s[1] for s in v[1])
        print("{}: median {:.1f} s over {} kills (re-rendezvous {:.1f} s, worker start to first "
              "step {:.1f} s); all: {}".format(k, meds[k], len(v[0]), rdzv, start,
                                                [round(x, 1) for x in v[0]]))
    b, t = list(meds.values())
    print("ratio torch / bagua: {:.2f}x".format(t / b))


if __name__ == "__main__":
    main()
