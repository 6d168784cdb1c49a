"""Tiers: where KV chunks live outside the engine (CPU, disk, Redis, ...).

The contract every kind implements is in :mod:`kvtier.contract` (index + store), the
kinds in :mod:`kvtier.tiers.cpu`, :mod:`kvtier.tiers.disk`, :mod:`kvtier.tiers.memory` and
:mod:`kvtier.tiers.remote`, the fault wrapper in :mod:`kvtier.tiers.faulty`. This package
imports none of them, so that importing the contract pulls in no kind.
"""
