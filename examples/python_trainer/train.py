"""A 2-rank CPU data-parallel training with the installed bagua package (nothing from the source
tree): a small MLP learns a teacher's labels, wrapped with ``with_bagua`` and gradient all-reduce.

    baguarun --nproc_per_node 2 -- python train.py
    python -m torch.distributed.run --standalone --nproc_per_node 2 train.py

Every rank starts from different weights (with_bagua broadcasts rank 0's) and draws its own
samples. Exit status 0 when the loss went down and every rank ends with the same weights, 1 (the
reason on stderr) otherwise.
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import bagua
import bagua.torch_api as bt
from bagua.torch_api.algorithms import gradient_allreduce


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    bt.init_process_group()
    rank, world = bt.get_rank(), bt.get_world_size()

    torch.manual_seed(0)  # the same teacher on every rank
    teacher = torch.nn.Linear(16, 4)
    torch.manual_seed(100 + rank)  # different initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model = model.with_bagua([opt], gradient_allreduce.GradientAllReduceAlgorithm())

    data = torch.Generator().manual_seed(1000 + rank)  # every rank its own samples
    losses = []
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=data)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    torch.distributed.all_reduce(hi, op=torch.distributed.ReduceOp.MAX)
    torch.distributed.all_reduce(lo, op=torch.distributed.ReduceOp.MIN)
    differ = int((hi != lo).sum())
    window = max(1, args.steps // 5)
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    # One write per line: under torchrun both ranks share the launcher's stdout, and print()
    # writes the text and its newline separately, so two ranks' lines could run together.
    sys.stdout.write("bagua {} ({}): rank {}/{} loss {:.4f} -> {:.4f} over {} steps, {} of {} weights "
                     "differ between ranks\n".format(bagua.__version__, bagua.__file__, rank, world,
                                                     first, last, args.steps, differ, flat.numel()))
    sys.stdout.flush()
    bt.destroy_process_group()
    if differ:
        print("train.py: rank {}: {} weights differ between ranks".format(rank, differ),
              file=sys.stderr)
        return 1
    if not last < 0.7 * first:
        print("train.py: rank {}: the loss did not go down enough ({:.4f} -> {:.4f})".format(
            rank, first, last), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
