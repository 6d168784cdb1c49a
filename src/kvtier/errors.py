"""Exceptions raised by kvtier.

    KVTierError
    ├── ConfigError        bad configuration: names the offending key or value
    └── TierError          a tier could not do what was asked
        ├── CorruptChunk   stored bytes failed their header or checksum check
        └── TierUnavailable the tier's backing store is gone (directory removed, server down)

Faults on the data path never surface as exceptions to the engine: they are turned into
misses (recompute). These exceptions are for configuration and for direct users of a tier.
"""

from __future__ import annotations


class KVTierError(Exception):
    """Base class of every kvtier error."""


class ConfigError(KVTierError, ValueError):
    """A configuration key or value is invalid; the message names it and what is accepted."""


class TierError(KVTierError):
    """A tier operation failed."""


class CorruptChunk(TierError):
    """A stored chunk failed validation (magic, key, namespace, length or checksum)."""


class TierUnavailable(TierError):
    """The tier's backing store cannot be reached."""
