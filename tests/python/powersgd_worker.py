"""Worker processes of test_powersgd.py (one per rank): ``python powersgd_worker.py <function>
<outdir> <json-args>`` with torchrun's variables; the function's result goes to
<outdir>/rank<r>.pt."""

import copy
import json
import os
import sys

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import Algorithm


class ConvNet(torch.nn.Module):
    """A 4-D conv weight (8 x 27 as a matrix), a 32 x 128 and a 4 x 32 weight, and biases."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc1 = torch.nn.Linear(128, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        x = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


def batch(rank, step, n=8):
    g = torch.Generator().manual_seed(7919 * step + 31 * rank + 5)
    x = torch.randn(n, 3, 6, 6, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    return x, y


def _init():
    if not bagua.is_initialized():
        bagua.init_process_group()


def device():
    if os.environ.get("PSGD_DEVICE") == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reference_run(a):
    """Steps with PowerSGD, recording per step this rank's local gradients (an unwrapped copy at
    the same weights), the reduced gradients the wrap wrote and the algorithm's state."""
    _init()
    r = bagua.get_rank()
    dev = device()
    torch.manual_seed(0)
    model = ConvNet().to(dev)
    plain = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.get("lr", 0.1))
    algo = Algorithm.init("powersgd", **a["kwargs"])
    model = model.with_bagua([opt], algo)
    records = []
    for step in range(a["steps"]):
        x, y = batch(r, step)
        x, y = x.to(dev), y.to(dev)
        plain.load_state_dict(model.state_dict())
        plain.zero_grad()
        torch.nn.functional.cross_entropy(plain(x), y).backward()
        local = [p.grad.detach().double().cpu().clone() for p in plain.parameters()]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        reduced = [p.grad.detach().double().cpu().clone() for p in model.parameters()]
        records.append({"local": local, "reduced": reduced, "snapshot": algo.snapshot(),
                        "loss": loss.item()})
        opt.step()
    return {"names": [n for n, _ in model.named_parameters()], "records": records}


def converge(a):
    """Trains ConvNet on class-template images with the named algorithm; the held-out loss
    before and after, and the final weights."""
    _init()
    r, n = bagua.get_rank(), bagua.get_world_size()
    dev = device()
    torch.manual_seed(0)
    model = ConvNet().to(dev)
    templates = torch.randn(4, 3, 6, 6).to(dev)  # one image a class, under heavy noise

    def task(seed, count):
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, 4, (count,), generator=g)
        x = templates[y.to(dev)] + 3.0 * torch.randn(count, 3, 6, 6, generator=g).to(dev)
        return x, y.to(dev)

    held_x, held_y = task(123456, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model = model.with_bagua([opt], Algorithm.init(a["algorithm"], **a.get("kwargs", {})))

    def held_loss():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(model(held_x), held_y).item()

    before = held_loss()
    for step in range(a["steps"]):
        x, y = task(1000 * step + r, 32 // n)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {"before": before, "after": held_loss(),
            "final": torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])}


def wrap_error(a):
    """The error a wrap with these arguments raises (None if it wraps)."""
    _init()
    model = ConvNet().to(device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        model.with_bagua([opt], Algorithm.init("powersgd", **a["kwargs"]))
    except Exception as e:  # the reducer's InvalidArgument, as the extension raises it
        return {"error": "{}: {}".format(type(e).__name__, e)}
    return {"error": None}


WORKERS = {"reference_run": reference_run, "converge": converge, "wrap_error": wrap_error}


def bundle(a):
    """Several of the functions above in one launch (importing torch dominates a launch on a
    loaded machine): {name: result} for a["items"] = {name: {"func": ..., "args": ...}}, in
    order."""
    return {k: WORKERS[v["func"]](v.get("args", {})) for k, v in a["items"].items()}


WORKERS["bundle"] = bundle


def main():
    func, out, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    result = WORKERS[func](args)
    torch.save(result, os.path.join(out, "rank{}.pt".format(os.environ.get("RANK", "0"))))
    if bagua.is_initialized():
        bagua.barrier()


if __name__ == "__main__":
    main()
