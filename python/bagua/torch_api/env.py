"""The Python front end's parameter catalogue: the launchers' variables and Bagua's knobs, read
with Bagua's names and defaults (``bagua.torch_api.env`` in Bagua). Every environment read of
the package goes through here. The C++ core reads its own catalogue (``bagua-params``)."""

import os
import socket


def _int_env(key, default):
    v = os.environ.get(key)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError("{}={!r} is not an integer".format(key, v))


def _float_env(key, default):
    v = os.environ.get(key)
    if v is None or v == "":
        return default
    try:
        return float(v)
    except ValueError:
        raise ValueError("{}={!r} is not a number".format(key, v))


def get_world_size():
    """WORLD_SIZE (default 1)."""
    return _int_env("WORLD_SIZE", 1)


def get_rank():
    """RANK (default 0)."""
    return _int_env("RANK", 0)


def get_local_rank():
    """LOCAL_RANK (default 0)."""
    return _int_env("LOCAL_RANK", 0)


def get_local_size():
    """LOCAL_WORLD_SIZE (default 1, as in Bagua)."""
    return _int_env("LOCAL_WORLD_SIZE", 1)


def _is_elastic_launched():
    """True under torchrun / ``python -m bagua.distributed.run`` (they set GROUP_RANK)."""
    return {"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}.issubset(os.environ.keys())


def get_node_rank():
    """GROUP_RANK under an elastic launcher, else NODE_RANK (default 0)."""
    if _is_elastic_launched():
        return _int_env("GROUP_RANK", 0)
    return _int_env("NODE_RANK", 0)


def get_restart_count():
    """TORCHELASTIC_RESTART_COUNT (default 0): how many times torchrun restarted this node's
    workers (failures only; a membership change restarts without counting, and a node that
    joins later starts at 0, so it is not the same on every node)."""
    return _int_env("TORCHELASTIC_RESTART_COUNT", 0)


def get_master_addr():
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


#: with_bagua's bucket size when BAGUA_DEFAULT_BUCKET_SIZE is unset (Bagua's was 10 MiB).
DEFAULT_BUCKET_SIZE = 25 * 1024 ** 2


def get_default_bucket_size():
    """BAGUA_DEFAULT_BUCKET_SIZE in bytes: the wrapper's bucket size. Default 25 MiB, torch DDP's
    bucket_cap_mb, where Bagua had 10 MiB: on 4 H200 over Bagua-Net, in one run, GPT-2 small
    trained at 0.77x torch DDP's speed with 10 MiB buckets and 0.99x with 25 MiB (ResNet-50:
    1.06x, 1.12x); bench/RESULTS.md, 2026-11-26. BAGUA_DEFAULT_BUCKET_SIZE=10485760 restores
    Bagua's."""
    return _int_env("BAGUA_DEFAULT_BUCKET_SIZE", DEFAULT_BUCKET_SIZE)


def get_bagua_service_port():
    """BAGUA_SERVICE_PORT (Bagua's autotune service; -1: none). Accepted for compatibility: the
    autotuner here is the C++ autotune library, which needs no service port."""
    return _int_env("BAGUA_SERVICE_PORT", -1)


def is_report_metrics_switch_on():
    return _int_env("BAGUA_REPORT_METRICS", 0) == 1


def get_autotune_level():
    return _int_env("BAGUA_AUTOTUNE", 0)


def get_autotune_max_samples():
    return _int_env("BAGUA_AUTOTUNE_MAX_SAMPLES", 60)


def get_autotune_sampling_confidence_time_s():
    return _float_env("BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S", 5.0)


def get_autotune_warmup_time_s():
    return _float_env("BAGUA_AUTOTUNE_WARMUP_TIME_S", 30.0)


def get_is_output_autotune_log():
    return bool(_int_env("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", 0))


def get_autotune_server_wait_time():
    return _int_env("BAGUA_AUTOTUNE_SERVER_WAIT_TIME", 300)


def find_free_network_port():
    """A free TCP port on this host (bound then released: another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen(1)
        return s.getsockname()[1]
