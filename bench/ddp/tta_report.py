"""Time to accuracy, the launcher's side (compare.py --tta): the derived figures, the printed
table and the plot of the metric against wall time.

Derived per contestant (added to the JSON row): speed_vs_ddp = DDP's wall time to the target
over this one's (> 1 is faster), speed_vs_best_torch = the same against the fastest of the torch
contestants (DDP and its hooks) that reached the target, and metric_vs_ddp_at_cap = the relative
difference of the metric at the step cap against DDP's, signed so that > 0 is better.
A contestant that did not reach the target has no speed; the table says "not reached".

From a saved run (compare.py --tta --json FILE), e.g. where the run's Python has no matplotlib:
    python3 bench/ddp/tta_report.py FILE [--plot PREFIX]   # the tables again, PREFIX-<model>.png
    python3 bench/ddp/tta_report.py FILE --lm-margin 0.5   # another target, from the same points
Every evaluation point is in the JSON, so a target other than the run's is derived exactly as
the run would have: the first evaluation that reaches it (not with --stop-at-target runs, whose
contestants stopped at the run's target).
"""

import math
import re

TORCH = ("ddp", "ddp_bf16", "ddp_fp16")
# PowerSGD at a rank named by the digits (none: --powersgd-rank): ddp_powersgd<N> torch's hook,
# powersgd<N> ours, powersgd<N>q ours with its factors sent as 8 bits.
POWERSGD_NAME = re.compile(r"(ddp_)?powersgd([1-9][0-9]*)?(q?)")


def is_powersgd(name, ours=None):
    """Whether ``name`` is a PowerSGD contestant; ``ours`` True: ours only, False: torch's hook
    only. The ``q`` suffix names ours alone."""
    m = POWERSGD_NAME.fullmatch(name)
    if m is None or (m.group(1) and m.group(3)):
        return False
    return ours is None or ours == (not m.group(1))


def is_torch(name):
    """A contestant torch alone provides (DDP, its compression hooks)."""
    return name in TORCH or is_powersgd(name, ours=False)


def derive(res):
    """Adds the speeds and the metric against DDP's at the cap to res["results"]' rows; returns
    (the DDP row or None, the best torch row or None)."""
    rows = res["results"]
    better = res["task"]["better"]
    ddp = next((r for r in rows if r["name"] == "ddp"), None)
    torch_rows = [r for r in rows if is_torch(r["name"]) and r["reached_wall_s"] is not None]
    best = min(torch_rows, key=lambda r: r["reached_wall_s"]) if torch_rows else None
    for r in rows:
        t = r["reached_wall_s"]
        r["speed_vs_ddp"] = (ddp["reached_wall_s"] / t if ddp and t and
                             ddp["reached_wall_s"] is not None else None)
        r["speed_vs_best_torch"] = best["reached_wall_s"] / t if best and t else None
        r["best_torch"] = best["name"] if best else None
        rel = None
        if ddp and ddp.get("metric_at_cap") is not None and r.get("metric_at_cap") is not None:
            d = ddp["metric_at_cap"]
            rel = (r["metric_at_cap"] - d) / abs(d) if d else None
            if rel is not None and better == "lower":
                rel = -rel
        r["metric_vs_ddp_at_cap"] = rel
    return ddp, best


def retarget(res, target):
    """Sets the run's target to ``target`` and re-derives every contestant's first evaluation
    that reaches it."""
    task = res["task"]
    if res.get("stop_at_target"):
        raise ValueError("a --stop-at-target run stopped at its own target: no other target")
    task["target"] = target
    if "floor" in task:
        task["margin"] = target - task["floor"]
    for r in res["results"]:
        r["reached_step"] = r["reached_wall_s"] = None
        for step, wall, m in r["evals"][1:]:
            if (m <= target) if task["better"] == "lower" else (m >= target):
                r["reached_step"], r["reached_wall_s"] = step, wall
                break


def _fmt(v, spec, missing="-"):
    return missing if v is None else format(v, spec)


def table(res, link_desc):
    """Prints the run's table (after derive())."""
    task = res["task"]
    _, best = derive(res)
    print()
    print("time to accuracy: {} ({}, {:.2f} M parameters), {} ranks, {}, {}; torch {}".format(
        res["model"], res["preset"], res["params"] / 1e6, res["world"], res["device"], link_desc,
        res["torch"]))
    if "floor" in task:
        print("target: {} <= {:.4f} (the Markov chain's loss floor {:.4f} + {:.3f})".format(
            task["metric"], task["target"], task["floor"], task["margin"]))
    else:
        print("target: {} >= {:.1f} ({} classes)".format(task["metric"], task["target"],
                                                          task["classes"]))
    print("evaluation every {} steps on {} held-out {} (time excluded, below); step cap {}; "
          "Adam lr {}{}, batch {} per rank; PowerSGD start / QAdam and async warm-up: step {}"
          .format(res["eval_every"], task["eval_samples"], task["eval_unit"], res["max_steps"],
                  res["lr"], " (linear warm-up over {} steps)".format(res["lr_warmup"])
                  if res.get("lr_warmup") else "", res["batch_per_rank"], res["algo_warmup"]))
    hdr = "{:28s} {:>10s} {:>7s} {:>7s} {:>9s} {:>11s} {:>9s} {:>8s} {:>7s}".format(
        "contestant", "to target", "steps", "vs DDP", "vs torch", "metric@cap", "vs DDP", "step ms",
        "eval s")
    print(hdr)
    print("-" * len(hdr))
    for r in res["results"]:
        to = ("{:9.1f}s".format(r["reached_wall_s"]) if r["reached_wall_s"] is not None
              else "not reached")
        print("{:28s} {:>10s} {:>7s} {:>7s} {:>9s} {:>11s} {:>9s} {:>8s} {:7.1f}".format(
            r["name"], to, _fmt(r["reached_step"], "d"), _fmt(r["speed_vs_ddp"], ".2f") +
            ("x" if r["speed_vs_ddp"] is not None else ""),
            _fmt(r["speed_vs_best_torch"], ".2f") +
            ("x" if r["speed_vs_best_torch"] is not None else ""),
            _fmt(r["metric_at_cap"], ".4f"),
            _fmt(None if r["metric_vs_ddp_at_cap"] is None else
                 100 * r["metric_vs_ddp_at_cap"] + 0.0, "+.2f") +
            ("%" if r["metric_vs_ddp_at_cap"] is not None else ""),
            _fmt(r["step_ms"], ".1f"), r["eval_s"]))
    print("vs torch: against {} (the fastest torch contestant to the target); metric@cap vs DDP: "
          "> 0 is better".format(best["name"] if best else "none (no torch contestant reached "
                                 "it)"))
    for r in res["results"]:
        if r.get("auto_decision"):
            print("auto: {}".format(r["auto_decision"]["reason"]))
        if r.get("note"):
            print("{}: {}".format(r["name"], r["note"]))
    for name, why in res.get("skipped", {}).items():
        print("{}: skipped ({})".format(name, why))


def plot(res, path, link_desc):
    """The metric against wall time, one line per contestant, the target dashed (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = res["task"]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=90)
    cmap = plt.get_cmap("tab20")
    for i, r in enumerate(res["results"]):
        xs = [e[1] for e in r["evals"]]
        ys = [e[2] for e in r["evals"]]
        style = "-" if r["name"].startswith("ddp") else "-."
        if r["name"] in ("auto",) or r["name"].startswith("powersgd"):
            style = "--"
        ax.plot(xs, ys, style, color=cmap(i % 20), label=r["name"], linewidth=1.4)
        if r["reached_wall_s"] is not None:
            ax.plot([r["reached_wall_s"]], [r["evals"][[e[0] for e in r["evals"]].index(
                r["reached_step"])][2]], "o", color=cmap(i % 20), markersize=4)
    ax.axhline(task["target"], color="black", linestyle=":", linewidth=1,
               label="target {:.3g}".format(task["target"]))
    if "floor" in task:
        ax.axhline(task["floor"], color="grey", linestyle=":", linewidth=1,
                   label="loss floor {:.3g}".format(task["floor"]))
        # From just under the floor to 8 margins above the target: the approach to the target
        # is what differs (the first steps, from ln(vocabulary) down, are alike).
        ys = [e[2] for r in res["results"] for e in r["evals"] if math.isfinite(e[2])]
        ax.set_ylim(task["floor"] - 0.05, min(max(ys + [task["target"]]),
                                               task["target"] + 8 * task["margin"]))
    else:
        ax.set_ylim(0, 100)
    ax.set_xlabel("wall time of training (s, evaluation excluded)")
    ax.set_ylabel(task["metric"])
    ax.set_title("{} ({}), {} ranks, {}".format(res["model"], res["preset"], res["world"],
                                                link_desc), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    import argparse
    import json

    ap = argparse.ArgumentParser(description="tables and plots of a compare.py --tta JSON")
    ap.add_argument("json")
    ap.add_argument("--plot", default="", help="PNG path prefix: PREFIX-<model>.png")
    ap.add_argument("--lm-margin", type=float, default=None,
                    help="transformer: the target at this many nats above the loss floor")
    ap.add_argument("--target-acc", type=float, default=None,
                    help="resnet50: the target top-1 accuracy in %%")
    a = ap.parse_args()
    with open(a.json) as f:
        runs = json.load(f)["runs"]
    for res in runs:
        if res.get("mode") != "tta":
            continue
        if res["model"] == "transformer" and a.lm_margin is not None:
            retarget(res, res["task"]["floor"] + a.lm_margin)
        elif res["model"] == "resnet50" and a.target_acc is not None:
            retarget(res, a.target_acc)
        table(res, res["link"])
        if a.plot:
            path = "{}-{}.png".format(a.plot, res["model"])
            plot(res, path, res["link"])
            print("plot: {}".format(path))


if __name__ == "__main__":
    main()
