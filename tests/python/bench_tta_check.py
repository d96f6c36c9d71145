"""The time-to-accuracy mode of bench/ddp (compare.py --tta) as a test of its machinery, not of
timings: two contestants (DDP, gradient_allreduce), both models, a 4-step cap with an evaluation
every 2 steps and targets every run reaches at its first evaluation; over a 1 Gbit/s netns link
where this process may build one (root, iproute2), else over loopback (said on stdout). Checks
that the run succeeds, the table prints, the JSON holds every field and every evaluation point,
the LM's floor is the Markov chain's exact one, and each plot is a PNG; that a TTA option
without --tta is refused; and which contestant names are PowerSGD at a rank (torch's hook, ours,
ours with 8-bit factors), a misnamed one refused.

usage: bench_tta_check.py COMPARE_PY BUILD_DIR"""

import json
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg, out=""):
    print("FAIL: " + msg)
    if out:
        print(out[-6000:])
    sys.exit(1)


def main():
    compare, build = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(compare))
    import models  # noqa: E402

    netns = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
    link = ["--link", "1gbit"] if netns else []
    print("link: {}".format("1gbit per rank over netns" if netns else
                            "loopback (not root or no iproute2: no netns link)"))
    with tempfile.TemporaryDirectory(prefix="bagua_tta_") as tmp:
        js, plot = os.path.join(tmp, "tta.json"), os.path.join(tmp, "tta")
        cmd = [sys.executable, compare, "--tta", "--device", "cpu", "--nproc", "2",
               "--models", "transformer,resnet50", "--contestants", "ddp,gradient_allreduce",
               "--max-steps", "4", "--eval-every", "2", "--eval-batches", "2",
               "--lm-margin", "100", "--target-acc", "0", "--build", build, "--timeout", "200",
               "--json", js, "--plot", plot] + link
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=280)
        out = p.stdout.decode(errors="replace")
        if p.returncode != 0:
            fail("compare.py --tta exited with {}".format(p.returncode), out)
        if out.count("time to accuracy: ") != 2 or "to target" not in out:
            fail("the two tables are not printed", out)
        for name in ("ddp", "gradient_allreduce"):
            if not any(line.startswith(name + " ") for line in out.splitlines()):
                fail("no table row for " + name, out)
        with open(js) as f:
            runs = json.load(f)["runs"]
        if [r["model"] for r in runs] != ["transformer", "resnet50"]:
            fail("runs: {}".format([r.get("model") for r in runs]))
        for run in runs:
            for k in ("mode", "preset", "params", "world", "task", "eval_every", "max_steps",
                      "lr", "algo_warmup", "results", "link", "plot"):
                if k not in run:
                    fail("{}: no {!r} in the JSON".format(run["model"], k))
            task = run["task"]
            if run["mode"] != "tta" or run["max_steps"] != 4 or run["eval_every"] != 2:
                fail("{}: mode/cap/cadence {!r}".format(run["model"], run))
            if run["model"] == "transformer":
                floor = models.MarkovText(256).loss_floor(32)
                if abs(task["floor"] - floor) > 1e-12 or task["target"] != task["floor"] + 100:
                    fail("LM floor {} / target {}, expected {}".format(
                        task["floor"], task["target"], floor))
            elif task["target"] != 0 or task["metric"] != "top-1 accuracy (%)":
                fail("resnet task {!r}".format(task))
            names = [r["name"] for r in run["results"]]
            if names != ["ddp", "gradient_allreduce"]:
                fail("{}: contestants {}".format(run["model"], names))
            for r in run["results"]:
                steps = [e[0] for e in r["evals"]]
                walls = [e[1] for e in r["evals"]]
                if steps != [0, 2, 4] or walls[0] != 0 or walls != sorted(walls):
                    fail("{} {}: evaluation points {}".format(run["model"], r["name"], r["evals"]))
                if abs(walls[-1] - r["wall_s"]) > 1e-9 or len(r["block_s"]) != 2:
                    fail("{} {}: wall {} against the blocks {}".format(
                        run["model"], r["name"], r["wall_s"], r["block_s"]))
                if r["reached_step"] != 2 or r["reached_wall_s"] != walls[1]:
                    fail("{} {}: reached {} at {}".format(run["model"], r["name"],
                                                         r["reached_step"], r["reached_wall_s"]))
                if r["metric_at_cap"] != r["evals"][-1][2]:
                    fail("{} {}: metric at the cap".format(run["model"], r["name"]))
                for k in ("speed_vs_ddp", "speed_vs_best_torch", "metric_vs_ddp_at_cap",
                          "step_ms", "eval_s"):
                    if r.get(k) is None:
                        fail("{} {}: {} missing".format(run["model"], r["name"], k))
            ddp = run["results"][0]
            if ddp["speed_vs_ddp"] != 1.0 or ddp["best_torch"] != "ddp":
                fail("{}: DDP against itself {!r}".format(run["model"], ddp))
            with open(run["plot"], "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    fail("{} is not a PNG".format(run["plot"]))
        print("ok: {} runs, tables, JSON and plots".format(len(runs)))

    p = subprocess.run([sys.executable, compare, "--plot", "x"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 2 or "--plot and --stop-at-target go with --tta" not in out:
        fail("--plot without --tta: exit {}".format(p.returncode), out)
    print("ok: --plot without --tta refused")

    # PowerSGD at any rank: torch's hook (ddp_powersgd<N>), ours (powersgd<N>) and ours with
    # 8-bit factors (powersgd<N>q); the q suffix is ours alone, and a rank is >= 1.
    import tta_report  # noqa: E402
    named = {"ddp_powersgd16": (True, False, True), "powersgd32q": (True, True, False),
             "powersgd": (True, True, False), "powersgdq": (True, True, False),
             "ddp_powersgd4q": (False, False, False), "powersgd0": (False, False, False),
             "powersgd4x": (False, False, False), "ddp": (False, False, True)}
    for name, (psgd, ours, torch_side) in named.items():
        got = (tta_report.is_powersgd(name), tta_report.is_powersgd(name, ours=True),
               tta_report.is_torch(name))
        if got != (psgd, ours, torch_side):
            fail("{}: (powersgd, ours, torch's) = {}, expected {}".format(
                name, got, (psgd, ours, torch_side)))
    p = subprocess.run([sys.executable, compare, "--contestants", "ddp,ddp_powersgd4q"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 2 or "'ddp_powersgd4q' is not one of" not in out:
        fail("ddp_powersgd4q: exit {}".format(p.returncode), out)
    print("ok: PowerSGD contestant names")


if __name__ == "__main__":
    main()
