"""bagua: Bagua's PyTorch API (bagua.torch_api) on the bagua C++ core.

Installed (``pip install .``), everything sits in this package: the C++ extension ``_bagua_ext``
next to it, ``_version.py`` and the Bagua-Net NCCL plugin ``libnccl-net.so`` inside it (with a copy
named ``libnccl-net-bagua.so``, what ``NCCL_NET_PLUGIN=bagua`` finds on ``LD_LIBRARY_PATH``). From a
build tree, put the package and the build's ``python`` folder on ``PYTHONPATH``
(``PYTHONPATH=python:build/python``): Meson writes the same two files into ``build/python/bagua``,
which ``pkgutil.extend_path`` joins to this package.
"""

from pkgutil import extend_path as _extend_path

__path__ = _extend_path(__path__, __name__)

try:
    from bagua._version import __version__  # written by Meson from meson.build's project version
except ImportError:  # the source tree without its build folder on sys.path
    pass

_PLUGIN_NAME = "libnccl-net.so"


def __getattr__(name):
    if name == "__version__":
        raise AttributeError(
            "bagua.__version__: bagua/_version.py was not found in {}; it is written by the Meson "
            "build (add <build>/python to PYTHONPATH) or installed with the package "
            "(pip install .)".format(list(__path__)))
    raise AttributeError("module 'bagua' has no attribute '{}'".format(name))


def net_plugin_path():
    """The absolute path of the Bagua-Net NCCL net plugin that belongs to this package.

    NCCL loads it with ``NCCL_NET_PLUGIN=<this path>`` (``python -m bagua.net`` prints the line).
    Raises FileNotFoundError, naming the folders searched, if the package has no plugin (a build
    without the plugin, or the source tree without its build folder on sys.path).
    """
    import os
    for d in __path__:
        p = os.path.join(d, _PLUGIN_NAME)
        if os.path.isfile(p):
            return os.path.abspath(p)
    raise FileNotFoundError(
        "bagua.net_plugin_path(): no {} in {} (pip install . puts it inside the package; from a "
        "build tree, add <build>/python to PYTHONPATH)".format(_PLUGIN_NAME, list(__path__)))
