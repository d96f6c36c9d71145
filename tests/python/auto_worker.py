"""One rank of auto_checks.py: trains a small MLP with algorithm="auto" once per scenario (each a
fresh model and wrap, in one process so that torch is imported once) and saves each one's
choice and weights, or the error its wrap raised (``python auto_worker.py <out dir> <json>``,
the JSON a list of {"kwargs": ..., "steps": ...})."""

import json
import os
import sys

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import Algorithm


def scenario(rank, a):
    torch.manual_seed(rank)  # different on purpose: the wrap broadcasts rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    algo = Algorithm.init("auto", **a.get("kwargs", {}))
    try:
        model = model.with_bagua([opt], algo)
    except Exception as e:  # the error cases: what the user sees
        return {"error": "{}: {}".format(type(e).__name__, e)}
    losses = []
    for step in range(a.get("steps", 12)):
        g = torch.Generator().manual_seed(step * 7 + rank)
        x = torch.randn(16, 16, generator=g)
        y = (x[:, :4] - x[:, 4:8]).argmax(1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    out = {"losses": losses, "decision": model.bagua_algorithm.decision(),
           "weights": torch.cat([p.detach().reshape(-1) for p in model.parameters()])}
    model.bagua_ddp.close()
    return out


def main():
    out, scenarios = sys.argv[1], json.loads(sys.argv[2])
    bagua.init_process_group()
    rank = bagua.get_rank()
    results = [scenario(rank, a) for a in scenarios]
    torch.save(results, os.path.join(out, "rank{}.pt".format(rank)))
    bagua.barrier()


if __name__ == "__main__":
    main()
