"""Tier events of a hybrid model's recurrent states, in the shape vLLM gives its own.

vLLM announces a hybrid model's GPU cache per KV-cache group: the attention group's
``BlockStored`` lists every full block, and each recurrent group's lists the blocks that
hold a state (block ``i``: the state after ``(i + 1) * B`` tokens), with that group's
``group_idx`` and ``kv_cache_spec_kind="mamba"`` (``BlockPool.cache_full_blocks`` skips the
null blocks; ``KVCacheManager.take_events`` stamps the kind). So a router that understands
hybrid models finds a hit where an attention prefix ends on a block whose state is held,
and one that does not (Dynamo drops every event whose kind is not a main attention kind)
sees the attention blocks only, as it does for the GPU cache.

kvtier announces its tiers the same way (:class:`StateEvents`): the attention chunks as for
any model (:mod:`kvtier.vllm.events`), and each state in a tier as a ``BlockStored`` of one
block per recurrent group: the block that ends at the state's boundary (its hash, its
``B`` tokens, the previous block's hash as parent, ``block_size`` B), with the group's
``group_idx`` and kind, in the tier's medium. A state leaving a tier (with its attention
chunk, a failed check, a drop, a reset) is a ``BlockRemoved`` of those hashes with the
group's ``group_idx``. The bookkeeping is :class:`kvtier.tier_events.TierEvents` over the state
stack: a state is the one-key "chunk" named by the attention chunk that ends at its
boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

from kvtier.keys import Key
from kvtier.stack.states import StateCache, state_key
from kvtier.tier_events import EventRun, TierEvents


class StateEvents:
    """The recurrent states' events of one connector (see the module docstring).

    ``states``: the scheduler's state cache; ``groups``: vLLM's recurrent KV-cache groups;
    ``source``: the request's identity source for a request id (None: gone);
    ``describe(source, b0, b1)``: the fields of a ``BlockStored`` for blocks ``b0 .. b1 -
    1`` of a source (None: not describable); ``media``: per state tier, ``(medium,
    locality)``. Single-threaded (the scheduler's).
    """

    def __init__(
        self,
        states: StateCache,
        kv_cache_config: Any,
        groups: Sequence[int],
        blocks_per_chunk: int,
        source: Callable[[str], object | None],
        describe: Callable[[object, int, int], dict[str, Any] | None],
        media: Sequence[tuple[str, str | None]],
        *,
        remote: bool = False,
    ) -> None:
        self.k = blocks_per_chunk
        self.log = TierEvents(states.stack, blocks_per_chunk, shared=remote)
        self.groups = [
            (g, get_kv_cache_spec_kind(kv_cache_config.kv_cache_groups[g].kv_cache_spec).value)
            for g in groups
        ]
        self._source = source
        self._describe = describe
        self.media = list(media)
        states.cache.on_store_planned = self._planned
        states.cache.movement.on_copy_planned = self.log.copying

    def _planned(self, req_id: str, index: int, keys: Sequence[Key]) -> None:
        src = self._source(req_id)
        if src is not None:
            self.log.learn(src, index, keys if isinstance(keys, list) else list(keys))

    def looked_up(self, source: object, keys: Sequence[Key]) -> None:
        """A request whose chunk keys are ``keys`` was looked up: announce the restored
        states of its chain no tier announced yet (a no-op unless some are)."""
        if self.log.unknown <= 0:
            return
        for i, key in enumerate(keys):
            self.log.announce_one(source, i, state_key(key))
            if self.log.unknown <= 0:
                break

    def take(self) -> tuple[list[KVCacheEvent], int]:
        """The events since the last call and how many runs could not be described."""
        out: list[KVCacheEvent] = []
        dropped = 0
        for run in self.log.take():
            evs = self._stored(run) if run.stored else self._removed(run)
            if evs is None:
                dropped += 1
            else:
                out += evs
        return out, dropped

    def _stored(self, run: EventRun) -> list[KVCacheEvent] | None:
        medium, locality = self.media[run.tier]
        out: list[KVCacheEvent] = []
        for i in range(run.first, run.first + run.count):
            b = (i + 1) * self.k - 1  # the block that ends at the state's boundary
            fields = self._describe(run.source, b, b + 1)
            if fields is None:
                return None
            for g, kind in self.groups:
                out.append(
                    BlockStored(
                        **fields,
                        medium=medium,
                        group_idx=g,
                        kv_cache_spec_kind=kind,
                        locality=locality,
                    )
                )
        return out

    def _removed(self, run: EventRun) -> list[KVCacheEvent] | None:
        hashes = []
        for src, i in run.removals:
            fields = self._describe(src, (i + 1) * self.k - 1, (i + 1) * self.k)
            if fields is None:
                return None
            hashes += fields["block_hashes"]
        medium, locality = self.media[run.tier]
        return [
            BlockRemoved(block_hashes=hashes, medium=medium, group_idx=g, locality=locality)
            for g, _ in self.groups
        ]
