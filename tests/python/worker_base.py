"""What the worker modules share: the registry of worker functions (``worker``), the init, the
test model (Bagua's), its per-rank batches and the single-process reference."""

import torch

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import Algorithm
from bagua.torch_api.algorithms.q_adam import QAdamAlgorithm, QAdamOptimizer

WORKERS = {}


def _init():
    """The bundled scenarios share one process: init once (a second init raises, as in
    Bagua)."""
    if not bagua.is_initialized():
        bagua.init_process_group()


def worker(f):
    WORKERS[f.__name__] = f
    return f


class Net(torch.nn.Module):
    """Bagua's test model: 2 -> 10 -> 50 -> 4 with ReLUs and a softmax."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 10, bias=False)
        self.fc2 = torch.nn.Linear(10, 50, bias=True)
        self.fc3 = torch.nn.Linear(50, 4, bias=False)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return torch.softmax(self.fc3(x), dim=1)


def data(rank, step, batch=4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(batch, 2, generator=g), torch.randn(batch, 4, generator=g)


def _device(a):
    """The worker's device: a["device"] ("cpu" or "cuda": this rank's current GPU)."""
    dev = torch.device(a.get("device", "cpu"))
    return torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" else dev


def flat(model):
    return torch.cat([p.detach().reshape(-1).cpu().clone() for p in model.parameters()])


def make_algorithm(name, kwargs, model, lr):
    if name == "qadam":
        params = model.parameters()
        if kwargs.get("groups"):  # one group per parameter, in reverse order
            params = [{"params": [p]} for p in reversed(list(model.parameters()))]
        opt = QAdamOptimizer(params, lr=lr, **kwargs.get("opt", {}))
        return QAdamAlgorithm(opt, **kwargs.get("algo", {})), opt
    return Algorithm.init(name, **kwargs), torch.optim.SGD(model.parameters(), lr=lr)


def reference(init, world, steps, lr, algorithm):
    """Single process on the concatenated batch (the mean of the per-rank mean losses)."""
    model = Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(init.clone(), model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        xs, ys = zip(*[data(r, step) for r in range(world)])
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        opt.step()
    return flat(model)


def _default_group_ops():
    """Operations run so far by this rank on the default group's global and intra-node
    communicators (host, then nccl), once every earlier host operation has finished (a barrier:
    the host queue runs in order)."""
    bagua.barrier()
    c = bagua.communication._get_default_group().get_global_communicator()
    out = []
    for g in (c._host, c._nccl):
        if g is not None:  # every rank runs the global and intra-node ones (inter: leaders only)
            by = g.stats()["operations_by_communicator"]
            out += [by["global"], by["intra"]]
    return out


def _train_sgd(model, opt, r, steps, fused=False, start=0, device=None):
    losses = []
    for step in range(start, start + steps):
        x, y = data(r, step)
        if device is not None:
            x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        (opt.fuse_step() if fused else opt.step())
        losses.append(loss.item())
    return losses
