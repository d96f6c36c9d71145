"""Exact resume: the elastic sampler's exactly-once plans across world-size changes
(in-process, every rank's sampler side by side), and a 2-rank run killed mid-epoch (every rank
SIGKILLed) and restarted from its checkpoint ending bit for bit where the uninterrupted run
ends, step for step (baguarun, loopback), with gradient all-reduce and with the decentralized
algorithms (their schedule and replicas in the checkpoint).

Run by the 'python_elastic_resume' meson test (pytest on this file).
"""

import os
import subprocess
import sys
import tempfile

import pytest
import torch

from bagua.torch_api.contrib import ElasticDistributedSampler

import harness

HERE = os.path.dirname(os.path.abspath(__file__))


def world_of(n, batch, world, **kw):
    return [ElasticDistributedSampler(n, batch, num_replicas=world, rank=r, **kw)
            for r in range(world)]


def consume(samplers, steps=None):
    """Runs `steps` steps (all if None) on every rank; returns the ids each step read."""
    iters = [iter(s) for s in samplers]
    lens = {len(s) for s in samplers}
    assert len(lens) == 1, "ranks disagree on the number of steps: {}".format(lens)
    n = lens.pop() if steps is None else steps
    out = []
    for _ in range(n):
        batches = [next(it) for it in iters]
        assert all(len(b) > 0 for b in batches), "an empty batch: {}".format(batches)
        out.append(batches)
    for s in samplers:
        s.batches_consumed = n
    return out


@pytest.mark.parametrize("complexities", [None, "balanced"])
def test_plan_reads_every_sample_once_with_equal_steps(complexities):
    n = 103
    cx = [(i * 37) % 50 for i in range(n)] if complexities else None
    for world in (1, 2, 3, 4, 5):
        ranks = world_of(n, 4, world, seed=9, complexities=cx)
        for epoch in (0, 1):
            for s in ranks:
                s.set_epoch(epoch)
            steps = consume(ranks)
            ids = [i for st in steps for b in st for i in b]
            assert sorted(ids) == list(range(n)), (world, epoch)
            # Batches are batch_size, except one step that takes a tail shorter than the world.
            sizes = [len(b) for st in steps for b in st]
            assert max(sizes) <= 5 and min(sizes) >= 1
            if cx and world > 1:
                # Load balance: within a full step the ranks' costs are close.
                for st in steps[:-1]:
                    costs = [sum(cx[i] for i in b) for b in st]
                    assert max(costs) - min(costs) <= 4 * 4, (costs, st)
        a = [list(b) for b in world_of(n, 4, world, seed=9, complexities=cx)[0]]
        b = [list(b) for b in world_of(n, 4, world, seed=9, complexities=cx)[0]]
        assert a == b  # deterministic


@pytest.mark.parametrize("complexities", [None, "balanced"])
def test_world_changes_mid_epoch_keep_every_sample_exactly_once(complexities):
    n = 97
    cx = [(i * 13) % 29 for i in range(n)] if complexities else None
    seen = []
    ranks = world_of(n, 3, 4, seed=2, complexities=cx)
    for s in ranks:
        s.set_epoch(5)
    seen += consume(ranks, 3)                      # world 4: 3 steps
    state = ranks[0].state_dict()
    assert all(torch.equal(state["remaining"], s.state_dict()["remaining"]) for s in ranks)
    for world, steps in ((3, 2), (5, 1), (2, None)):  # 4 -> 3 -> 5 -> 2, to the end
        ranks = world_of(n, 3, world, seed=2, complexities=cx)
        for s in ranks:
            s.load_state_dict(state)
            s.set_epoch(5)                         # the resumed epoch keeps its remainder
        seen += consume(ranks, steps)
        state = ranks[0].state_dict()
    ids = [i for st in seen for b in st for i in b]
    assert sorted(ids) == list(range(n))
    assert state["remaining"].numel() == 0
    # The next epoch starts whole again.
    for s in ranks:
        s.set_epoch(6)
    assert sorted(i for st in consume(ranks) for b in st for i in b) == list(range(n))


def test_tail_shorter_than_the_world_joins_the_step_before():
    ranks = world_of(13, 3, 4, shuffle=False)      # 12 + 1: the last sample joins step 1
    steps = consume(ranks)
    assert len(steps) == 1 and sorted(i for b in steps[0] for i in b) == list(range(13))
    assert [len(b) for b in steps[0]] == [4, 3, 3, 3]
    tiny = world_of(2, 3, 4, shuffle=False)        # fewer samples than ranks: some ranks empty
    assert [list(next(iter(s))) for s in tiny] == [[0], [1], [], []]


def test_bad_positions_are_refused():
    s = ElasticDistributedSampler(10, 2, num_replicas=2, rank=0, seed=1)
    state = s.state_dict(2)
    other = ElasticDistributedSampler(11, 2, num_replicas=2, rank=0, seed=1)
    other.set_epoch(5)
    before = [list(b) for b in other]
    with pytest.raises(ValueError, match="dataset of 10 samples"):
        other.load_state_dict(state)
    assert other.epoch == 5 and [list(b) for b in other] == before  # left as it was
    with pytest.raises(ValueError, match="seed 1"):
        ElasticDistributedSampler(10, 2, num_replicas=2, rank=0, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="batches consumed"):
        s.state_dict(99)
    with pytest.raises(ValueError, match="batch_size"):
        ElasticDistributedSampler(10, 0, num_replicas=2, rank=0)


@pytest.mark.parametrize("args, kwargs, match", [
    ((0, 2), {}, "dataset is empty"),
    ((10, 2), {"rank": 2}, "rank 2 is outside"),
    ((10, 2), {"num_replicas": 0, "rank": 0}, "numReplicas is 0"),
    ((10, 2), {"random_level": 1.5}, "must be in \\[0, 1\\]"),
    ((10, 2), {"complexities": [1] * 9}, "9 complexities for a dataset of 10"),
])
def test_bad_sampler_arguments_are_value_errors(args, kwargs, match):
    # The plan (C++) checks them; its InvalidArgument is a ValueError, as in Bagua, and still a
    # RuntimeError for code written against our earlier versions.
    kw = {"num_replicas": 2, "rank": 0}
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match) as e:
        ElasticDistributedSampler(*args, **kw)
    assert isinstance(e.value, RuntimeError)


# ---- kill every rank mid-epoch, restart, compare bit for bit ----------------------------------


def launch(world, args, timeout=240):
    exe = harness.baguarun_exe()
    env = dict(os.environ, OMP_NUM_THREADS="1", BAGUA_RENDEZVOUS_TIMEOUT_MS="60000",
               BAGUA_COLLECTIVE_TIMEOUT_MS="60000")
    p = subprocess.run([exe, "--nproc_per_node", str(world), "--master_port", "0", "--",
                        sys.executable, os.path.join(HERE, "elastic_worker.py")] + args,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace")


def step_records(logdir):
    """{(rank, step): record} over every log of the directory, the last attempt winning."""
    out = {}
    for h, kind, rec in harness.elastic_log_entries(logdir):
        if kind == "step":
            key = (h["rank"], rec["step"])
            if key not in out or out[key][0] < h["time"]:
                out[key] = (h["time"], rec)
    return {k: v[1] for k, v in out.items()}


# Gradient all-reduce, and the decentralized algorithms exchanging every 3rd step: their resume
# must restore the reducer's step counter (else the exchange steps shift) and low-precision
# decentralized's replicas (else they restart as copies of the weights); either fault makes the
# weights differ at the end.
@pytest.mark.parametrize("algorithm", ["gradient_allreduce", "decentralized",
                                       "low_precision_decentralized"])
def test_killed_and_resumed_run_ends_bit_for_bit_like_the_uninterrupted_one(algorithm):
    with tempfile.TemporaryDirectory(prefix="bagua_resume_") as d:
        common = ["--epochs", "2", "--samples", "96", "--batch", "4",  # 12 steps an epoch
                  "--algorithm", algorithm]
        rc, out = launch(2, common + ["--ckpt", d + "/a", "--logs", d + "/alog",
                                      "--out", d + "/a.pt"])
        assert rc == 0, out[-5000:]
        rc, out = launch(2, common + ["--ckpt", d + "/b", "--logs", d + "/blog",
                                      "--kill-at-step", "17"])
        assert rc != 0 and "signal 9" in out, out[-5000:]
        assert open(d + "/b/latest").read() == "step_16"
        rc, out = launch(2, common + ["--ckpt", d + "/b", "--logs", d + "/blog",
                                      "--out", d + "/b.pt"])
        assert rc == 0, out[-5000:]
        a, b = torch.load(d + "/a.pt"), torch.load(d + "/b.pt")
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), "{} differs after the resume".format(k)
        # Step for step: the same samples and the same loss (dropout's RNG restored).
        ra, rb = step_records(d + "/alog"), step_records(d + "/blog")
        assert ra.keys() == rb.keys() and len(ra) == 2 * 24
        for key in sorted(ra):
            assert ra[key]["ids"] == rb[key]["ids"], key
            assert ra[key]["loss"] == rb[key]["loss"], key
        # It trained: the whole dataset's loss at the end of epoch 1 is well below epoch 0's.
        evals = {rec["epoch"]: rec["loss"]
                 for _, kind, rec in harness.elastic_log_entries(d + "/alog") if kind == "eval"}
        # (Decentralized averaging with a peer every 3rd step converges more slowly.)
        assert evals[1] < evals[0] * (0.5 if algorithm == "gradient_allreduce" else 0.8), evals


class _Mine:
    """An object of the user's own type in `extra` (torch.load(weights_only=True) refuses it)."""

    def __init__(self, v):
        self.v = v


WEIGHTS_ONLY_DEFAULT = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6)


def _plain(obj, where="file"):
    """Asserts `obj` holds only what torch.load(weights_only=True) takes without allowlisting:
    tensors, torch.Size, None, bool, int, float, str, bytes, list, tuple, dict, OrderedDict."""
    import collections

    if isinstance(obj, (torch.Tensor, torch.Size)) or obj is None or \
            type(obj) in (bool, int, float, str, bytes):
        return
    assert type(obj) in (list, tuple, dict, collections.OrderedDict), \
        "{} holds a {}".format(where, type(obj))
    for k, v in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
        _plain(k, where)
        _plain(v, "{}[{!r}]".format(where, k))


def _ckpt_dir(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    return tempfile.TemporaryDirectory(prefix="bagua_ckpt_")


def _trained():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return model, opt


def test_checkpoint_files_hold_plain_types_and_restore_every_rng(monkeypatch):
    """torch >= 2.6 loads with weights_only=True by default: what save_training_state writes
    (numpy's RNG state included) holds only tensors and plain types, loads that way, and the
    RNG streams (torch, random, numpy) continue exactly after the load."""
    import random

    import numpy

    from bagua.torch_api.checkpoint import load_training_state, save_training_state

    with _ckpt_dir(monkeypatch) as d:
        model, opt = _trained()
        numpy.random.seed(5)
        numpy.random.rand(7)  # a position inside the stream
        save_training_state(d, model, opt, step=3, extra={"best": 0.5, "ids": [1, 2]})
        for name in ("rank_0.pt", "meta.pt"):
            _plain(torch.load(os.path.join(d, "step_3", name)), name)
        after = (torch.rand(3), random.random(), numpy.random.rand(3))
        numpy.random.seed(99)
        random.seed(99)
        torch.manual_seed(99)
        state = load_training_state(d, model, opt, weights_only=True if WEIGHTS_ONLY_DEFAULT
                                    else None)
        assert state["step"] == 3 and state["extra"] == {"best": 0.5, "ids": [1, 2]}
        again = (torch.rand(3), random.random(), numpy.random.rand(3))
        assert torch.equal(after[0], again[0]) and after[1] == again[1]
        assert numpy.array_equal(after[2], again[2])


@pytest.mark.skipif(not WEIGHTS_ONLY_DEFAULT, reason="torch {} < 2.6: torch.load does not load "
                    "weights only by default (runs on the GPU machine's torch)".format(
                        torch.__version__))
def test_an_extra_of_the_users_own_type_needs_weights_only_false(monkeypatch):
    import pickle

    from bagua.torch_api.checkpoint import load_training_state, save_training_state

    with _ckpt_dir(monkeypatch) as d:
        model, opt = _trained()
        save_training_state(d, model, opt, step=4, extra=_Mine(7))
        with pytest.raises(pickle.UnpicklingError, match=r"weights_only=False"):
            load_training_state(d, model, opt)
        assert load_training_state(d, model, opt, weights_only=False)["extra"].v == 7
