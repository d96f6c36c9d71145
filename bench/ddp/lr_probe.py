"""How fast an LM preset learns its Markov chain on one device, for each of a few Adam settings:
the evaluation loss above the chain's exact floor every --eval-every steps. It picks the
learning rate (and warm-up) of a time-to-accuracy cell before a multi-GPU run spends its time,
and shows whether a preset can reach a margin inside a step cap at all.

  python3 bench/ddp/lr_probe.py --preset gpt2-chain --batch 16 --steps 300 \
      --lrs 6e-4,1e-3,2e-3 --warmups 0,30 --device cuda

One line per evaluation; at the end, per setting, the first step at which the loss came within
each margin of --margins of the floor (``-`` if never). The batch is the global one (a rank's
batch times the ranks of the cell it stands for); the data and held-out set are tta.py's.
"""

import argparse
import itertools
import time

import torch
import torch.nn.functional as F

import models


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mid", choices=sorted(models.LM_PRESETS))
    ap.add_argument("--batch", type=int, default=0, help="sequences a step (default: the preset's)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--lrs", default="2e-3", help="comma-separated Adam learning rates")
    ap.add_argument("--warmups", default="0",
                    help="comma-separated linear warm-up lengths in steps (0: constant lr)")
    ap.add_argument("--margins", default="1.0,0.5,0.35,0.25")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    dev = torch.device(args.device)
    _, _, _, _, seq, batch = models.LM_PRESETS[args.preset]
    batch = args.batch or batch
    chain = models.lm_chain(args.preset)
    floor = chain.loss_floor(seq)
    held = chain.sample(args.eval_batches * batch, seq + 1, seed=999).to(dev)
    margins = [float(m) for m in args.margins.split(",")]
    print("preset {} batch {} x {} tokens; chain floor {:.4f} nats".format(
        args.preset, batch, seq, floor), flush=True)

    summary = []
    for lr, warm in itertools.product([float(x) for x in args.lrs.split(",")],
                                      [int(x) for x in args.warmups.split(",")]):
        torch.manual_seed(0)
        model = models.build("transformer", args.preset, seed=0).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        first = {m: None for m in margins}
        t0 = time.time()
        for step in range(1, args.steps + 1):
            if warm:
                for g in opt.param_groups:
                    g["lr"] = lr * min(1.0, step / warm)
            toks = chain.sample(batch, seq + 1, seed=1000 * 1000003 + step).to(dev)
            loss = F.cross_entropy(model(toks[:, :-1]).flatten(0, 1), toks[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % args.eval_every == 0 or step == args.steps:
                model.eval()
                with torch.no_grad():
                    ev = sum(float(F.cross_entropy(model(x[:, :-1]).flatten(0, 1),
                                                   x[:, 1:].flatten()))
                             for x in held.split(batch)) / args.eval_batches
                model.train()
                for m in margins:
                    if first[m] is None and ev <= floor + m:
                        first[m] = step
                print("lr {:g} warm-up {} step {:4d}: train {:.3f} eval {:.3f} (+{:.3f}) "
                      "[{:.1f} s]".format(lr, warm, step, float(loss), ev, ev - floor,
                                          time.time() - t0), flush=True)
        summary.append((lr, warm, first))
    print("\nfirst step within a margin of the floor ({:.4f} nats):".format(floor))
    print("lr       warm-up  " + "  ".join("+{:<5g}".format(m) for m in margins))
    for lr, warm, first in summary:
        print("{:<8g} {:<8d} ".format(lr, warm) +
              "  ".join("{:<6}".format(first[m] if first[m] is not None else "-")
                        for m in margins))


if __name__ == "__main__":
    main()
