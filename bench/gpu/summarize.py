#!/usr/bin/env python3
"""Tables of bagua-nccl-bench runs.

summarize.py OUT LABEL...     busbw per size for the runs OUT/LABEL.json, ratios against the first.
summarize.py --sweep OUT      the network-path sweep of GPU step 17 (OUT/sweep<N>-<label>.json):
                              per rank count, busbw of every transport with Bagua-Net's ratio to
                              the best peer, to fastsocket and to the host's TCP ceiling; CPU
                              seconds per GB sent; the ceiling itself; and the targets' checks.
"""
import glob
import json
import os
import re
import sys

PEERS = ["socket", "socket-4x4", "fastsocket"]


def size_text(b):
    if b >= 1 << 30:
        return f"{b >> 30} GiB"
    if b >= 1 << 20:
        return f"{b >> 20} MiB"
    return f"{b >> 10} KiB" if b >= 1024 else f"{b} B"


def load_rows(path):
    with open(path) as f:
        d = json.load(f)
    return d, {r["bytes"]: r for r in d["rows"]}


def plain(out, labels):
    runs = {}
    for label in labels:
        path = os.path.join(out, label + ".json")
        try:
            runs[label] = load_rows(path)[1]
        except (OSError, ValueError, KeyError) as e:
            print(f"(no result for {label}: {e})")
    if not runs:
        return 1
    base = labels[0]
    sizes = sorted({b for r in runs.values() for b in r})
    present = [l for l in labels if l in runs]
    head = "| size | " + " | ".join(f"{l} busbw GB/s (us)" for l in present)
    head += "".join(f" | {l}/{base}" for l in present[1:] if base in runs) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for b in sizes:
        cells = []
        for l in present:
            r = runs[l].get(b)
            cells.append("-" if r is None else
                         f"{r['busbw']:.2f} ({r['usec']:.0f}){'' if r['correct'] else ' WRONG'}")
        ratios = []
        for l in present[1:]:
            if base in runs and b in runs[base] and b in runs[l]:
                ratios.append(f"{runs[l][b]['busbw'] / runs[base][b]['busbw']:.2f}x")
            elif base in runs:
                ratios.append("-")
        size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b} B"
        print(f"| {size} | " + " | ".join(cells) + "".join(f" | {r}" for r in ratios) + " |")
    return 0


def sweep(out):
    found = {}
    for path in glob.glob(os.path.join(out, "sweep*-*.json")):
        m = re.match(r"sweep(\d+)-(.+)\.json$", os.path.basename(path))
        if not m:
            continue
        try:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = load_rows(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"(unreadable {path}: {e})")
    if not found:
        print("no sweep results")
        return 1
    wrong = 0
    for n in sorted(found):
        runs = found[n]
        labels = [l for l in PEERS if l in runs]
        labels += sorted(l for l in runs if l not in PEERS and l != "bagua")
        labels += ["bagua"] if "bagua" in runs else []
        peers = [l for l in PEERS if l in runs]
        ceiling = {}  # bytes -> best busbw over stream counts
        ceiling_rows = []
        if "bagua" in runs:
            ceiling_rows = runs["bagua"][0].get("tcp_ceiling", [])
            for c in ceiling_rows:
                ceiling[c["bytes"]] = max(ceiling.get(c["bytes"], 0), c["busbw"])
        sizes = sorted({b for _, rows in runs.values() for b in rows})
        print(f"\n### {n} ranks: all-reduce busbw GB/s (time us up to 1 MiB)\n")
        head = ["size"] + labels
        if "bagua" in runs and peers:
            head += ["bagua / best peer", "bagua / fastsocket" if "fastsocket" in runs else None,
                     "bagua / TCP ceiling" if ceiling else None]
        head = [h for h in head if h]
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
        for b in sizes:
            cells = [size_text(b)]
            for l in labels:
                r = runs[l][1].get(b)
                if r is None:
                    cells.append("-")
                    continue
                wrong += 0 if r["correct"] else 1
                bw = r["busbw"]
                text = (f"{bw:.2f}" if bw >= 1 else f"{bw:.3f}") + (
                    f" ({r['usec']:.0f})" if b <= 1 << 20 else "")
                cells.append(text + ("" if r["correct"] else " WRONG"))
            bg = runs.get("bagua", (None, {}))[1].get(b)
            if bg and peers:
                best = max((runs[p][1][b]["busbw"], p) for p in peers if b in runs[p][1])
                cells.append(f"{bg['busbw'] / best[0]:.2f}x ({best[1]})")
                if "fastsocket" in runs and b in runs["fastsocket"][1]:
                    cells.append(f"{bg['busbw'] / runs['fastsocket'][1][b]['busbw']:.2f}x")
                elif "fastsocket" in runs:
                    cells.append("-")
                if ceiling:
                    cells.append(f"{bg['busbw'] / ceiling[b]:.2f}" if b in ceiling else "-")
            print("| " + " | ".join(cells) + " |")
        print(f"\n### {n} ranks: CPU seconds per GB sent (the ranks' threads but the launching "
              "ones)\n")
        print("| size | " + " | ".join(labels) + " |")
        print("|" + " --- |" * (len(labels) + 1))
        for b in sizes:
            if b < 1 << 20:
                continue
            cells = [size_text(b)]
            for l in labels:
                r = runs[l][1].get(b)
                cells.append("-" if r is None or "cpu_s_per_gb" not in r
                             else f"{r['cpu_s_per_gb']:.3f}")
            print("| " + " | ".join(cells) + " |")
        if ceiling_rows:
            print(f"\n### {n} ranks: TCP ceiling (same rank processes, plain sockets, no NCCL; "
                  "GB/s each rank sends, CPU s/GB)\n")
            streams = sorted({c["streams"] for c in ceiling_rows})
            print("| size | " + " | ".join(f"{s} streams" for s in streams) + " |")
            print("|" + " --- |" * (len(streams) + 1))
            for b in sorted({c["bytes"] for c in ceiling_rows}):
                cells = [size_text(b)]
                for s in streams:
                    c = [x for x in ceiling_rows if x["bytes"] == b and x["streams"] == s]
                    cells.append(f"{c[0]['busbw']:.2f} ({c[0]['cpu_s_per_gb']:.3f})" if c else "-")
                print("| " + " | ".join(cells) + " |")
        # The targets.
        if "bagua" in runs and peers:
            bag = runs["bagua"][1]
            worst = min(((bag[b]["busbw"] / max(runs[p][1][b]["busbw"] for p in peers
                                                 if b in runs[p][1]), b)
                         for b in bag if b >= 64 << 10 and any(b in runs[p][1] for p in peers)),
                        default=None)
            if worst:
                print(f"\n* {n} ranks, 64 KiB .. 1 GiB: Bagua-Net / best peer at least "
                      f"{worst[0]:.2f}x (at {size_text(worst[1])}); target 1.0x")
            if "fastsocket" in runs:
                fs = runs["fastsocket"][1]
                big = [b for b in bag if b >= 64 << 20 and b in fs]
                for b in big:
                    need = 2.0 * fs[b]["busbw"]
                    cap = ceiling.get(b)
                    goal = need if cap is None else min(need, 0.9 * cap)
                    print(f"* {n} ranks, {size_text(b)}: {bag[b]['busbw']:.2f} GB/s = "
                          f"{bag[b]['busbw'] / fs[b]['busbw']:.2f}x fastsocket"
                          + (f", {bag[b]['busbw'] / cap:.2f} of the TCP ceiling {cap:.2f}"
                             if cap else "")
                          + f"; target {goal:.2f} GB/s "
                          + ("met" if bag[b]["busbw"] >= goal else "NOT met"))
                b = 256 << 20
                if b in bag and b in fs and "cpu_s_per_gb" in bag[b]:
                    print(f"* {n} ranks, 256 MiB: CPU {bag[b]['cpu_s_per_gb']:.3f} s/GB, "
                          f"fastsocket {fs[b]['cpu_s_per_gb']:.3f}: "
                          + ("met" if bag[b]["cpu_s_per_gb"] <= fs[b]["cpu_s_per_gb"]
                             else "NOT met"))
    if wrong:
        print(f"\n{wrong} WRONG results")
    return 1 if wrong else 0


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--sweep":
        return sweep(sys.argv[2])
    return plain(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
