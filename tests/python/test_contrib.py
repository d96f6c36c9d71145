"""contrib: samplers (Bagua's test cases), cached dataset, generic fused optimizer."""

import copy

import pytest
import torch

from bagua.torch_api.contrib import (
    CachedDataset,
    LoadBalancingDistributedBatchSampler,
    LoadBalancingDistributedSampler,
    fuse_optimizer,
    is_fused_optimizer,
)


class PermDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed=7):
        g = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(n, generator=g).tolist()

    def __len__(self):
        return len(self.perm)

    def __getitem__(self, i):
        return self.perm[i]


def test_sampler_yields_increasing_complexity():
    ds = PermDataset(101)
    s = LoadBalancingDistributedSampler(ds, complexity_fn=lambda x: x, num_replicas=1, rank=0,
                                        shuffle=False)
    assert [ds[i] for i in s] == list(range(101))
    assert len(s) == 101


def test_sampler_ranks_get_neighbours_and_equal_counts():
    ds = PermDataset(50)
    samplers = [LoadBalancingDistributedSampler(ds, lambda x: x, num_replicas=4, rank=r,
                                                shuffle=True, seed=3) for r in range(4)]
    for epoch in (0, 1):
        for s in samplers:
            s.set_epoch(epoch)
        lists = [[ds[i] for i in s] for s in samplers]
        assert all(len(l) == 13 for l in lists)
        chunks = set()
        for step in range(13):
            vals = frozenset(l[step] for l in lists)
            # A chunk of 4 complexity neighbours; the last one wraps around to the cheapest
            # items to pad 50 samples to 52.
            assert vals in [frozenset(range(4 * k, 4 * k + 4)) for k in range(12)] + \
                [frozenset({48, 49, 0, 1})], sorted(vals)
            chunks.add(vals)
        assert len(chunks) == 13
    with pytest.raises(ValueError):
        LoadBalancingDistributedSampler(ds, lambda x: x, num_replicas=2, rank=2)
    with pytest.raises(ValueError):
        LoadBalancingDistributedSampler(ds, lambda x: x, num_replicas=2, rank=0, random_level=2)


def test_batch_sampler_variable_batches():
    ds = PermDataset(55)
    s = LoadBalancingDistributedSampler(ds, lambda x: x, num_replicas=1, rank=0, shuffle=False)

    def batch_fn(indices):
        out, i, size = [], 0, 1
        while i < len(indices):
            out.append(indices[i:i + size])
            i += size
            size += 1
        return out

    b = LoadBalancingDistributedBatchSampler(s, batch_fn)
    batches = list(b)
    assert len(b) == len(batches) == 10
    cur = 0
    for k, batch in enumerate(batches):
        assert len(batch) == k + 1
        assert ds[batch[0]] == cur
        cur += len(batch)
    with pytest.raises(ValueError):
        LoadBalancingDistributedBatchSampler(
            LoadBalancingDistributedSampler(ds, lambda x: x, num_replicas=1, rank=0,
                                            drop_last=True), batch_fn)


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self, n, tag):
        self.n, self.tag, self.reads = n, tag, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return {"i": i, "tag": self.tag, "x": torch.arange(3) * i}


def test_cached_dataset_serves_from_cache():
    d1, d2 = CountingDataset(102, "a"), CountingDataset(102, "b")
    c1 = CachedDataset(d1, backend="embedded", dataset_name="d1", writer_buffer_size=20)
    c2 = CachedDataset(d2, backend="embedded", dataset_name="d2", writer_buffer_size=20)
    for epoch in range(3):
        for c, tag in ((c1, "a"), (c2, "b")):
            for i in range(len(c)):
                s = c[i]
                assert s["i"] == i and s["tag"] == tag and torch.equal(s["x"], torch.arange(3) * i)
            if epoch == 0:
                c.cache_loader.flush()  # the last 2 of 102 wait in the writer buffer otherwise
    assert d1.reads == 102 and d2.reads == 102  # only the first pass reads the source
    assert c1.cache_loader.num_keys() == 204


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 3)
        self.fc2 = torch.nn.Linear(3, 1)
        with torch.no_grad():
            for k, p in enumerate(self.parameters()):
                p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape) * (k + 1))

    def forward(self, x):
        return torch.sigmoid(self.fc2(torch.sigmoid(self.fc1(x))))


OPTIMIZERS = [
    (torch.optim.SGD, dict(lr=0.01, momentum=1, nesterov=True, weight_decay=1)),
    (torch.optim.SGD, dict(lr=0.01, momentum=1, dampening=0.5, weight_decay=1)),
    (torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=1)),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=1)),
    (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9)),
    (torch.optim.Rprop, dict(lr=0.01)),
    (torch.optim.Adadelta, dict(lr=0.5, weight_decay=1)),
    (torch.optim.Adamax, dict(lr=0.01, weight_decay=1)),
]


@pytest.mark.parametrize("opt_cls,kwargs", OPTIMIZERS)
def test_fuse_step_bitwise_equals_step(opt_cls, kwargs):
    x = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])

    def make():
        m = Fused()
        groups = [{"params": [m.fc1.weight, m.fc1.bias], "weight_decay": 0.1},
                  {"params": [m.fc2.weight, m.fc2.bias], "weight_decay": 0.0}]
        kw = {k: v for k, v in kwargs.items() if k != "weight_decay"}
        if "weight_decay" not in kwargs and opt_cls is not torch.optim.Rprop and \
                opt_cls is not torch.optim.RMSprop:
            pass
        if opt_cls in (torch.optim.Rprop,):
            groups = [{"params": g["params"]} for g in groups]
        return m, opt_cls(groups, **kw)

    ref, ref_opt = make()
    fus, fus_opt = make()
    fus_opt = fuse_optimizer(fus_opt)
    assert is_fused_optimizer(fus_opt) and not is_fused_optimizer(ref_opt)
    with pytest.raises(RuntimeError):
        fuse_optimizer(fus_opt)
    for epoch in range(101):
        for m, o, fused in ((ref, ref_opt, False), (fus, fus_opt, True)):
            o.zero_grad(set_to_none=False) if "set_to_none" in o.zero_grad.__code__.co_varnames \
                else o.zero_grad()
            m(x).sum().backward()
            if fused and epoch % 2 == 0:
                o.fuse_step()
            else:
                o.step()
    for a, b in zip(ref.parameters(), fus.parameters()):
        assert torch.equal(a, b)
    assert fus_opt._bagua_fused_count == 102


@pytest.mark.parametrize("opt_cls,kwargs", OPTIMIZERS)
def test_fuse_step_keeps_its_plan_and_stays_bitwise_equal(opt_cls, kwargs):
    """Consecutive fuse_step() calls reuse one fusion (the fused state stays in place); the
    result stays bitwise step()'s through a state_dict() in the middle, a step() in between, a
    gradient missing for a while (the layout changes: planned again) and a state loaded back."""
    x = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    kw = {k: v for k, v in kwargs.items()}

    def make():
        m = Fused()
        return m, opt_cls(m.parameters(), **kw)

    ref, ref_opt = make()
    fus, fus_opt = make()
    fus_opt = fuse_optimizer(fus_opt)
    fused_steps = 0
    laid_out = None
    for epoch in range(40):
        for m, o, fused in ((ref, ref_opt, False), (fus, fus_opt, True)):
            o.zero_grad(set_to_none=False)
            m(x).sum().backward()
            if fused and laid_out is None:
                laid_out = m.fc1.bias.grad
            if fused and 10 <= epoch < 14:
                # fc1's bias gradient elsewhere: a different layout, nothing fuses
                m.fc1.bias.grad = m.fc1.bias.grad.clone()
            if fused and epoch == 14:  # back in its laid-out place: fused again
                laid_out.copy_(m.fc1.bias.grad)
                m.fc1.bias.grad = laid_out
            if fused and epoch != 20:
                o.fuse_step()
                fused_steps += not 10 <= epoch < 14
            else:
                o.step()
        if epoch == 5:  # the per-parameter state as a checkpoint sees it
            got, want = fus_opt.state_dict(), ref_opt.state_dict()
            for i, st in want["state"].items():
                for k, v in st.items():
                    w = got["state"][i][k]
                    assert (torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w), k
        if epoch == 30:
            fus_opt.load_state_dict(copy.deepcopy(fus_opt.state_dict()))
        if epoch in (2, 3):
            assert None in fus_opt.__dict__.get("_bagua_fuse_plans", {}), \
                "consecutive fuse_steps keep a plan"
    for a, b in zip(ref.parameters(), fus.parameters()):
        assert torch.equal(a, b)
    assert fus_opt._bagua_fused_count == fused_steps


@pytest.mark.parametrize("opt_cls,kwargs", OPTIMIZERS)
def test_fuse_step_with_gradients_of_their_own_stays_bitwise_equal(opt_cls, kwargs):
    """Gradients each in memory of their own (not laid out), reused in place from step to step:
    they are copied into the fused gradient, and every step must copy them again (same
    addresses, new values)."""
    x = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])

    def make():
        m = Fused()
        return m, opt_cls(m.parameters(), **kwargs)

    ref, ref_opt = make()
    fus, fus_opt = make()
    fus_opt = fuse_optimizer(fus_opt)
    for p in fus.parameters():
        p.grad = torch.zeros_like(p)  # a gradient of its own, not the laid-out place
    for step in range(12):
        for m, o, fused in ((ref, ref_opt, False), (fus, fus_opt, True)):
            o.zero_grad(set_to_none=False)
            (m(x) * (step + 1)).sum().backward()
            o.fuse_step() if fused else o.step()
    for a, b in zip(ref.parameters(), fus.parameters()):
        assert torch.equal(a, b)
    assert fus_opt._bagua_fused_count == 12
