"""Training state for exact resume and elastic restarts.

    state = load_training_state(ckpt_dir, model, optimizer, sampler=sampler)   # None: fresh
    start_epoch = state["epoch"] if state else 0
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)                 # keeps a resumed epoch's remaining samples
        for batch in sampler.track(loader):
            ...train one step...
            save_training_state(ckpt_dir, model, optimizer, sampler=sampler, epoch=epoch)

Layout: ``<dir>/step_<n>/rank_<r>.pt`` (every rank: model, optimizer(s), LR scheduler(s), the
algorithm's state where it has one, the reducer's schedule (its step counter and the built-in
algorithm's state: decentralized's exchange counter, low-precision decentralized's replicas),
RNG states of torch (CPU and CUDA), ``random`` and numpy),
``<dir>/step_<n>/meta.pt`` (rank 0: world size, step, epoch, the sampler's data position,
``extra``) and ``<dir>/latest`` naming the newest complete step. A checkpoint counts only
once ``latest`` names it: every rank writes its file, a barrier, then rank 0 renames a new
``latest`` into place (atomic) and deletes all but the newest ``keep`` steps. A rank killed
mid-save leaves the previous checkpoint in force.

Loading with the world size of the save: rank r restores its own file (bit-for-bit resume,
RNG included). With another world size (an elastic restart after a node left or joined): every
rank restores rank 0's model and optimizer (what gradient all-reduce keeps equal on every
rank), RNG streams are re-seeded from (seed, step, rank), and the sampler re-cuts the epoch's
remaining samples for the new world (each sample still exactly once).

Every rank must call both functions (collective: barriers through torch.distributed when it is
initialised). Runs on the trainer's thread.
"""

import os
import pickle
import random
import shutil

import torch
import torch.distributed as dist

__all__ = ["save_training_state", "load_training_state", "latest_step"]


def _world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    from .. import env

    return env.get_world_size(), env.get_rank()


def _barrier():
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _rng_state():
    s = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        # As plain types and a tensor, not numpy's own objects: torch.load(weights_only=True)
        # (torch >= 2.6's default) refuses numpy's array reconstructor.
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        s["numpy"] = (str(kind), torch.from_numpy(keys.astype(numpy.int64)), int(pos),
                      int(has_gauss), float(cached))
    except ImportError:
        pass
    return s


def _set_rng_state(s):
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    if "numpy" in s:
        import numpy

        kind, keys, pos, has_gauss, cached = s["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype(numpy.uint32), pos, has_gauss, cached))


def _reseed(seed, step, rank):
    v = (seed * 1000003 + step * 9176 + rank) % (2**63)
    torch.manual_seed(v)
    random.seed(v)
    try:
        import numpy

        numpy.random.seed(v % (2**32))
    except ImportError:
        pass


def _algorithm_state(model):
    impl = getattr(model, "bagua_algorithm", None)
    fn = getattr(impl, "state_dict", None)
    return fn() if callable(fn) else None


def _bagua_ddp(model):
    """The bagua data-parallel wrapper behind ``model`` (with_bagua's module, or
    DistributedDataParallel_V1_9_0), or None for a plain module."""
    inner = getattr(model, "inner", None)
    for m in (model, inner):
        if m is None:
            continue
        d = m.__dict__.get("bagua_ddp", m)
        if callable(getattr(d, "_bagua_save_schedule", None)):
            return d
    return None


def _write_atomic(obj, path):
    tmp = "{}.tmp.{}".format(path, os.getpid())
    torch.save(obj, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _load(file, map_location, weights_only):
    """torch.load of one checkpoint file, with torch's default weights_only unless told (torch
    >= 2.6 loads weights only by default; what bagua writes holds nothing else)."""
    kw = {} if weights_only is None else {"weights_only": weights_only}
    try:
        return torch.load(file, map_location=map_location, **kw)
    except pickle.UnpicklingError as e:
        if weights_only is False or "Weights only load failed" not in str(e):
            raise  # not the weights-only refusal (a damaged file, say): as torch said it
        raise pickle.UnpicklingError(
            "bagua: {} holds objects that torch.load(weights_only=True) refuses (an `extra` of "
            "your own types, or a state_dict holding them): {}. If you trust this checkpoint "
            "(you wrote it), load it with load_training_state(..., weights_only=False)".format(
                file, str(e).strip().splitlines()[-1] if str(e).strip() else repr(e))) from e


def latest_step(path):
    """The step of the newest complete checkpoint in ``path``, or None."""
    try:
        with open(os.path.join(path, "latest")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    if not name.startswith("step_"):
        raise ValueError("bagua: {}/latest names {!r}, not a step_<n> directory".format(
            path, name))
    return int(name[len("step_"):])


def save_training_state(path, model, optimizer=None, lr_scheduler=None, sampler=None, step=None,
                        epoch=0, batches_consumed=None, extra=None, keep=2):
    """Saves a checkpoint of the training state; returns its step.

    ``step`` defaults to the previous checkpoint's step + 1 (counted per process from the
    loaded one). ``batches_consumed`` defaults to ``sampler.batches_consumed`` (kept by
    ``sampler.track(loader)``). ``extra`` is returned by the load: plain types (numbers, strings,
    lists, tuples, dicts) and tensors load as they are; on torch >= 2.6 other objects need the
    load's ``weights_only=False``.
    """
    world, rank = _world()
    if step is None:
        step = getattr(save_training_state, "_next", {}).get(path, (latest_step(path) or 0) + 1)
    d = os.path.join(path, "step_{}".format(step))
    if rank == 0:
        os.makedirs(d, exist_ok=True)
    _barrier()
    os.makedirs(d, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in _as_list(optimizer)],
        "lr_schedulers": [s.state_dict() for s in _as_list(lr_scheduler)],
        "algorithm": _algorithm_state(model),
        "rng": _rng_state(),
    }
    ddp = _bagua_ddp(model)
    if ddp is not None:
        state["schedule"] = ddp._bagua_save_schedule()
    _write_atomic(state, os.path.join(d, "rank_{}.pt".format(rank)))
    if rank == 0:
        meta = {"world_size": world, "step": step, "epoch": epoch, "extra": extra,
                "data": None if sampler is None else sampler.state_dict(batches_consumed)}
        _write_atomic(meta, os.path.join(d, "meta.pt"))
    _barrier()
    if rank == 0:
        tmp = os.path.join(path, "latest.tmp.{}".format(os.getpid()))
        with open(tmp, "w") as f:
            f.write("step_{}".format(step))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, "latest"))
        steps = sorted(int(n[5:]) for n in os.listdir(path)
                       if n.startswith("step_") and n[5:].isdigit())
        for s in steps[:-keep] if keep > 0 else []:
            if s != step:
                shutil.rmtree(os.path.join(path, "step_{}".format(s)), ignore_errors=True)
    _barrier()
    if not hasattr(save_training_state, "_next"):
        save_training_state._next = {}
    save_training_state._next[path] = step + 1
    return step


def load_training_state(path, model, optimizer=None, lr_scheduler=None, sampler=None, seed=0,
                        map_location="cpu", weights_only=None):
    """Restores the newest complete checkpoint in ``path`` into the given objects.

    Returns None when there is none (a fresh start), else ``{"step", "epoch", "world_size",
    "extra", "resharded"}`` (resharded: the world size changed since the save).
    ``weights_only`` goes to ``torch.load`` (None: torch's default, True from torch 2.6). What
    bagua writes holds only tensors and plain types, so it loads either way; an ``extra`` of
    other types needs ``weights_only=False`` on torch >= 2.6 (from a checkpoint you trust).
    """
    step = latest_step(path)
    if step is None:
        return None
    world, rank = _world()
    d = os.path.join(path, "step_{}".format(step))
    meta = _load(os.path.join(d, "meta.pt"), "cpu", weights_only)
    same = meta["world_size"] == world
    own = os.path.join(d, "rank_{}.pt".format(rank if same else 0))
    state = _load(own, map_location, weights_only)
    model.load_state_dict(state["model"])
    opts = _as_list(optimizer)
    if len(opts) != len(state["optimizers"]):
        raise ValueError("bagua: the checkpoint holds {} optimizer states, {} optimizers were "
                         "given".format(len(state["optimizers"]), len(opts)))
    for o, s in zip(opts, state["optimizers"]):
        o.load_state_dict(s)
    for sch, s in zip(_as_list(lr_scheduler), state["lr_schedulers"]):
        sch.load_state_dict(s)
    impl = getattr(model, "bagua_algorithm", None)
    if state.get("algorithm") is not None and callable(getattr(impl, "load_state_dict", None)):
        impl.load_state_dict(state["algorithm"])
    ddp = _bagua_ddp(model)
    if ddp is not None and state.get("schedule") is not None:
        # The step counter, and on the same world the algorithm's per-rank state (on another
        # world rank 0's model replaces every rank's, so its replicas start afresh).
        ddp._bagua_restore_schedule(state["schedule"], counter_only=not same)
    if same:
        _set_rng_state(state["rng"])
    else:
        _reseed(seed, step, rank)
    if sampler is not None and meta.get("data") is not None:
        sampler.load_state_dict(meta["data"])
    if not hasattr(save_training_state, "_next"):
        save_training_state._next = {}
    save_training_state._next[path] = step + 1
    _barrier()
    return {"step": step, "epoch": meta["epoch"], "world_size": meta["world_size"],
            "extra": meta["extra"], "resharded": not same}
