"""One rank of bench/ddp/compare.py (started by it; see compare.py for the options).

Every contestant is built in this process from the same seed (same initial weights), with its
own optimizer, and trains on the same per-rank batches. Rounds alternate the contestants, a block
of --round-steps steps each, so load drift on the machine hits all of them; the first round is
warm-up (bucket rebuilds, PowerSGD/QAdam set-up) and is not timed. A block is timed from a
device synchronisation to one after its last step (no per-step host sync: losses are read at the
block's end), so the step time is the training loop's throughput. At the end rank 0 writes the
results as JSON: median step time over the timed rounds, the rank-averaged loss of every step,
the loss on a fixed evaluation set, and how far the ranks' weights are apart.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import step_profile  # noqa: E402
import tta_report  # noqa: E402

DDP_NAMES = ("ddp", "ddp_bf16", "ddp_fp16", "ddp_fused")
# And PowerSGD at any rank (tta_report.is_powersgd): ddp_powersgd[<N>] (torch's hook),
# powersgd[<N>] (ours), powersgd[<N>]q (ours, its factors sent as 8 bits: quantize_factors=True).
BAGUA_NAMES = ("gradient_allreduce", "bytegrad", "qadam", "decentralized",
               "low_precision_decentralized", "gradient_allreduce_sync",
               "gradient_allreduce_fused", "gradient_allreduce_fused_after",
               "gradient_allreduce_copied", "gradient_allreduce_bucket_copies",
               "gradient_allreduce_hier", "bytegrad_hier", "qadam_hier", "decentralized_hier",
               "low_precision_decentralized_hier", "async", "auto")
# gradient_allreduce's variants (compare.py's EXTRA): _sync runs each bucket's collective to the
# end before starting the next (the older, sequential reducer); _copied wraps with
# do_flatten=False (gradients copied into reducer buckets and back every step); _bucket_copies
# copies CUDA buckets in and back (EngineOptions.in_place_device_buckets off; by default they run at
# do_flatten's laid-out gradients; host buckets always do, so on CPU it is gradient_allreduce).
# Any algorithm with _hier: hierarchical=True (the others run flat).
VARIANTS = ("_sync", "_copied", "_bucket_copies", "_hier", "_fused", "_fused_after")
# _fused: Bagua's fused optimizer, with_bagua(do_flatten=False) then fuse_optimizer (Bagua's
# recipe), stepping each bucket inside the backward pass (BAGUA_OPTIM_STEP_IN_BACKWARD on);
# _fused_after: the same stepping after backward (the default). ddp_fused: torch's fused optimizer (fused=True) under DDP.
# Fused contestants use torch's fused kernel inside where torch has one for the device.

# PowerSGD at a rank given by the name's digit (ddp_powersgd4, powersgd1); without one, at
# --powersgd-rank. Our powersgd's start iteration is --algo-warmup, as torch's hook's is: the
# first of these keyword arguments its class takes.
POWERSGD_START_KWARGS = ("start_powerSGD_iter", "start_iter", "start_step", "warmup_steps")


class Unavailable(Exception):
    """A contestant this installation lacks (a registry name not registered)."""


def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--contestants", default="ddp,gradient_allreduce")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--round-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--algo-warmup", type=int, default=5)
    ap.add_argument("--powersgd-rank", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--profile", action="store_true")
    # --tta (tta.py): time to accuracy instead of step time.
    ap.add_argument("--tta", action="store_true")
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--lm-margin", type=float, default=0.35)
    ap.add_argument("--target-acc", type=float, default=95.0)
    ap.add_argument("--stop-at-target", action="store_true")
    ap.add_argument("--lr-warmup", type=int, default=0)
    ap.add_argument("--optimizer", default="adam", choices=["adam", "adamw"])
    return ap.parse_args(argv)


def _powersgd_rank(name, args):
    rank = tta_report.POWERSGD_NAME.fullmatch(name).group(2)
    return int(rank) if rank else args.powersgd_rank


def make_optimizer(args, params, fused):
    """The contestants' optimizer (--optimizer); ``fused``: torch's fused implementation, where
    this torch has one for the parameters' device."""
    cls = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    if fused:
        try:
            return cls(params, lr=args.lr, fused=True)
        except (TypeError, RuntimeError, ValueError):
            pass  # no fused kernel here (torch 1.13 on CPU): torch's default implementation
    return cls(params, lr=args.lr)


class Contestant:
    def __init__(self, name, args, dev, pg_torch):
        from bagua.torch_api.algorithms import Algorithm
        from bagua.torch_api.algorithms.q_adam import QAdamAlgorithm, QAdamOptimizer

        self.name = name
        self.algo = None
        self.note = ""  # what the JSON should say about how this contestant was set up
        self.module = models.build(args.model, args.preset, seed=0).to(dev)
        params = list(self.module.parameters())
        if name in DDP_NAMES or tta_report.is_powersgd(name, ours=False):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            self.opt = make_optimizer(args, params, fused=name == "ddp_fused")
            kw = {"bucket_cap_mb": args.bucket_mb} if args.bucket_mb > 0 else {}
            first = dist._DEFAULT_FIRST_BUCKET_BYTES
            if name.startswith("ddp_powersgd") and dev.type == "cpu":
                # The PowerSGD hook issues its second and third all-reduce from the callbacks
                # of the first; on gloo those run on its worker threads, so with several
                # buckets the ranks issue them in different orders and gloo fails
                # ("op.preamble.length <= op.nbytes"). One bucket keeps the order.
                kw["bucket_cap_mb"] = 1 << 20
                dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 50
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                self.module, device_ids=[dev.index] if dev.type == "cuda" else None, **kw)
            dist._DEFAULT_FIRST_BUCKET_BYTES = first
            if name == "ddp_bf16":
                self.wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)
            elif name == "ddp_fp16":
                self.wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif name.startswith("ddp_powersgd"):
                # torch's defaults otherwise: error feedback and warm start on.
                self.state = psgd.PowerSGDState(
                    process_group=None, matrix_approximation_rank=_powersgd_rank(name, args),
                    start_powerSGD_iter=max(2, args.algo_warmup))
                self.wrapped.register_comm_hook(self.state, psgd.powerSGD_hook)
            return
        if name not in BAGUA_NAMES and not tta_report.is_powersgd(name, ours=True):
            raise ValueError("unknown contestant {!r}: one of {}, or PowerSGD's at a rank".format(
                name, ", ".join(DDP_NAMES + BAGUA_NAMES)))
        if name in ("qadam", "qadam_hier"):
            self.opt = QAdamOptimizer(params, lr=args.lr, warmup_steps=max(1, args.algo_warmup))
            algo = QAdamAlgorithm(self.opt, hierarchical=name.endswith("_hier"))
        elif name == "async" or name == "auto" or tta_report.is_powersgd(name, ours=True):
            from bagua.torch_api.algorithms import GlobalAlgorithmRegistry

            self.opt = make_optimizer(args, params, fused=False)
            base = "powersgd" if tta_report.is_powersgd(name, ours=True) else name
            if base not in GlobalAlgorithmRegistry:
                raise Unavailable("{} is not registered in this bagua (registered: {})".format(
                    base, ", ".join(GlobalAlgorithmRegistry)))
            kw = {}
            if name == "async":
                kw["warmup_steps"] = args.algo_warmup  # Bagua's sync_interval_ms (500) kept
            elif name == "auto":
                kw["start_iter"] = args.algo_warmup  # a chosen powersgd starts where ours does
                self.note = "Algorithm.init('auto', start_iter={})".format(args.algo_warmup)
            elif base == "powersgd":
                import inspect

                cls = GlobalAlgorithmRegistry.get("powersgd")
                takes = inspect.signature(cls.__init__).parameters
                kw["rank"] = _powersgd_rank(name, args)
                if name.endswith("q"):
                    kw["quantize_factors"] = True
                start = next((k for k in POWERSGD_START_KWARGS if k in takes), None)
                if start is not None:
                    kw[start] = args.algo_warmup
                self.note = "Algorithm.init('powersgd', {})".format(
                    ", ".join("{}={}".format(k, v) for k, v in kw.items()))
            algo = Algorithm.init(base, **kw)
        else:
            self.opt = make_optimizer(args, params, fused="_fused" in name)
            base = name
            for v in VARIANTS:
                base = base[:-len(v)] if base.endswith(v) else base
            algo = Algorithm.init(base, hierarchical=name.endswith("_hier"))
        if args.bucket_mb > 0:  # read at the wrap
            os.environ["BAGUA_DEFAULT_BUCKET_SIZE"] = str(int(args.bucket_mb * (1 << 20)))
        from bagua.torch_api.data_parallel.bagua_distributed import EngineOptions

        options = EngineOptions(
            launch_without_waiting=not name.endswith("_sync"),
            in_place_device_buckets=not name.endswith("_bucket_copies"),
            step_in_backward=(not name.endswith("_fused_after")) if "_fused" in name else None)
        self.algo = algo
        # Bagua's recipe with a fused optimizer: with_bagua(do_flatten=False), then
        # fuse_optimizer (which lays weights and gradients out in its own order).
        flatten = not name.endswith("_copied") and "_fused" not in name
        self.wrapped = self.module.with_bagua([self.opt], algo, do_flatten=flatten,
                                              _engine_options=options)
        if "_fused" in name:
            from bagua.torch_api.contrib import fuse_optimizer

            fuse_optimizer(self.opt)

    def pause(self):
        """Between this contestant's blocks: async's averaging thread stops (collective), so it
        never competes with another contestant for the link."""
        if self.name == "async":
            self.algo.abort(self.wrapped)

    def resume(self):
        if self.name == "async":
            self.algo.resume(self.wrapped)

    def reducer(self):
        """bagua's C++ reducer (for its time accounting), None for DDP."""
        ddp = getattr(self.wrapped, "bagua_ddp", None)
        red = getattr(getattr(ddp, "_engine", None), "_reducer", None)
        return red if hasattr(red, "stats") else None


def loss_of(args, module, batch):
    x, y = batch
    out = module(x)
    if args.model == "transformer":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


def make_data(args, rank, dev, steps):
    """(train batches of this rank, eval batches shared by all ranks, loss floor or None)."""
    if args.model == "transformer":
        _, _, _, _, seq, batch = models.LM_PRESETS[args.preset]
        batch = args.batch or batch
        chain = models.lm_chain(args.preset)
        pool = min(steps, 64)
        toks = chain.sample(pool * batch, seq + 1, seed=1000 + rank)
        train = [(t[:, :-1].to(dev), t[:, 1:].to(dev)) for t in toks.split(batch)]
        ev = chain.sample(4 * batch, seq + 1, seed=999)
        evals = [(t[:, :-1].to(dev), t[:, 1:].to(dev)) for t in ev.split(batch)]
        return train, evals, chain.entropy_rate()
    width, image, batch, classes = models.RESNET_PRESETS[args.preset]
    batch = args.batch or batch
    src = models.ClassImages(classes, image)
    pool = min(steps, 8)
    train = []
    for i in range(pool):
        x, y = src.sample(batch, seed=(1000 + rank) * 1000 + i)
        train.append((x.to(dev), y.to(dev)))
    evals = []
    for i in range(2):
        x, y = src.sample(batch, seed=999000 + i)
        evals.append((x.to(dev), y.to(dev)))
    return train, evals, None


def train_step(c, args, train, step_no):
    """One training step of contestant c on its next batch; the loss (not read: no host sync)."""
    batch = train[step_no[c.name] % len(train)]
    step_no[c.name] += 1
    c.opt.zero_grad(set_to_none=True)
    loss = loss_of(args, c.wrapped, batch)
    loss.backward()
    if hasattr(c.opt, "fuse_step"):  # Bagua's fused optimizer
        c.opt.fuse_step()
    else:
        c.opt.step()
    return loss.detach()


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cpu")
    if args.device == "cuda":
        # --nodes: each rank its own GPU of this host (LOCAL_RANK counts within a "node").
        index = os.environ.get("BAGUA_BENCH_CUDA_DEVICE", os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(int(index) % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method="env://",
                            rank=rank, world_size=world)
    import bagua.torch_api as bagua

    bagua.init_process_group()  # on torch.distributed's store

    if args.tta:
        import tta

        out = tta.run(args, dev, rank, world, lambda n: Contestant(n, args, dev, None),
                      Unavailable)
        if out is not None and args.out:
            with open(args.out, "w") as f:
                json.dump(out, f)
        bagua.barrier()
        dist.barrier()
        return 0

    names = [n for n in args.contestants.split(",") if n]
    steps = args.rounds * args.round_steps
    train, evals, floor = make_data(args, rank, dev, steps)
    t_build = time.perf_counter()
    cont = [Contestant(n, args, dev, None) for n in names]
    build_s = time.perf_counter() - t_build
    per_round = {n: [] for n in names}
    cpu_round = {n: [] for n in names}  # this process's CPU time (every thread) per step
    losses = {n: [] for n in names}
    step_no = {n: 0 for n in names}
    for r in range(args.rounds):
        for c in cont:
            c.resume()
            sync(dev)
            t0 = time.perf_counter()
            c0 = time.process_time()
            got = []
            for _ in range(args.round_steps):
                got.append(train_step(c, args, train, step_no))
            sync(dev)
            dt = (time.perf_counter() - t0) / args.round_steps
            c.pause()
            if r == 0 and c.reducer() is not None:
                c.reducer().reset_stats()  # the trace covers the timed rounds only
            if r > 0:
                per_round[c.name].append(dt)
                cpu_round[c.name].append((time.process_time() - c0) / args.round_steps)
            losses[c.name] += [float(v) for v in got]
    profiles = {}
    if args.profile:  # after the timed rounds (extra steps for every contestant alike)
        for c in cont:
            profiles[c.name] = step_profile.profile_block(c, args, dev, train, step_no,
                                                          train_step)

    # Rank-averaged losses, evaluation, and the ranks' weight spread (rank 0's weights sent).
    results = []
    ref = None
    for c in cont:
        lt = torch.tensor(losses[c.name], dtype=torch.float64, device=dev)
        dist.all_reduce(lt)
        lt /= world
        with torch.no_grad():
            was = c.module.training
            c.module.eval()
            ev = sum(float(loss_of(args, c.module, b)) for b in evals) / len(evals)
            c.module.train(was)
            evt = torch.tensor([ev], dtype=torch.float64, device=dev)
            dist.all_reduce(evt)
            flat = torch.cat([p.detach().reshape(-1).double() for p in c.module.parameters()])
            mine = flat.clone()
            dist.broadcast(flat, 0)
            spread = torch.tensor([(mine - flat).abs().max().item()], device=dev)
            dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        curve = lt.tolist()
        tail = max(1, len(curve) // 10)
        row = {"name": c.name, "step_ms": 1e3 * statistics.median(per_round[c.name])
               if per_round[c.name] else float("nan"),
               "round_ms": [1e3 * v for v in per_round[c.name]],
               "cpu_ms": 1e3 * statistics.median(cpu_round[c.name]) if cpu_round[c.name]
               else float("nan"),
               "loss_curve": curve, "final_loss": sum(curve[-tail:]) / tail,
               "eval_loss": float(evt) / world, "weight_spread": float(spread)}
        red = c.reducer()
        if red is not None:
            st = red.stats()
            it = max(1, st["iterations"])
            row["trace_ms_per_step"] = {k[:-3]: v / 1e6 / it for k, v in st.items()
                                        if k.endswith("_ns")}
            row["trace_ms_per_step"]["buckets"] = st["buckets"] / it
            row["buckets_in_place"] = [red.buckets_in_place, len(red.bucket_layout())]
        if c.name in profiles:
            row["profile"] = profiles[c.name]
        if c.name == "ddp":
            ref = curve
        results.append(row)
    for row in results:
        if ref is not None and len(row["loss_curve"]) == len(ref):
            row["max_loss_diff_vs_ddp"] = max(abs(a - b) for a, b in zip(row["loss_curve"], ref))
    nparams = sum(p.numel() for p in cont[0].module.parameters())
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "preset": args.preset, "params": nparams,
                       "world": world, "device": args.device, "steps": steps,
                       "loss_floor": floor, "build_s": build_s,
                       "torch": torch.__version__, "results": results}, f)
    bagua.barrier()
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
