"""``python -m bagua.net``: where the Bagua-Net NCCL plugin of this installation is, and the
``NCCL_NET_PLUGIN`` line that makes NCCL load it.

    python -m bagua.net            the plugin's path, then the export line
    python -m bagua.net --path     the path alone (for $(...))
    python -m bagua.net --check    also validate every Bagua-Net setting of the environment
                                   (BAGUA_NET_*, NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY) with the
                                   plugin's own parsers, load the plugin (dlopen, as NCCL does)
                                   and list the ncclNetPlugin_vN entry points it exports

Exit status 1, with one line per problem on stderr, when a setting is invalid (the line names
the variable, its value and what it accepts), or the plugin is missing or does not load.

The package also holds the plugin as ``libnccl-net-bagua.so`` (a copy: wheels keep no symbolic
links), the name NCCL derives from ``NCCL_NET_PLUGIN=bagua``; NCCL looks that name up on the
loader's path, so that form needs the package folder on ``LD_LIBRARY_PATH``. The full path
printed here needs nothing else.
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


def setting_errors():
    """One line per invalid Bagua-Net setting in this process's environment (empty if all are
    valid), from the plugin's parameter catalogues in the extension (_bagua_ext.check_net_params):
    each names the variable, its value and what it accepts."""
    try:
        import _bagua_ext
    except ImportError as e:
        return ["the settings cannot be checked: the extension _bagua_ext does not import ({})"
                .format(e)]
    return list(_bagua_ext.check_net_params())


def settings_from_environment():
    """The Bagua-Net settings this process takes from its environment, as "KEY=value"."""
    import _bagua_ext
    return ["{}={}".format(p["key"], p["value"]) for p in _bagua_ext.net_params()
            if p["source"] == "environment" and p["error"] is None]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bagua.net",
        description="Print the path of the Bagua-Net NCCL plugin of this bagua installation and "
        "the NCCL_NET_PLUGIN line that makes NCCL load it.")
    parser.add_argument("--path", action="store_true", help="print the path alone")
    parser.add_argument("--check", action="store_true",
                        help="validate every Bagua-Net setting of the environment (BAGUA_NET_*, "
                        "NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY), load the plugin and list the "
                        "ncclNetPlugin_vN symbols it exports")
    args = parser.parse_args(argv)
    if args.check:
        errors = setting_errors()
        for e in errors:
            print("bagua.net: {}".format(e), file=sys.stderr)
        if errors:
            return 1
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
        out = sys.stderr if args.path else sys.stdout
        print("loads: exports {}".format(
            ", ".join("ncclNetPlugin_v{}".format(v) for v in versions)), file=out)
        given = settings_from_environment()
        print("settings: valid ({})".format(
            "from the environment: " + ", ".join(given) if given else "all defaults"), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
