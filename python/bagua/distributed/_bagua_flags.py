"""What both launchers share: Bagua's own flags and the environment they set for the workers.

Both launchers turn their command line into ``torch.distributed.run``'s and call its ``run``:
the elastic agent starts and watches the workers and sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT; bagua.init_process_group rendezvouses
through the agent's store (no second port). Bagua's flags become environment variables the
workers inherit:

    --default_bucket_size B      BAGUA_DEFAULT_BUCKET_SIZE (with_bagua's bucket size, bytes)
    --enable_bagua_net           NCCL_NET_PLUGIN = our Bagua-Net plugin (bagua.net_plugin_path())
    --autotune_level L           BAGUA_AUTOTUNE (read by the C++ autotune library; the Python
    --autotune_max_samples ...   front end does not autotune: python/README.md)
    --bagua_service_port P       BAGUA_SERVICE_PORT (accepted; no autotune service here)
    --report_metrics             BAGUA_REPORT_METRICS=1

The job key: a single-node launch without BAGUA_JOB_KEY or BAGUA_JOB_KEY_FILE in the environment
gives its workers a fresh random BAGUA_JOB_KEY (``job_key_env``), which bagua's TCP store, the
host backend's connection set-up and its heartbeats authenticate with (core/README.md,
"Security"). A launch over several nodes needs the user's key, the same on every node.
"""

import os
import secrets
import warnings

from .. import _catalogue


def add_bagua_flags(parser):
    """Bagua's launcher flags; each default is its variable's in the catalogues (bagua-params)."""
    d = _catalogue.default
    g = parser.add_argument_group("Bagua")
    g.add_argument("--bagua_service_port", type=int, default=d("BAGUA_SERVICE_PORT"),
                   help="Bagua's autotune service port (BAGUA_SERVICE_PORT; accepted for "
                        "compatibility, unused)")
    g.add_argument("--autotune_level", type=int, default=d("BAGUA_AUTOTUNE"),
                   help="BAGUA_AUTOTUNE for the C++ autotune library (0: off)")
    g.add_argument("--is_output_autotune_log", action="store_true",
                   default=d("BAGUA_IS_OUTPUT_AUTOTUNE_LOG"))
    g.add_argument("--report_metrics", action="store_true", default=d("BAGUA_REPORT_METRICS"))
    g.add_argument("--autotune_max_samples", type=int, default=d("BAGUA_AUTOTUNE_MAX_SAMPLES"))
    g.add_argument("--autotune_sampling_confidence_time", type=float,
                   default=d("BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S"))
    g.add_argument("--autotune_warmup_time", type=float, default=d("BAGUA_AUTOTUNE_WARMUP_TIME_S"))
    g.add_argument("--default_bucket_size", type=int, default=None,
                   help="bucket size in bytes (BAGUA_DEFAULT_BUCKET_SIZE; unset: with_bagua's "
                        "default, {} bytes; Bagua's launchers set 10 MiB)".format(
                            d("BAGUA_DEFAULT_BUCKET_SIZE")))
    g.add_argument("--enable_bagua_net", action="store_true", default=False,
                   help="NCCL uses our Bagua-Net network plugin (sets NCCL_NET_PLUGIN)")
    g.add_argument("--host_list", type=str, default=None,
                   help="accepted for compatibility; to start on several hosts over SSH, use "
                        "baguarun --host_list H1,H2 (tools/README.md)")
    g.add_argument("--ssh_port", type=int, default=None, help="see --host_list")
    return parser


def bagua_net_plugin():
    """Path of the Bagua-Net NCCL plugin of this installation (bagua.net_plugin_path(): inside
    the installed package, or build/python/bagua in a build tree), or None."""
    import bagua
    try:
        return bagua.net_plugin_path()
    except FileNotFoundError:
        return None


def bagua_env(args):
    """The variables Bagua's flags set for the workers."""
    e = {
        "BAGUA_SERVICE_PORT": str(args.bagua_service_port),
        "BAGUA_AUTOTUNE": str(args.autotune_level),
        "BAGUA_AUTOTUNE_MAX_SAMPLES": str(args.autotune_max_samples),
        "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S": str(args.autotune_sampling_confidence_time),
        "BAGUA_AUTOTUNE_WARMUP_TIME_S": str(args.autotune_warmup_time),
        "BAGUA_IS_OUTPUT_AUTOTUNE_LOG": str(int(args.is_output_autotune_log)),
    }
    if args.default_bucket_size is not None:
        e["BAGUA_DEFAULT_BUCKET_SIZE"] = str(args.default_bucket_size)
    if args.report_metrics:
        e["BAGUA_REPORT_METRICS"] = "1"
    if args.enable_bagua_net:
        plugin = bagua_net_plugin()
        if plugin is None:
            raise SystemExit("bagua: --enable_bagua_net: the Bagua-Net plugin (libnccl-net.so) "
                             "is not in the bagua package (python -m bagua.net says where it "
                             "looked); build net_plugin/ or set NCCL_NET_PLUGIN yourself")
        e["NCCL_NET_PLUGIN"] = plugin
    if args.host_list or args.ssh_port:
        warnings.warn("bagua: --host_list / --ssh_port are not used by this launcher (run it "
                      "on every node, or start every node over SSH with baguarun --host_list)")
    return e


def job_key_env(single_node):
    """``{"BAGUA_JOB_KEY": <64 random hex digits>}`` for a single-node launch whose environment
    has no key (nor key file); else ``{}`` (the user's key passes through; on several nodes each
    launcher would make a different one)."""
    if not single_node or _catalogue.value("BAGUA_JOB_KEY") or \
            _catalogue.value("BAGUA_JOB_KEY_FILE"):
        return {}
    return {"BAGUA_JOB_KEY": secrets.token_hex(32)}


def single_node(nnodes):
    """True when torchrun's ``--nnodes`` ("N" or "MIN:MAX") allows one node only."""
    text = str(nnodes)
    return text.split(":")[-1].strip() == "1"


def _fix_std_parsing():
    """Debian's torch 1.13 on Python 3.11: ``Std.from_str("0")`` returns None (iterating an
    IntFlag no longer yields NONE), so torchrun's default ``--redirects 0`` crashes the agent.
    Map a plain number to ``Std(n)`` when torch's parser gives None (in this process only)."""
    from torch.distributed.elastic.multiprocessing import api

    orig = api.Std.from_str.__func__
    if getattr(orig, "_bagua_fixed", False) or orig(api.Std, "0") is not None:
        return

    def from_str(cls, vm):
        got = orig(cls, vm)
        if got is None and vm.strip().isdigit():
            return cls(int(vm))
        if isinstance(got, dict):
            return {k: (v if v is not None else cls.NONE) for k, v in got.items()}
        return got

    from_str._bagua_fixed = True
    api.Std.from_str = classmethod(from_str)


def launch(torch_args, extra_env):
    """Runs torch.distributed.run with ``torch_args`` (its namespace) and ``extra_env`` for the
    workers; returns the exit status (1 when a worker failed, after the agent's report)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed import run as torchrun

    os.environ.update(extra_env)
    _fix_std_parsing()
    try:
        torchrun.run(torch_args)
    except ChildFailedError as e:
        import sys

        sys.stderr.write(str(e) + "\n")
        failures = getattr(e, "failures", {}) or {}
        what = ", ".join("rank {} exited with code {}".format(r, f.exitcode)
                         for r, f in sorted(failures.items())) or "a worker failed"
        print("bagua: FAILED: {}".format(what), file=sys.stderr, flush=True)
        return 1
    return 0
