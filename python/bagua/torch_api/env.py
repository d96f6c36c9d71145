"""The launchers' variables and Bagua's knobs with Bagua's getter names
(``bagua.torch_api.env`` in Bagua), read through the C++ parameter catalogues
(``bagua/_catalogue.py``): the same defaults, strict parsing and error text as the C++ libraries,
and ``bagua-params`` lists every variable read here.

Where the defaults differ from Bagua's Python ones:

- ``LOCAL_WORLD_SIZE`` unset: the whole world is on this node (the core's -1, torchrun's meaning
  of a single-node job), where Bagua answered 1; ``LOCAL_RANK`` unset: ``RANK`` modulo the local
  size, where Bagua answered 0. Every launcher sets both; the difference shows only in a script
  started by hand with RANK and WORLD_SIZE alone, which Bagua told it was one rank per node on
  device 0, and the core (``init_process_group``) took as one node.
- ``BAGUA_DEFAULT_BUCKET_SIZE``: 25 MiB (torch DDP's ``bucket_cap_mb``) where Bagua had 10 MiB.
- ``BAGUA_IS_OUTPUT_AUTOTUNE_LOG=0`` is off (Bagua took any non-empty text as on).
- ``BAGUA_AUTOTUNE_SERVER_WAIT_TIME`` is a number of seconds that may have a fraction (float).
"""

import socket

from .. import _catalogue


def get_world_size():
    """WORLD_SIZE (default 1)."""
    return _catalogue.value("WORLD_SIZE")


def get_rank():
    """RANK (default 0)."""
    return _catalogue.value("RANK")


def get_local_size():
    """LOCAL_WORLD_SIZE; unset (-1): WORLD_SIZE, every rank on this node."""
    n = _catalogue.value("LOCAL_WORLD_SIZE")
    return get_world_size() if n < 0 else n


def get_local_rank():
    """LOCAL_RANK; unset (-1): RANK modulo the local size."""
    r = _catalogue.value("LOCAL_RANK")
    if r >= 0:
        return r
    n = get_local_size()
    return get_rank() % n if n > 0 else 0


def _is_elastic_launched():
    """True under torchrun / ``python -m bagua.distributed.run`` (they set GROUP_RANK)."""
    return all(_catalogue.is_set(k) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK",
                                               "LOCAL_WORLD_SIZE"))


def get_node_rank():
    """GROUP_RANK under an elastic launcher, else NODE_RANK (default 0)."""
    if _is_elastic_launched():
        return _catalogue.value("GROUP_RANK")
    return _catalogue.value("NODE_RANK")


def get_restart_count():
    """TORCHELASTIC_RESTART_COUNT (default 0): how many times torchrun restarted this node's
    workers (failures only; a membership change restarts without counting, and a node that
    joins later starts at 0, so it is not the same on every node)."""
    return _catalogue.value("TORCHELASTIC_RESTART_COUNT")


def get_master_addr():
    """MASTER_ADDR (default 127.0.0.1)."""
    return _catalogue.value("MASTER_ADDR")


def get_master_port():
    """MASTER_PORT (default 29500)."""
    return _catalogue.value("MASTER_PORT")


def _is_set(key):
    """Whether the environment sets ``key`` (a catalogue knob)."""
    return _catalogue.is_set(key)


#: with_bagua's bucket size when BAGUA_DEFAULT_BUCKET_SIZE is unset (Bagua's was 10 MiB).
DEFAULT_BUCKET_SIZE = _catalogue.default("BAGUA_DEFAULT_BUCKET_SIZE")


def get_default_bucket_size():
    """BAGUA_DEFAULT_BUCKET_SIZE in bytes (a K/M/G suffix is accepted): the wrapper's bucket
    size. Default 25 MiB, torch DDP's bucket_cap_mb, where Bagua had 10 MiB (bench/RESULTS.md,
    "Bucket size"); BAGUA_DEFAULT_BUCKET_SIZE=10485760 restores Bagua's."""
    return _catalogue.value("BAGUA_DEFAULT_BUCKET_SIZE")


def get_bagua_service_port():
    """BAGUA_SERVICE_PORT (Bagua's autotune service; -1: none). Accepted for compatibility: the
    autotuner here is the C++ autotune library, which needs no service port."""
    return _catalogue.value("BAGUA_SERVICE_PORT")


def is_report_metrics_switch_on():
    return _catalogue.value("BAGUA_REPORT_METRICS")


def get_autotune_level():
    return _catalogue.value("BAGUA_AUTOTUNE")


def get_autotune_max_samples():
    return _catalogue.value("BAGUA_AUTOTUNE_MAX_SAMPLES")


def get_autotune_sampling_confidence_time_s():
    return _catalogue.value("BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S")


def get_autotune_warmup_time_s():
    return _catalogue.value("BAGUA_AUTOTUNE_WARMUP_TIME_S")


def get_is_output_autotune_log():
    return _catalogue.value("BAGUA_IS_OUTPUT_AUTOTUNE_LOG")


def get_autotune_server_wait_time():
    return _catalogue.value("BAGUA_AUTOTUNE_SERVER_WAIT_TIME")


def find_free_network_port():
    """A free TCP port on this host (bound then released: another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen(1)
        return s.getsockname()[1]
