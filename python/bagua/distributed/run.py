"""``python -m bagua.distributed.run``: torchrun's flags (``--nnodes MIN:MAX``, ``--rdzv_*``,
``--standalone``, ``--max_restarts``, ...) plus Bagua's (_bagua_flags.py), on
``torch.distributed.run``. Elastic behaviour is torchrun's."""

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
    return _bagua_flags.launch(args, env)


if __name__ == "__main__":
    sys.exit(main())
