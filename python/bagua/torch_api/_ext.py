"""The C++ extension, for the modules of ``bagua.torch_api`` (``bagua/_extension.py`` loads it)."""

from .._extension import ext  # noqa: F401
