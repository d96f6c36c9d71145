"""Step time of bagua's DistributedDataParallel against torch.nn.parallel.DistributedDataParallel
on the same model, in the same processes, in the same run.

    python3 bench/ddp/mlp_step.py --nproc 2 --device cpu     # spawns the ranks itself
    baguarun --nproc_per_node 2 -- python3 bench/ddp/mlp_step.py --device cuda

Each rank builds the same MLP twice (seed 0): one wrapped by torch DDP (gloo on CPU, NCCL on
CUDA, MASTER_PORT), one by bagua (with_bagua + GradientAllReduceAlgorithm, or the algorithm
given; MASTER_PORT+1). Rounds alternate torch and bagua blocks of --steps steps (forward,
backward, optimizer step; CUDA synchronised per step) after --warmup steps each, so drift hits
both; per-step times are pooled per implementation and the medians compared. Rank 0 prints
one line per implementation and "ratio torch/bagua" (> 1: bagua faster).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=0, help="spawn this many ranks (0: launched)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algorithm", default="gradient_allreduce")
    ap.add_argument("--bucket_cap_mb", type=float, default=25)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    ap.add_argument("--json", default="", help="rank 0 writes the summary here")
    return ap.parse_args()


def spawn(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    argv = [a for a in sys.argv[1:]]
    i = argv.index("--nproc")
    del argv[i:i + 2]
    for r in range(args.nproc):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(args.nproc))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    rc = 0
    for p in procs:
        rc = rc or p.wait(timeout=900)
    return rc


def mlp(args, torch):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(args.width, 10))
    return torch.nn.Sequential(*layers)


def main():
    args = parse()
    if args.nproc:
        return spawn(args)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(local % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    port = int(os.environ["MASTER_PORT"])
    # env:// (under torchrun this reuses the agent's store on MASTER_PORT).
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="env://",
                            rank=rank, world_size=world)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        os.environ["MASTER_PORT"] = str(port + 1)  # torch's store is on MASTER_PORT
    # (under torchrun bagua finds its own port through the agent's store)
    import bagua.torch_api as bagua
    from bagua.torch_api.algorithms import Algorithm
    from bagua.torch_api.data_parallel.engine_options import EngineOptions

    bagua.init_process_group()

    m_torch = mlp(args, torch).to(dev)
    o_torch = torch.optim.SGD(m_torch.parameters(), lr=1e-3)
    w_torch = torch.nn.parallel.DistributedDataParallel(
        m_torch, device_ids=[dev.index] if args.device == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb)
    m_bagua = mlp(args, torch).to(dev)
    o_bagua = torch.optim.SGD(m_bagua.parameters(), lr=1e-3)
    kwargs = {"hierarchical": False} if args.algorithm != "async" else {}
    w_bagua = m_bagua.with_bagua([o_bagua], Algorithm.init(args.algorithm, **kwargs),
                                 _engine_options=EngineOptions())

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g).to(dev)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(dev)
    lossf = torch.nn.CrossEntropyLoss()

    def run(model, opt, n):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            opt.zero_grad()
            lossf(model(x), y).backward()
            opt.step()
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    pooled = {"torch": [], "bagua": []}
    for _ in range(args.rounds):
        for name, model, opt in (("torch", w_torch, o_torch), ("bagua", w_bagua, o_bagua)):
            run(model, opt, args.warmup)
            pooled[name] += run(model, opt, args.steps)
    # Same-math check: after identical steps from identical weights the two models agree.
    diff = max((a - b).abs().max().item()
               for a, b in zip(m_torch.parameters(), m_bagua.parameters()))
    med = {k: statistics.median(v) for k, v in pooled.items()}
    params = sum(p.numel() for p in m_torch.parameters())
    summary = {"device": args.device, "world": world, "params": params,
               "algorithm": args.algorithm, "torch_ms": med["torch"] * 1e3,
               "bagua_ms": med["bagua"] * 1e3, "ratio_torch_over_bagua": med["torch"] / med["bagua"],
               "max_weight_diff": diff}
    if rank == 0:
        print("mlp_step {} x{} {} params={} algorithm={}".format(
            args.device, world, "x".join([str(args.width)] * 2), params, args.algorithm))
        print("  torch DDP   median step {:.3f} ms".format(med["torch"] * 1e3))
        print("  bagua       median step {:.3f} ms".format(med["bagua"] * 1e3))
        print("  ratio torch/bagua {:.3f} (> 1: bagua faster); max |w_torch - w_bagua| {:.2e}".format(
            summary["ratio_torch_over_bagua"], diff))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)
    bagua.barrier()
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
