"""``python -m bagua.distributed.launch``: Bagua's static launcher (every node runs it with
``--nnodes``, ``--node_rank``, ``--nproc_per_node``, ``--master_addr``, ``--master_port``),
on ``torch.distributed.run`` with a static rendezvous.

Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and
MASTER_PORT, plus Bagua's variables (_bagua_flags.py). ``--set_additional_flag`` passes
``--local_rank=N`` to the script, ``-m`` / ``--no_python`` as in Bagua. ``--logdir D``: each
worker's stdout and stderr go to files under D (torchrun's layout,
``D/<run id>/attempt_0/<local rank>/stdout.log``, not Bagua's file names).
"""

import argparse
import sys

from .. import _catalogue
from . import _bagua_flags


def parser():
    p = argparse.ArgumentParser(
        description="Bagua's launcher: spawns --nproc_per_node workers on this node")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node_rank", type=int, default=_catalogue.default("NODE_RANK"))
    p.add_argument("--nproc_per_node", type=int, default=1)
    p.add_argument("--master_addr", type=str, default=_catalogue.default("MASTER_ADDR"))
    p.add_argument("--master_port", type=int, default=_catalogue.default("MASTER_PORT"))
    p.add_argument("--set_additional_flag", action="store_true", default=False,
                   help="pass --local_rank=N to the script")
    p.add_argument("-m", "--module", action="store_true", default=False)
    p.add_argument("--no_python", action="store_true", default=False)
    p.add_argument("--logdir", type=str, default=None)
    _bagua_flags.add_bagua_flags(p)
    p.add_argument("training_script", type=str)
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def torch_argv(args):
    """torch.distributed.run's command line for Bagua's static flags."""
    argv = ["--nnodes", str(args.nnodes), "--node_rank", str(args.node_rank),
            "--nproc_per_node", str(args.nproc_per_node), "--master_addr", args.master_addr,
            "--master_port", str(args.master_port), "--rdzv_backend", "static"]
    if args.module:
        argv.append("--module")
    if args.no_python:
        argv.append("--no_python")
    if args.logdir:
        argv += ["--log_dir", args.logdir, "--redirects", "3"]
    argv.append(args.training_script)
    script_args = list(args.training_script_args)
    if args.set_additional_flag:
        # torch's agent replaces the macro with each worker's local rank.
        from torch.distributed.elastic.utils import macros

        script_args.insert(0, "--local_rank={}".format(macros.local_rank))
    return argv + script_args


def main(argv=None):
    from torch.distributed import run as torchrun

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.module and args.no_python:
        raise SystemExit("Don't use both the '--no_python' flag and the '--module' flag at the "
                         "same time.")
    env = _bagua_flags.bagua_env(args)
    env.update(_bagua_flags.job_key_env(args.nnodes == 1))
    env["NODE_RANK"] = str(args.node_rank)
    targs = torchrun.get_args_parser().parse_args(torch_argv(args))
    return _bagua_flags.launch(targs, env)


if __name__ == "__main__":
    sys.exit(main())
