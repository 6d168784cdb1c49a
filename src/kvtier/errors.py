"""Exceptions raised by kvtier.

    KVTierError
    ├── ConfigError        bad configuration: names the offending key or value
    └── TierError          a tier could not do what was asked
        └── TierUnavailable the tier's backing store is gone (directory removed, server down)

Faults on the data path never surface as exceptions to the engine: they are turned into
misses (recompute); a chunk that fails its checks is a per-chunk False, never an
exception. These exceptions are for configuration and for direct users of a tier.
"""

from __future__ import annotations


class KVTierError(Exception):
    """Base class of every kvtier error."""


class ConfigError(KVTierError, ValueError):
    """A configuration key or value is invalid; the message names it and what is accepted."""


class TierError(KVTierError):
    """A tier operation failed."""


class TierUnavailable(TierError):
    """The tier's backing store cannot be reached."""
