"""Bagua's checkpoint layout: ``save_checkpoint`` / ``load_checkpoint``.

    <checkpoints_path>/latest_checkpointed_iteration.txt      the iteration (or "release")
    <checkpoints_path>/iter_0000042/mp_rank_00_model_states.pt  {"iteration", "model",
                                                                  "optimizer", "lr_scheduler"}

Rank 0 writes (the ranks of a data-parallel job hold the same weights); every rank reads.
Both end with a ``torch.distributed`` barrier when it is initialised (init_process_group
initialises it). Bagua's mixture-of-experts sharding is not supported (no ``moe`` here).
"""

import logging
import os

import torch
import torch.distributed as dist

__all__ = ["save_checkpoint", "load_checkpoint"]


def _tracker(path):
    return os.path.join(path, "latest_checkpointed_iteration.txt")


def _model_file(path, iteration, release=False, mp_rank=0):
    d = "release" if release else "iter_{:07d}".format(iteration)
    return os.path.join(path, d, "mp_rank_{:02d}_model_states.pt".format(mp_rank))


def _rank0():
    return not dist.is_initialized() or dist.get_rank() == 0


def save_checkpoint(iteration, checkpoints_path, model, optimizer=None, lr_scheduler=None):
    """Saves the model (and optimizer, LR scheduler) state at ``iteration``."""
    if _rank0():
        state = {"iteration": iteration, "model": model.state_dict()}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        if lr_scheduler is not None:
            state["lr_scheduler"] = lr_scheduler.state_dict()
        name = _model_file(checkpoints_path, iteration)
        os.makedirs(os.path.dirname(name), exist_ok=True)
        torch.save(state, name)
        with open(_tracker(checkpoints_path), "w") as f:
            f.write(str(iteration))
        logging.info("bagua: saved checkpoint of iteration %d to %s", iteration, name)
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(checkpoints_path, model, optimizer=None, lr_scheduler=None, strict=True):
    """Loads the latest checkpoint into the given objects; returns its iteration (0 when
    there is none)."""
    tracker = _tracker(checkpoints_path)
    if not os.path.isfile(tracker):
        logging.warning("bagua: no checkpoint metadata file %s", tracker)
        return 0
    with open(tracker) as f:
        text = f.read().strip()
    release = text == "release"
    try:
        iteration = 0 if release else int(text)
    except ValueError:
        raise ValueError("bagua: invalid checkpoint metadata {!r} in {}".format(text, tracker))
    if iteration < 0:
        raise ValueError("bagua: invalid checkpoint iteration {} in {}".format(iteration, tracker))
    state = torch.load(_model_file(checkpoints_path, iteration, release), map_location="cpu")
    model.load_state_dict(state["model"], strict=strict)
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if lr_scheduler is not None and "lr_scheduler" in state:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    if dist.is_initialized():
        dist.barrier()
    return iteration
