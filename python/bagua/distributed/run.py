"""``python -m bagua.distributed.run``: torchrun's flags (``--nnodes MIN:MAX``, ``--rdzv_*``,
``--standalone``, ``--max_restarts``, ...) plus Bagua's (_bagua_flags.py), on
``torch.distributed.run``. Elastic behaviour is torchrun's, with a faster c10d rendezvous after
a node is lost (_elastic.py: keep-alive and last-call defaults, settable in --rdzv_conf)."""

import sys

from . import _bagua_flags


def parse_args(argv):
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    parser.description = "Bagua launcher: torch.distributed.run's flags plus Bagua's"
    _bagua_flags.add_bagua_flags(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = _bagua_flags.bagua_env(args)
    env.update(_bagua_flags.job_key_env(args.standalone or _bagua_flags.single_node(args.nnodes)))
    if args.rdzv_backend == "c10d" and not args.standalone:
        # Faster loss detection and re-rendezvous (_elastic.py); --rdzv_conf overrides.
        from . import _elastic

        args.rdzv_conf = _elastic.default_rdzv_conf(args.rdzv_conf)
        _elastic.install()
    return _bagua_flags.launch(args, env)


if __name__ == "__main__":
    sys.exit(main())
