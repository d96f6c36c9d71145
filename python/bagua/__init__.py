"""bagua: Bagua's PyTorch API (bagua.torch_api) on the bagua C++ core.

The C++ side is the extension module ``_bagua_ext`` built by the Meson project
(``build/python/``); put it and this package on ``PYTHONPATH``.
"""

__version__ = "0.1.0"
