"""Environment helpers with Bagua's names (torchrun / baguarun variables)."""

import os


def _int_env(key, default):
    v = os.environ.get(key)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError("{}={!r} is not an integer".format(key, v))


def get_world_size():
    return _int_env("WORLD_SIZE", 1)


def get_rank():
    return _int_env("RANK", 0)


def get_local_rank():
    return _int_env("LOCAL_RANK", 0)


def get_local_size():
    return _int_env("LOCAL_WORLD_SIZE", get_world_size())


def get_node_rank():
    return get_rank() // max(1, get_local_size())


def get_master_addr():
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


def get_default_bucket_size():
    return _int_env("BAGUA_DEFAULT_BUCKET_SIZE", 10 * 1024 ** 2)
