"""Time to accuracy, one rank's side (compare.py --tta; worker.py calls run()).

Every contestant starts from the same weights (models.build(seed=0)) and trains on the same
stream of batches: step i of every contestant on rank r is the same batch, generated for the
block of steps it falls in (seeded by rank and step), never reused. Blocks of --eval-every steps
alternate the contestants, as the step-time mode's rounds do, so load drifting on the machine
hits them all alike. A block is timed from a device synchronisation to one after its last step;
its time adds to the contestant's wall time. After each block the contestant is evaluated on a
fixed held-out set, every rank on its own weights, the ranks' figures averaged; evaluation time
is excluded from the wall time and reported apart. The target is met at the first evaluation
that reaches it (MLPerf's rule; the resolution is one block). With --stop-at-target a contestant
stops there, else every contestant runs to the step cap, so that the metric at the cap compares
them too.

What the wall time includes: every training step from the first, with each algorithm's own
warm-up (PowerSGD's start iteration, QAdam's warm-up, auto's probe steps, the buckets' rebuild
after step 1, async's averaging thread starting); it excludes building the models, generating
the data, evaluations, and async's pause between its blocks (its averaging thread runs only
during its own blocks, so it never takes the link from another contestant).

Tasks:
* transformer: eval loss (nats per token, lower is better) on held-out sequences of the Markov
  chain; target: the chain's exact loss floor (models.MarkovText.loss_floor) plus --lm-margin.
* resnet50: top-1 accuracy (%, higher is better) on held-out class-template images; target
  --target-acc.
"""

import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import models


class LMTask:
    metric = "eval loss (nats/token)"
    better = "lower"

    def __init__(self, args, rank, dev):
        _, _, _, _, seq, batch = models.LM_PRESETS[args.preset]
        self.batch = args.batch or batch
        self.seq, self.rank, self.dev = seq, rank, dev
        self.chain = models.lm_chain(args.preset)
        self.floor = self.chain.loss_floor(seq)
        self.margin = args.lm_margin
        self.target = self.floor + self.margin
        ev = self.chain.sample(args.eval_batches * self.batch, seq + 1, seed=999)
        self.evals = [(t[:, :-1].to(dev), t[:, 1:].to(dev)) for t in ev.split(self.batch)]
        self.eval_samples = args.eval_batches * self.batch * seq  # tokens

    def block(self, first, count):
        toks = self.chain.sample(count * self.batch, self.seq + 1,
                                 seed=(1000 + self.rank) * 1000003 + first)
        return [(t[:, :-1].to(self.dev), t[:, 1:].to(self.dev)) for t in toks.split(self.batch)]

    def evaluate(self, module):
        total = 0.0
        for x, y in self.evals:
            out = module(x)
            total += float(F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)))
        return total / len(self.evals)

    def reached(self, m):
        return m <= self.target

    def describe(self):
        return {"metric": self.metric, "better": self.better, "target": self.target,
                "floor": self.floor, "margin": self.margin, "eval_samples": self.eval_samples,
                "eval_unit": "tokens"}


class ImageTask:
    metric = "top-1 accuracy (%)"
    better = "higher"

    def __init__(self, args, rank, dev):
        _, image, batch, classes = models.RESNET_PRESETS[args.preset]
        self.batch = args.batch or batch
        self.rank, self.dev = rank, dev
        self.src = models.ClassImages(classes, image)
        self.target = args.target_acc
        self.evals = []
        for i in range(args.eval_batches):
            x, y = self.src.sample(self.batch, seed=999000 + i)
            self.evals.append((x.to(dev), y.to(dev)))
        self.eval_samples = args.eval_batches * self.batch  # images
        self.classes = classes

    def block(self, first, count):
        x, y = self.src.sample(count * self.batch, seed=(1000 + self.rank) * 1000003 + first)
        return [(a.to(self.dev), b.to(self.dev))
                for a, b in zip(x.split(self.batch), y.split(self.batch))]

    def evaluate(self, module):
        right = 0
        for x, y in self.evals:
            right += int((module(x).argmax(1) == y).sum())
        return 100.0 * right / self.eval_samples

    def reached(self, m):
        return m >= self.target

    def describe(self):
        return {"metric": self.metric, "better": self.better, "target": self.target,
                "classes": self.classes, "eval_samples": self.eval_samples,
                "eval_unit": "images"}


def _loss(args, module, batch):
    x, y = batch
    out = module(x)
    if args.model == "transformer":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


def _warm_lr(opt, lr):
    """Every parameter group of a contestant's optimizer at ``lr`` (the linear warm-up)."""
    for g in opt.param_groups:
        g["lr"] = lr


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _mean_over_ranks(value, dev, world):
    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return float(t) / world


def _evaluate(task, c, dev, world):
    with torch.no_grad():
        was = c.module.training
        c.module.eval()
        m = task.evaluate(c.module)
        c.module.train(was)
    return _mean_over_ranks(m, dev, world)


def _warm_device(args, dev, task):
    """Two local steps of a throwaway model: the first kernels, cuBLAS/cuDNN handles and the
    allocator's pools are paid here, not by whichever contestant comes first."""
    m = models.build(args.model, args.preset, seed=1).to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    for b in task.block(0, 2):
        opt.zero_grad(set_to_none=True)
        _loss(args, m, b).backward()
        opt.step()
    _sync(dev)
    del m, opt


def run(args, dev, rank, world, build, unavailable):
    """The time-to-accuracy loop; rank 0's result dict (others: None). ``build(name)`` makes a
    contestant (worker.Contestant); ``unavailable`` is the exception it raises for one this
    installation lacks (e.g. powersgd before it is registered): skipped, with the reason kept."""
    task = LMTask(args, rank, dev) if args.model == "transformer" else ImageTask(args, rank, dev)
    every = args.eval_every
    blocks = max(1, math.ceil(args.max_steps / every))
    cap = blocks * every
    cont, skipped = [], {}
    for n in [n for n in args.contestants.split(",") if n]:
        try:
            cont.append(build(n))
        except unavailable as e:
            skipped[n] = str(e)
            if rank == 0:
                print("tta: {} skipped: {}".format(n, e), flush=True)
    _warm_device(args, dev, task)
    rec = {}
    for c in cont:
        m0 = _evaluate(task, c, dev, world)
        rec[c.name] = {"name": c.name, "evals": [[0, 0.0, m0]], "wall_s": 0.0, "eval_s": 0.0,
                       "block_s": [], "train_loss": [], "reached_step": None,
                       "reached_wall_s": None}
    for b in range(blocks):
        batches = task.block(b * every, every)
        for c in cont:
            r = rec[c.name]
            if args.stop_at_target and r["reached_step"] is not None:
                continue
            c.resume()
            _sync(dev)
            t0 = time.perf_counter()
            loss = None
            for i, batch in enumerate(batches):
                if args.lr_warmup:
                    _warm_lr(c.opt, args.lr * min(1.0, (b * every + i + 1) / args.lr_warmup))
                c.opt.zero_grad(set_to_none=True)
                loss = _loss(args, c.wrapped, batch)
                loss.backward()
                c.opt.step()
            _sync(dev)
            dt = time.perf_counter() - t0
            c.pause()
            r["wall_s"] += dt
            r["block_s"].append(dt)
            r["train_loss"].append(float(loss))
            t1 = time.perf_counter()
            m = _evaluate(task, c, dev, world)
            r["eval_s"] += time.perf_counter() - t1
            step = (b + 1) * every
            r["evals"].append([step, r["wall_s"], m])
            if r["reached_step"] is None and task.reached(m):
                r["reached_step"], r["reached_wall_s"] = step, r["wall_s"]
        if rank == 0 and (b + 1) % max(1, blocks // 10) == 0:
            done = sum(1 for c in cont if rec[c.name]["reached_step"] is not None)
            print("tta: {} of {} steps; {} of {} contestants at the target".format(
                (b + 1) * every, cap, done, len(cont)), flush=True)
    for c in cont:
        r = rec[c.name]
        r["step_ms"] = 1e3 * statistics.median(r["block_s"]) / every if r["block_s"] else None
        r["metric_at_cap"] = r["evals"][-1][2] if r["evals"][-1][0] == cap else None
        r["steps_run"] = r["evals"][-1][0]
        if c.name == "auto":
            d = c.algo.decision()
            r["auto_decision"] = {"algorithm": d["algorithm"], "args": d["args"],
                                  "reason": d["reason"], "probe_steps": d.get("probe_steps")}
        if c.note:
            r["note"] = c.note
    nparams = sum(p.numel() for p in models.build(args.model, args.preset, 0).parameters())
    if rank != 0:
        return None
    out = {"mode": "tta", "model": args.model, "preset": args.preset, "params": nparams,
           "world": world, "device": args.device, "torch": torch.__version__,
           "lr": args.lr, "lr_warmup": args.lr_warmup, "algo_warmup": args.algo_warmup, "batch_per_rank": task.batch,
           "eval_every": every, "max_steps": cap, "stop_at_target": bool(args.stop_at_target),
           "task": task.describe(), "skipped": skipped,
           "results": [rec[c.name] for c in cont],
           "threads": int(os.environ.get("OMP_NUM_THREADS", "1"))}
    return out
