"""The trainer of the elastic tests, run by baguarun or torchrun on every rank.

    python elastic_worker.py --ckpt DIR --logs DIR --out FILE [--epochs E] [--samples N]
        [--batch B] [--kill-at-step K] [--step-sleep S] [--balanced]
        [--algorithm gradient_allreduce|decentralized|low_precision_decentralized]

A small regression model with dropout (RNG on the training path), Adam (optimizer state),
gradient all-reduce (or a decentralized algorithm exchanging every 3rd step, whose schedule and
replicas a resume must restore), the ElasticDistributedSampler over a TensorDataset that returns each
sample's index, a DataLoader with two prefetching workers and its own generator. Resumes from
the newest checkpoint in --ckpt and checkpoints after every step. Each process appends to its
own log in --logs: a header line "start <json>" (resume step, world, rank, time) and per step
"step <json>" (global step, epoch, the sample ids it trained on, the loss), written before the
step's checkpoint. --kill-at-step K: every rank SIGKILLs itself after training step K, before
checkpointing it. Rank 0 saves the final state_dict to --out.
"""

import time

PROCESS_START = time.time()  # before torch's import: the restart's cost split in the logs

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

import bagua.torch_api as bagua
from bagua.torch_api.algorithms import decentralized, gradient_allreduce
from bagua.torch_api.checkpoint import load_training_state, save_training_state
from bagua.torch_api.contrib import ElasticDistributedSampler


def dataset(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    w = torch.linspace(-1.0, 1.0, 8)
    y = (x @ w).unsqueeze(1) + 0.05 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y, torch.arange(n))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--logs", required=True)
    p.add_argument("--out", default="")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--kill-at-step", type=int, default=-1)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--balanced", action="store_true")
    p.add_argument("--algorithm", default="gradient_allreduce",
                   choices=["gradient_allreduce", "decentralized", "low_precision_decentralized"])
    p.add_argument("--seed", type=int, default=0, help="data order and dropout seed")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--pace-file", default="",
                   help="seconds to sleep after each step, read from this file when it exists")
    a = p.parse_args()

    bagua.init_process_group()
    rank, world = bagua.get_rank(), bagua.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    if a.algorithm == "decentralized":
        algorithm = decentralized.DecentralizedAlgorithm(
            hierarchical=False, peer_selection_mode="shift_one", communication_interval=3)
    elif a.algorithm == "low_precision_decentralized":
        algorithm = decentralized.LowPrecisionDecentralizedAlgorithm(
            hierarchical=False, communication_interval=3)
    else:
        algorithm = gradient_allreduce.GradientAllReduceAlgorithm()
    model = model.with_bagua([opt], algorithm)
    ds = dataset(a.samples)
    complexities = [int(i * 37 % 11) for i in range(a.samples)] if a.balanced else None
    sampler = ElasticDistributedSampler(a.samples, a.batch, seed=3 + a.seed,
                                        complexities=complexities)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=2,
                                         generator=torch.Generator().manual_seed(5))
    torch.manual_seed(100 + rank + 1000 * a.seed)  # dropout differs per rank
    state = load_training_state(a.ckpt, model, opt, sampler=sampler, seed=11)
    step = state["step"] if state else 0
    start_epoch = state["epoch"] if state else 0
    os.makedirs(a.logs, exist_ok=True)
    log = open(os.path.join(a.logs, "log_{}_{}.txt".format(os.getpid(), time.time_ns())), "a")
    attempt = "{}:{}".format(os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    log.write("start " + json.dumps({"resume": step, "world": world, "rank": rank,
                                     "attempt": attempt, "process_start": PROCESS_START,
                                     "time": time.time(), "resharded": bool(
                                         state and state["resharded"])}) + "\n")
    log.flush()
    model.train()
    for epoch in range(start_epoch, a.epochs):
        sampler.set_epoch(epoch)
        for x, y, ids in sampler.track(loader):
            step += 1
            opt.zero_grad()
            if len(ids) > 0:
                loss = torch.nn.functional.mse_loss(model(x), y)
            else:  # fewer remaining samples than ranks: a zero gradient keeps the step matched
                loss = (model(torch.zeros(1, 8)) * 0.0).sum()
            loss.backward()
            opt.step()
            log.write("step " + json.dumps({"step": step, "epoch": epoch, "ids": ids.tolist(),
                                            "loss": float(loss), "world": world,
                                            "time": time.time()}) + "\n")
            log.flush()
            if step == a.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            save_training_state(a.ckpt, model, opt, sampler=sampler, step=step, epoch=epoch)
            pause = a.step_sleep
            if a.pace_file and os.path.exists(a.pace_file):
                try:
                    pause = float(open(a.pace_file).read().strip() or 0)
                except ValueError:
                    pass
            if pause > 0:
                time.sleep(pause)
        if rank == 0:  # the epoch's end: the whole dataset's loss, no dropout
            model.eval()
            with torch.no_grad():
                x, y, _ = ds.tensors
                full = float(torch.nn.functional.mse_loss(model(x), y))
            model.train()
            log.write("eval " + json.dumps({"epoch": epoch, "loss": full, "step": step}) + "\n")
            log.flush()
    if rank == 0 and a.out:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, a.out)
    log.write("done {}\n".format(step))
    log.close()
    bagua.destroy_process_group() if hasattr(bagua, "destroy_process_group") else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
