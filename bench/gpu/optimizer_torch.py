"""torch.optim.Adam(fused=True) and (foreach=True) on the parameter sets of
bench/optimizer_gpu_bench.cc, same GPU, same run, plus torch's copy bandwidth.

usage: optimizer_torch.py --set small10k|bert [--iters N]
Prints CSV lines: label,set,tensors,elems,ms_per_step,GBps,bound,host_us (28 bytes per
element; timed as bench/optimizer_gpu_bench.cc does: CUDA events around N back-to-back steps, the
copy of the same byte count the same way, host_us the wall time per step of the enqueueing loop).
"""
import argparse
import time

import torch


def parameter_set(name):
    if name == "small10k":
        return [((i * 37) % 8 + 1) * 64 for i in range(10000)]
    h, f = 768, 3072
    s = [30522 * h, 512 * h, 2 * h, h, h]
    for _ in range(12):
        for _ in range(4):
            s += [h * h, h]
        s += [h, h, h * f, f, f * h, h, h, h]
    s += [h * h, h]
    return s


def timed(fn, iters):
    """(GPU seconds per call, host seconds per call). Slow steps (torch on 10,000 tensors takes
    25-175 ms a step) are timed over fewer calls, so that each case stays within ~5 s."""
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 3
    iters = max(5, min(iters, int(5.0 / max(per, 1e-9))))
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) / iters
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / iters / 1e3, host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="small10k")
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    sizes = parameter_set(a.set)
    elems = sum(sizes)
    nbytes = 28.0 * elems
    dev = torch.device("cuda:0")
    half = int(nbytes / 2) // 4
    src = torch.ones(half, device=dev)
    dst = torch.empty_like(src)
    copy_s, _ = timed(lambda: dst.copy_(src), a.iters)
    copy = 2 * half * 4 / copy_s / 1e9
    del src, dst
    print(f"torch_copy,{a.set},{len(sizes)},{elems},{nbytes / (copy * 1e9) * 1e3:.4f},{copy:.1f},1.000,0")
    for label, kw in (("torch_fused", {"fused": True}), ("torch_foreach", {"foreach": True})):
        params = [torch.zeros(n, device=dev, requires_grad=True) for n in sizes]
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.Adam(params, lr=1e-3, weight_decay=0.01, **kw)
        sec, host = timed(opt.step, a.iters)
        gbps = nbytes / sec / 1e9
        print(f"{label},{a.set},{len(sizes)},{elems},{sec * 1e3:.4f},{gbps:.1f},{gbps / copy:.3f},"
              f"{host * 1e6:.1f}")
        del opt, params
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
