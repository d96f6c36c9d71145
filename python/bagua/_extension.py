"""Loads the C++ extension ``_bagua_ext`` with an actionable error when it is missing (without
importing torch: the launchers' configuration reads it too)."""

try:
    import _bagua_ext as ext  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "bagua: the C++ extension _bagua_ext is not importable ({}). Build the Meson project "
        "(it builds python/_bagua_ext*.so when Python headers and pybind11 are found) and add "
        "<build>/python to PYTHONPATH.".format(e)
    ) from e
