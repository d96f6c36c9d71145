"""Where a training step's time goes, for ``compare.py --profile`` (imported by worker.py).

After the timed rounds every contestant trains one more block of --round-steps steps under
``torch.profiler``; rank 0 reduces it to milliseconds per step:

* CUDA, from the kernels' timeline: **compute** (kernels that are neither NCCL nor the
  optimizer's, merged), **optimizer** (torch's multi-tensor kernels, which only the optimizers
  launch in these models, foreach and fused alike, and bagua's C++ optimizer kernels),
  **exposed communication** (NCCL kernel time with neither compute nor optimizer kernels beside
  it: communication the step waits for), **GPU idle** (no kernel at all: the host is behind or a
  rank waits for a peer), plus all NCCL time and the top kernels.
* CPU, from the trainer thread (the one that runs the step and, on CPU, the backward pass):
  **optimizer** (its time inside ``Optimizer.step`` and bagua's in-backward bucket steps,
  ``bagua.step_in_backward``), **compute** (the thread's CPU time outside them), **exposed
  communication** (wall time the thread did not run: waiting for communication, or for a core
  on a loaded machine); no GPU idle. Plus the top host ops.

The profiler adds its own cost per op, so these blocks are not timed with the rest; compare
contestants within one run. Named step_profile, not profile: worker.py's folder is first on
sys.path, where a ``profile.py`` would stand in for the standard library's module (which
cProfile imports).
"""

import time

import torch

#: Host ranges that are the optimizer: torch's step (every optimizer's, by its profiling hook)
#: and bagua's bucket steps inside the backward pass.
OPTIMIZER_RANGES = ("Optimizer.step#", "bagua.step_in_backward")
#: Kernels that are the optimizer: torch's multi-tensor apply (foreach and fused optimizers)
#: and bagua's C++ fused optimizer.
OPTIMIZER_KERNELS = ("multi_tensor_apply", "fused_adam", "bagua::optim")
#: The range each profiled step runs in (finds the trainer thread among the events).
STEP_RANGE = "bench.step"


def merge(intervals):
    """Sorted, merged copy of (start, end) intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(merged):
    return sum(b - a for a, b in merged)


def overlap(x, y):
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _is_optimizer_kernel(name):
    return any(k in name for k in OPTIMIZER_KERNELS)


def gpu_timeline(kernels, wall_us, steps):
    """A CUDA step's time from its kernels' (name, start_us, end_us), ms per step: compute,
    optimizer, NCCL, NCCL exposed (no compute or optimizer kernel beside it), GPU idle."""
    nccl = merge([(a, b) for n, a, b in kernels if "nccl" in n.lower()])
    opt = merge([(a, b) for n, a, b in kernels
                 if "nccl" not in n.lower() and _is_optimizer_kernel(n)])
    comp = merge([(a, b) for n, a, b in kernels
                  if "nccl" not in n.lower() and not _is_optimizer_kernel(n)])
    busy = merge([(a, b) for _, a, b in kernels])
    work = merge([tuple(x) for x in comp + opt])
    per = 1e-3 / steps
    return {"wall_ms": wall_us * per, "compute_ms": length(comp) * per,
            "optimizer_ms": length(opt) * per, "nccl_ms": length(nccl) * per,
            "nccl_exposed_ms": (length(nccl) - overlap(nccl, work)) * per,
            "gpu_idle_ms": max(0.0, wall_us - length(busy)) * per}


def cpu_breakdown(events, wall_us, thread_cpu_us, steps):
    """A CPU step from the trainer thread's ranges, ms per step: optimizer, compute, exposed
    communication (see the module docstring)."""
    trainer = {e.thread for e in events if e.name == STEP_RANGE}
    opt = merge([(e.time_range.start, e.time_range.end) for e in events
                 if e.thread in trainer and e.name.startswith(OPTIMIZER_RANGES)])
    per = 1e-3 / steps
    optimizer = length(opt)
    return {"wall_ms": wall_us * per, "optimizer_ms": optimizer * per,
            "compute_ms": max(0.0, thread_cpu_us - optimizer) * per,
            "exposed_ms": max(0.0, wall_us - thread_cpu_us) * per}


def profile_block(c, args, dev, train, step_no, train_step):
    """One block of args.round_steps steps of contestant ``c`` (``train_step(c, args, train,
    step_no)``) under torch.profiler: the breakdown above plus the top kernels (CUDA) and host
    ops by time per step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        c0 = time.thread_time()
        for _ in range(args.round_steps):
            with record_function(STEP_RANGE):
                train_step(c, args, train, step_no)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        thread_cpu_us = (time.thread_time() - c0) * 1e6
        wall_us = (time.perf_counter() - t0) * 1e6
    events = prof.events()

    def top(by):
        best = sorted(by.items(), key=lambda kv: -kv[1])[:10]
        return [[n[:60], v * 1e-3 / args.round_steps] for n, v in best]

    host = {}  # host ops by self time (hooks, launches, the optimizer's loop)
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and e.name != STEP_RANGE:
            host[e.name] = host.get(e.name, 0.0) + e.self_cpu_time_total
    if dev.type == "cuda":
        kernels = [(e.name, e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA]
        out = gpu_timeline(kernels, wall_us, args.round_steps)
        by = {}
        for n, a, b in kernels:
            by[n] = by.get(n, 0.0) + (b - a)
        out["top"] = top(by)
        out["top_host"] = top(host)
    else:
        out = cpu_breakdown(events, wall_us, thread_cpu_us, args.round_steps)
        out["top"] = top(host)
    return out


def summary_lines(rows):
    """compare.py's lines for the contestants that have a profile."""
    lines = []
    for r in rows:
        p = r.get("profile")
        if not p:
            continue
        if "nccl_ms" in p:
            lines.append("  {} profile (ms per step, rank 0): wall {:.1f}, compute {:.1f}, exposed "
                         "communication {:.1f} (NCCL {:.1f}), optimizer {:.1f}, GPU idle "
                         "{:.1f}".format(r["name"], p["wall_ms"], p["compute_ms"],
                                         p["nccl_exposed_ms"], p["nccl_ms"],
                                         p.get("optimizer_ms", float("nan")), p["gpu_idle_ms"]))
        elif "compute_ms" in p:
            lines.append("  {} profile (ms per step, rank 0, trainer thread): wall {:.2f}, compute "
                         "{:.2f}, exposed communication {:.2f}, optimizer {:.2f}, GPU idle "
                         "-".format(r["name"], p["wall_ms"], p["compute_ms"], p["exposed_ms"],
                                    p["optimizer_ms"]))
        else:
            lines.append("  {} profile (ms per step, rank 0): wall {:.1f}".format(
                r["name"], p["wall_ms"]))
        lines.append("    top: " + "; ".join("{} {:.2f}".format(n, v) for n, v in p["top"][:6]))
        if p.get("top_host"):
            lines.append("    top host ops: " + "; ".join("{} {:.2f}".format(n, v)
                                                        for n, v in p["top_host"][:6]))
    return lines
