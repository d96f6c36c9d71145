#!/usr/bin/env python3
"""Table of busbw per size for several bagua-nccl-bench runs, with ratios against the first."""
import json
import os
import sys


def main() -> int:
    out, labels = sys.argv[1], sys.argv[2:]
    runs = {}
    for label in labels:
        path = os.path.join(out, label + ".json")
        try:
            with open(path) as f:
                runs[label] = {r["bytes"]: r for r in json.load(f)["rows"]}
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


if __name__ == "__main__":
    sys.exit(main())
