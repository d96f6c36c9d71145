"""``python -m bagua.net``: where the Bagua-Net NCCL plugin of this installation is, and the
``NCCL_NET_PLUGIN`` line that makes NCCL load it.

    python -m bagua.net            the plugin's path, then the export line
    python -m bagua.net --path     the path alone (for $(...))
    python -m bagua.net --check    also load the plugin (dlopen, as NCCL does) and list the
                                   ncclNetPlugin_vN entry points it exports; exit 1 if it cannot

Exit status 1, with the reason on stderr, when the plugin is missing or does not load.
"""

import argparse
import ctypes
import sys

import bagua

# The plugin ABI versions NCCL looks for, newest first (NCCL 2.19 .. 2.30 accept v6..v12).
_NET_VERSIONS = (12, 11, 10, 9, 8, 7, 6)


def exported_versions(path):
    """The ncclNetPlugin_vN versions the library at `path` exports, newest first.

    Loads it with RTLD_LOCAL (as NCCL does); raises OSError if it does not load."""
    lib = ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_LOCAL", 0))
    return [v for v in _NET_VERSIONS if hasattr(lib, "ncclNetPlugin_v{}".format(v))]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bagua.net",
        description="Print the path of the Bagua-Net NCCL plugin of this bagua installation and "
        "the NCCL_NET_PLUGIN line that makes NCCL load it.")
    parser.add_argument("--path", action="store_true", help="print the path alone")
    parser.add_argument("--check", action="store_true",
                        help="load the plugin and list the ncclNetPlugin_vN symbols it exports")
    args = parser.parse_args(argv)
    try:
        path = bagua.net_plugin_path()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    if args.path:
        print(path)
    else:
        print("bagua {} Bagua-Net plugin: {}".format(getattr(bagua, "__version__", "?"), path))
        print("export NCCL_NET_PLUGIN={}".format(path))
    if args.check:
        try:
            versions = exported_versions(path)
        except OSError as e:
            print("bagua.net: {} does not load: {}".format(path, e), file=sys.stderr)
            return 1
        if not versions:
            print("bagua.net: {} exports no ncclNetPlugin_v{}..v{}".format(
                path, _NET_VERSIONS[-1], _NET_VERSIONS[0]), file=sys.stderr)
            return 1
        print("loads: exports {}".format(
            ", ".join("ncclNetPlugin_v{}".format(v) for v in versions)),
            file=sys.stderr if args.path else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
