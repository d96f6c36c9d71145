#!/usr/bin/env python3
"""The gradient hooks' Python cost per step: with_bagua's C++ hooks (GradReadyHook, the default)
against a Python hook per gradient (EngineOptions(native_hooks=False)), same model, same
process, interleaved.

    PYTHONPATH=python:build/python /usr/bin/python3 bench/ddp/hook_cost.py [--layers 12]

One rank (world of one: the hooks and the reducer's calls are the same as on many ranks, the
collective is a copy). The model is GPT-2 small's layout (12 blocks, 148 parameter tensors, tied
embedding) at a small width, so the backward is short and the hooks stand out. Per step:

* Python time of the hooks: cProfile around loss.backward(), the cumulative time of bagua's
  Python functions that were entered from C (the hooks themselves, the once-per-backward call,
  the end-of-backward callback), and how many were entered;
* the backward's wall time without the profiler, median over the steps.
"""

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models  # noqa: E402


def entries(prof, root):
    """(Python seconds, calls) of bagua's functions entered from outside bagua's package (from
    C: torch calling a hook or the end-of-backward callback): their cumulative time minus the
    time they spent inside the extension's C++ calls (the reducer's work and waits, which release
    the GIL and are not Python)."""
    st = pstats.Stats(prof)
    total, calls = 0.0, 0
    for (fname, _, _), (cc, nc, tt, ct, callers) in st.stats.items():
        if fname.startswith(root):
            for c, (ccc, ncc, ttc, ctc) in callers.items():
                if not c[0].startswith(root):  # entered from outside bagua's package
                    total += ctc
                    calls += ncc
    for (fname, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
        if fname == "~" and "_bagua_ext" in name:  # C++ called from bagua's Python
            total -= sum(v[3] for c, v in callers.items() if c[0].startswith(root))
    return total, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30, help="profiled and timed steps per variant")
    ap.add_argument("--rounds", type=int, default=3, help="rounds alternating the variants")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import bagua
    import bagua.torch_api as bt
    from bagua.torch_api.algorithms import GradientAllReduceAlgorithm
    from bagua.torch_api.data_parallel.bagua_distributed import EngineOptions

    root = os.path.dirname(os.path.abspath(bagua.__file__))
    bt.init_process_group()
    vocab, seq, batch = 256, 32, 4
    variants = {}
    for native in (False, True):
        torch.manual_seed(0)
        m = models.LM(vocab, a.width, a.layers, 4, seq)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        m = m.with_bagua([opt], GradientAllReduceAlgorithm(),
                         _engine_options=EngineOptions(native_hooks=native))
        variants["C++ hooks" if native else "Python hooks"] = (m, opt)
    params = sum(1 for _ in variants["C++ hooks"][0].parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (batch, seq), generator=g)
    y = torch.randint(0, vocab, (batch, seq), generator=g)
    res = {k: {"py": [], "calls": [], "wall": []} for k in variants}

    def step(m, opt, profile):
        opt.zero_grad()
        out = m(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, vocab), y.reshape(-1))
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            loss.backward()
            prof.disable()
            opt.step()
            return entries(prof, root)
        t0 = time.perf_counter()
        loss.backward()
        dt = time.perf_counter() - t0
        opt.step()
        return dt

    for m, opt in variants.values():  # warm-up: bucket rebuild, allocations
        for _ in range(3):
            step(m, opt, False)
    for _ in range(a.rounds):
        for name, (m, opt) in variants.items():
            for _ in range(a.steps):
                py, calls = step(m, opt, True)
                res[name]["py"].append(py)
                res[name]["calls"].append(calls)
            for _ in range(a.steps):
                res[name]["wall"].append(step(m, opt, False))
    print("hook_cost: {} layers, {} parameter tensors, width {}, torch {}, {} x {} steps per "
          "variant".format(a.layers, params, a.width, torch.__version__, a.rounds, a.steps))
    for name, r in res.items():
        py = statistics.median(r["py"]) * 1e3
        print("  {:13s} Python in bagua's hooks and callbacks per backward: {:.3f} ms in {:.0f} "
              "calls from C ({:.1f} us per parameter); backward wall {:.2f} ms".format(
                  name, py, statistics.median(r["calls"]), py * 1e3 / params,
                  statistics.median(r["wall"]) * 1e3))
    a_, b_ = res["Python hooks"], res["C++ hooks"]
    print("  backward wall, Python hooks / C++ hooks: {:.3f}x".format(
        statistics.median(a_["wall"]) / statistics.median(b_["wall"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
