"""Elastic runs on torchrun: faster detection of a lost node by the c10d rendezvous.

torch's DynamicRendezvousHandler drops a node from the rendezvous state only after its
keep-alive has been silent for keep_alive_interval x keep_alive_max_attempt (fixed at 5 s x 3
in torch 1.13 and 2.x), and once a round has its minimum number of nodes it waits
last_call_timeout (default 30 s) for more. After a node dies the survivors thus wait about
45 s before they train again. ``python -m bagua.distributed.run`` registers a "c10d" handler
that reads two more ``--rdzv_conf`` keys, ``keep_alive_interval`` (seconds, default here 2) and
``keep_alive_max_attempt`` (default 3), and defaults ``last_call_timeout`` to 5 s when the
user did not set it: a lost node is dropped after about 6 s and the survivors' round completes
5 s later. Users who want torch's values pass them in --rdzv_conf.

Only this launcher process is affected (the agent); the workers are separate processes.
"""

import warnings
from datetime import timedelta

KEEP_ALIVE_INTERVAL_S = 2
KEEP_ALIVE_MAX_ATTEMPT = 3
LAST_CALL_TIMEOUT_S = 5


def default_rdzv_conf(conf):
    """``conf`` (torchrun's --rdzv_conf text) with bagua's defaults for the keys it lacks."""
    keys = {kv.split("=", 1)[0].strip() for kv in conf.split(",") if "=" in kv}
    extra = []
    if "last_call_timeout" not in keys:
        extra.append("last_call_timeout={}".format(LAST_CALL_TIMEOUT_S))
    if "keep_alive_interval" not in keys:
        extra.append("keep_alive_interval={}".format(KEEP_ALIVE_INTERVAL_S))
    if "keep_alive_max_attempt" not in keys:
        extra.append("keep_alive_max_attempt={}".format(KEEP_ALIVE_MAX_ATTEMPT))
    return ",".join([c for c in [conf.strip()] if c] + extra)


def _positive(params, key, default):
    v = params.get_as_int(key, default)
    if v is None or v < 1:
        raise ValueError("bagua: --rdzv_conf {}={!r}: expected an integer >= 1".format(key, v))
    return v


def _create_c10d_handler(params):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    interval = _positive(params, "keep_alive_interval", KEEP_ALIVE_INTERVAL_S)
    attempts = _positive(params, "keep_alive_max_attempt", KEEP_ALIVE_MAX_ATTEMPT)
    backend, store = create_backend(params)
    handler = dr.create_handler(store, backend, params)
    try:
        s = handler._settings
        settings = dr.RendezvousSettings(s.run_id, s.min_nodes, s.max_nodes, s.timeout,
                                         keep_alive_interval=timedelta(seconds=interval),
                                         keep_alive_max_attempt=attempts)
        return dr.DynamicRendezvousHandler(handler._this_node, settings, backend.name, store,
                                           dr._BackendRendezvousStateHolder(backend, settings))
    except (AttributeError, TypeError) as e:  # another torch's internals: keep its handler
        warnings.warn("bagua: this torch's rendezvous handler cannot take keep_alive_interval "
                      "({}); using torch's keep-alive".format(e))
        return handler


def install():
    """Makes "c10d" this module's handler in this process (idempotent)."""
    from torch.distributed.elastic.rendezvous import registry

    registry.handler_registry._registry["c10d"] = _create_c10d_handler
