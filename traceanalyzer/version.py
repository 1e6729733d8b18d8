"""The package's version, set here only: the wheel's, ``--version``'s, and the one every store
and cache key is stamped with (a base module, so any layer reads it without the package's
façade)."""

__version__ = "0.2.0"
