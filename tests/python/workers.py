"""Worker functions run by harness.run in separate processes (one per rank): ``python workers.py
<function> <outdir> <json-args>``. The functions live by theme in workers_comm.py,
workers_training.py and workers_dropin.py (registered in worker_base.WORKERS when imported);
``bundle`` runs several in one process group."""

import json
import os
import sys
import time

import torch

import bagua.torch_api as bagua
from worker_base import WORKERS, _default_group_ops, worker
import workers_dropin  # noqa: F401  (registers its workers)
import workers_training  # noqa: F401
from workers_comm import comm_basic


@worker
def bundle(a):
    """Several scenarios in one process group (one launch: torch's import dominates). After each
    training scenario every rank must have run as many operations on the default group as the
    others (a rank with one collective more or less pairs the later ones wrongly: a hang, or a
    barrier that passes on one rank only); each rank's progress goes to stderr (shown when a
    test fails)."""
    out = {}
    what = "operations on the default group (host global, intra; nccl global, intra)"
    t0, before = time.monotonic(), None
    for name, item in a["items"].items():
        out[name] = WORKERS[item["func"]](item.get("args", {}))
        if not bagua.is_initialized() or bagua.get_world_size() < 2:
            continue
        now = _default_group_ops()
        # The first scenario's count includes the init's.
        ran = [x - y for x, y in zip(now, before or [0] * len(now))]
        print("[rank {}] {:.1f} s: {} done, {} {}".format(
            bagua.get_rank(), time.monotonic() - t0, name, what, ran), file=sys.stderr, flush=True)
        every = bagua.communication.allgather_object(ran)
        before = _default_group_ops()  # the allgather itself left out
        if item["func"] == "train" and any(r != every[0] for r in every):
            raise AssertionError("{}: the ranks ran different numbers of {}: {}".format(
                name, what, every))
    return out


@worker
def launched(a):
    """comm_basic plus what the launcher gave this worker (Bagua's launchers' tests)."""
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                          "NODE_RANK", "BAGUA_DEFAULT_BUCKET_SIZE",
                                          "BAGUA_AUTOTUNE", "NCCL_NET_PLUGIN")}
    before = (bagua.get_rank(), bagua.get_local_rank(), bagua.get_world_size(),
              bagua.get_local_size())  # before init: from the launcher's variables
    out = comm_basic(a)
    out.update({"env": env, "before": before, "local_rank_arg": LOCAL_RANK_ARG})
    return out


LOCAL_RANK_ARG = None


def main():
    global LOCAL_RANK_ARG
    argv = sys.argv[1:]
    if argv and argv[0].startswith("--local_rank="):  # bagua.distributed.launch --set_additional_flag
        LOCAL_RANK_ARG = int(argv.pop(0).split("=", 1)[1])
    func, out, args = argv[0], argv[1], json.loads(argv[2])
    result = WORKERS[func](args)
    torch.save(result, os.path.join(out, "rank{}.pt".format(os.environ.get("RANK", "0"))))
    if bagua.is_initialized():
        bagua.barrier()


if __name__ == "__main__":
    main()
