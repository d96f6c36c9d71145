"""One rank of test_step_in_backward.py: every scenario in one process (2 ranks, host backend).

    python step_in_backward_workers.py <outdir> <json args>

Writes <outdir>/rank<r>.pt: {scenario: result}.
"""

import json
import logging
import os
import sys

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import GradientAllReduceAlgorithm
from bagua.torch_api.contrib import fuse_optimizer
from bagua.torch_api.data_parallel.engine_options import EngineOptions

STEPS = 110


class Mlp(torch.nn.Module):
    """``layers`` Linear(width, width) + tanh; over 1 MiB at the default sizes, so that with a
    128 KiB bucket cap the reducer makes several buckets (the first holds up to 1 MiB)."""

    def __init__(self, layers=20, width=128, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def batch(rank, step, width=128):
    g = torch.Generator().manual_seed(100003 * step + rank)
    return torch.randn(8, width, generator=g), torch.randn(8, width, generator=g)


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _dev(a):
    return torch.device("cuda", torch.cuda.current_device()) if a.get("device") == "cuda" \
        else torch.device("cpu")


def train(a, rank):
    """One run: with_bagua + fuse_optimizer (in a["order"]), a["steps"] steps, with in-backward
    stepping forced on or off; the gradient clipping or loss scaling of a["extra"] between
    backward and step. Returns the weights, the losses and what the wrap reported."""
    forced = EngineOptions(step_in_backward=a["in_backward"])
    records = _Records()
    logging.getLogger("bagua").addHandler(records)
    logging.getLogger("bagua").setLevel(logging.INFO)
    dev = _dev(a)
    model = Mlp(seed=rank).to(dev)  # ranks differ: the wrap broadcasts rank 0's weights
    opt = make_opt(a["opt"], model.parameters())
    if a["order"] == "fuse_first":
        fuse_optimizer(opt)
        model = model.with_bagua([opt], GradientAllReduceAlgorithm(), _engine_options=forced)
    else:  # Bagua's examples: with_bagua, then fuse_optimizer
        model = model.with_bagua([opt], GradientAllReduceAlgorithm(), _engine_options=forced)
        fuse_optimizer(opt)
    scaler = None
    if a.get("extra") == "scaler" and hasattr(torch, "amp") and \
            hasattr(torch.amp, "GradScaler"):
        try:
            scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        except (TypeError, RuntimeError):
            scaler = None  # this torch has no CPU GradScaler: the emulation below
    losses, last_stepped, buckets = [], [], 0
    plans, seen = [], []  # per step: the buckets' kept fusion plans, as indices into seen
    ddp = model.bagua_ddp
    for step in range(a.get("steps", STEPS)):
        opt.zero_grad(set_to_none=a["set_to_none"])
        x, y = (t.to(dev) for t in batch(rank, step))
        loss = torch.nn.functional.mse_loss(model(x), y)
        extra = a.get("extra")
        if extra == "scaler" and scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            if extra == "scaler":
                # What GradScaler does where torch has none for CPU: a scaled loss, then
                # unscale_ (the gradients multiplied by 1 / scale in place) before the step.
                (loss * 1024.0).backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p.grad.mul_(1.0 / 1024.0)
            else:
                loss.backward()
                if extra == "clip":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            if a["call"] == "fuse_step":
                opt.fuse_step()
            else:
                opt.step()
        losses.append(loss.detach().cpu().clone())
        steps = ddp._engine.steps()
        last_stepped.append(len(steps._stepped) if steps._stepped else 0)
        buckets = len(ddp.bucket_layout())
        kept = {b: plan for b, plan in opt.__dict__.get("_bagua_fuse_plans", {}).items()
                if b is not None}  # the buckets' plans (None: a whole step's)
        for plan in kept.values():
            if not any(plan is q for q in seen):
                seen.append(plan)  # held, so that no later plan can reuse its id
        plans.append(sorted(next(i for i, q in enumerate(seen) if q is plan)
                            for plan in kept.values()))
    mode, reason = ddp.optimizer_steps_in_backward[opt]
    return {"weights": torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]),
            "losses": torch.stack(losses), "mode": mode, "reason": reason,
            "stepped": last_stepped, "buckets": buckets,
            "fused_count": opt._bagua_fused_count, "plans": plans,
            "log": [m for m in records.messages if m.startswith("bagua:")]}


def torch_ddp(a, rank):
    """torch DDP (gloo) with AdamW, the reference loss curve."""
    model = Mlp(seed=rank)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = make_opt("adamw", model.parameters())
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = batch(rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return {"weights": torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]),
            "losses": torch.stack(losses)}


def count_python(a, rank):
    """Python calls from bagua's package during loss.backward() (sys.setprofile on this, the
    backward's, thread), for models of a["layers"] layers, and the hooks' own counters."""
    import bagua as pkg

    root = os.path.dirname(os.path.abspath(pkg.__file__))
    out = {}
    for layers in a["layers"]:
        model = Mlp(layers=layers, width=16, seed=rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)  # not fused: no stepping in backward
        model = model.with_bagua([opt], GradientAllReduceAlgorithm())
        counts = []
        for step in range(4):
            opt.zero_grad()
            x, y = batch(rank, step, width=16)
            loss = torch.nn.functional.mse_loss(model(x), y)
            calls = [0]

            def prof(frame, event, arg):
                if event == "call" and frame.f_code.co_filename.startswith(root):
                    calls[0] += 1

            sys.setprofile(prof)
            try:
                loss.backward()
            finally:
                sys.setprofile(None)
            opt.step()
            counts.append(calls[0])
        st = model.bagua_ddp._hook_state
        hooks = [type(h).__name__ for p in model.parameters()
                 for h in getattr(p, "_post_accumulate_grad_hooks", {}).values()]
        out[layers] = {"calls": counts, "hook_calls": st.calls, "python_calls": st.python_calls,
                       "params": len(list(model.parameters())), "hook_types": hooks,
                       "hook_state": type(st).__name__}
        model.bagua_ddp.close()
    return out


def misuse(a, rank):
    """In-backward stepping on, then a loop that changes: two backward passes before a step
    (RuntimeError), and clipping after it stepped (RuntimeError)."""
    out = {}
    for case in ("two_backwards", "clip_later"):
        model = Mlp(layers=20, seed=rank)
        opt = fuse_optimizer(make_opt("adamw", model.parameters()))
        model = model.with_bagua([opt], GradientAllReduceAlgorithm(),
                                 _engine_options=EngineOptions(step_in_backward=True))
        err = None
        try:
            for step in range(4):
                opt.zero_grad()
                x, y = batch(rank, step)
                torch.nn.functional.mse_loss(model(x), y).backward()
                if step == 2 and case == "two_backwards":
                    continue  # no step: the next backward must say so
                if step == 2 and case == "clip_later":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
                opt.step()
        except RuntimeError as e:
            err = str(e)
        out[case] = {"error": err, "mode": model.bagua_ddp.optimizer_steps_in_backward[opt][0]}
        model.bagua_ddp.close()
    return out


SCENARIOS = {"train": train, "torch_ddp": torch_ddp, "count_python": count_python,
             "misuse": misuse}


def main():
    out, args = sys.argv[1], json.loads(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    if any(spec.get("device") == "cuda" for spec in args.values()):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    bagua.init_process_group()
    results = {}
    for name, spec in args.items():
        results[name] = SCENARIOS[spec["scenario"]](spec, rank)
        bagua.barrier()
    torch.save(results, os.path.join(out, "rank{}.pt".format(rank)))
    bagua.barrier()


if __name__ == "__main__":
    main()
