"""How fast an LM preset learns its Markov chain on one device, for each of a few Adam settings:
the evaluation loss above the chain's exact floor every --eval-every steps. It picks the
learning rate (and warm-up) of a time-to-accuracy cell before a multi-GPU run spends its time,
and shows whether a preset can reach a margin inside a step cap at all.

  python3 bench/ddp/lr_probe.py --preset gpt2-chain --batch 16 --steps 300 \
      --lrs 6e-4,1e-3,2e-3 --warmups 0,30 --device cuda

One line per evaluation; at the end, per setting, the first step at which the loss came within
each margin of --margins of the floor (``-`` if never). The batch is the global one (a rank's
batch times the ranks of the cell it stands for); the batches, the held-out set and the
evaluation are tta.py's (its LMTask as rank 0 sees it, in blocks of --eval-every steps).
"""

import argparse
import itertools
import time

import torch

import models
import tta


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
    task = tta.LMTask(argparse.Namespace(preset=args.preset, batch=args.batch, lm_margin=0.0,
                                         eval_batches=args.eval_batches), 0, dev)
    floor = task.floor
    margins = [float(m) for m in args.margins.split(",")]
    print("preset {} batch {} x {} tokens; chain floor {:.4f} nats".format(
        args.preset, task.batch, task.seq, floor), flush=True)

    summary = []
    for lr, warm in itertools.product([float(x) for x in args.lrs.split(",")],
                                      [int(x) for x in args.warmups.split(",")]):
        torch.manual_seed(0)
        model = models.build("transformer", args.preset, seed=0).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        first = {m: None for m in margins}
        t0 = time.time()
        step = 0
        while step < args.steps:
            for batch in task.block(step, min(args.eval_every, args.steps - step)):
                step += 1
                if warm:
                    tta._warm_lr(opt, lr * min(1.0, step / warm))
                loss = tta._loss(argparse.Namespace(model="transformer"), model, batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                ev = task.evaluate(model)
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
