"""The package's one way to read its configuration: every environment variable bagua's Python
code reads is a knob of a C++ parameter catalogue (``bagua-params`` lists them all), read here
through the extension (``_bagua_ext.param``) with that knob's parser, validator and default.

A bad value raises ``_bagua_ext.InvalidArgumentError`` (a ``ValueError``) with the catalogue's
message, the one the C++ libraries give: ``RANK='abc' is invalid ('abc' is not an integer);
accepted: an integer in [0, 1048576]``. An empty value is a bad value for a number, as in C++.

Each call reads the environment as it is at that moment, as Bagua's getters did (a script may
set ``os.environ`` before ``init_process_group``; ``init_process_group(rank=...)`` sets RANK
itself). The C++ libraries read a knob once, at its first use, and keep that value.
``tests/python/test_config.py`` fails if the package reads a variable any other way.
"""

from ._extension import ext


def value(key):
    """The knob's value (bool, int, float or str; a byte size as an int)."""
    return ext.param(key)[0]


def is_set(key):
    """True when the environment gives the knob a (valid) value."""
    return ext.param(key)[1] == "environment"


def default(key):
    """The knob's default, as its catalogue declares it."""
    return ext.param(key)[2]
