"""kvtier's tier events as vLLM KV events (``BlockStored`` / ``BlockRemoved``).

:class:`ConnectorEvents` joins the engine-agnostic log (:mod:`kvtier.tier_events`) to vLLM: it
learns each planned store's identity from the request (its token ids and the block hashes
vLLM computed for it), and turns the log's runs into vLLM's own event classes, which the
scheduler publishes after the engine's events of the step (``KVConnectorBase_V1.
take_events``). It exists only when ``kv_events_config.enable_kv_cache_events`` is on.

What an event says, in vLLM's self-describing form:

- ``BlockStored``: the engine blocks of a run of chunks became readable in a tier. One
  kvtier chunk is ``k = chunk_tokens / block_size`` engine blocks: the event lists their
  ``k * chunks`` block hashes (``maybe_convert_block_hash`` of ``request.block_hashes``,
  the same values as the engine's own events), ``parent_block_hash`` = the hash of the block
  just before the run (None at the root), the run's token ids, ``block_size`` = the
  engine's, ``lora_id`` / ``lora_name`` / ``extra_keys`` as the engine computes them,
  the attention group's ``group_idx`` (0 but for a hybrid model whose recurrent groups
  come first) and ``kv_cache_spec_kind``. A hybrid model's recurrent states are announced
  as vLLM announces its own (:mod:`kvtier.vllm.state_events`).
- ``BlockRemoved``: those blocks left the tier (eviction, a failed store or check, reset).
- ``medium``: "CPU" for host-memory tiers (cpu, private memory), "STORAGE" for disk and
  shared tiers; shared tiers also say ``locality="REMOTE"``. Never any other name.

Faults: building an event must never fail the engine's step; a run that cannot be described
(e.g. the engine computed no block hashes, prefix caching off) is dropped and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

from kvtier.keys import Key
from kvtier.manager import CacheManager
from kvtier.stack.stack import StackTier
from kvtier.stack.states import StateCache
from kvtier.tier_events import EventRun, TierEvents
from kvtier.vllm.state_events import StateEvents

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("kvtier")


def events_enabled(vllm_config: VllmConfig) -> bool:
    """Whether the engine publishes KV events (``--kv-events-config`` with events on)."""
    cfg = vllm_config.kv_events_config
    return cfg is not None and bool(cfg.enable_kv_cache_events)


def tier_medium(tier: StackTier) -> tuple[str, str | None]:
    """``(medium, locality)`` of a tier's events."""
    if tier.shared:
        return MEDIUM_STORAGE, "REMOTE"
    if tier.capabilities.byte_addressable:  # chunks in this host's memory
        return MEDIUM_CPU, None
    return MEDIUM_STORAGE, None


class RequestSource:
    """Where a request's chunks' identities are read from: references to the request's
    token ids and block hashes (lists vLLM only appends to), read when an event is built.
    The request itself is kept only if its blocks have extra keys (LoRA, multimodal,
    cache salt, prompt embeddings), which vLLM derives from it."""

    __slots__ = ("hashes", "lora_id", "lora_name", "request", "tokens")

    def __init__(self, request: Request) -> None:
        self.tokens = request.all_token_ids
        self.hashes = request.block_hashes
        lora = request.lora_request
        self.lora_id = lora.adapter_id if lora else None
        self.lora_name = lora.name if lora else None
        extra = (
            lora is not None
            or bool(request.cache_salt)
            or bool(request.mm_features)
            or request.prompt_embeds is not None
        )
        self.request: Request | None = request if extra else None


class ConnectorEvents:
    """The scheduler-side events of one :class:`~kvtier.vllm.connector.KVTierConnector`.

    ``requests``: the connector's live requests by id (a planned store's identity is read
    from there). A hybrid model's recurrent states (``states``, in vLLM's recurrent groups
    ``states.groups``) are announced too (:mod:`kvtier.vllm.state_events`); the attention
    chunks are then those of the first other group. Single-threaded (the scheduler's).
    """

    def __init__(
        self,
        manager: CacheManager,
        requests: Mapping[str, Request],
        kv_cache_config: KVCacheConfig,
        block_size: int,
        *,
        remote: bool = False,
        states: StateCache | None = None,
    ) -> None:
        self.manager = manager
        self.requests = requests
        self.block_size = block_size
        self.blocks_per_chunk = manager.blocks_per_chunk
        self.log = TierEvents(manager.stack, self.blocks_per_chunk, shared=remote)
        self.media = [tier_medium(t) for t in manager.stack.tiers]
        groups = kv_cache_config.kv_cache_groups
        state_groups = states.groups if states is not None else ()
        self.group = next(g for g in range(len(groups)) if g not in state_groups)
        spec = groups[self.group].kv_cache_spec
        self.spec_kind = get_kv_cache_spec_kind(spec).value
        self.sliding_window = get_kv_cache_spec_sliding_window(spec)
        self._sources: dict[str, RequestSource] = {}
        self.dropped_runs = 0
        """Runs that could not be described (no block hashes): not published."""
        self.convert: Callable[[Any], Any] = maybe_convert_block_hash
        manager.on_store_planned = self._planned
        manager.movement.on_copy_planned = self.log.copying
        self.states: StateEvents | None = None
        if states is not None:
            self.states = StateEvents(
                states,
                kv_cache_config,
                state_groups,
                self.blocks_per_chunk,
                self._source_of,
                self._fields,
                [tier_medium(t) for t in states.stack.tiers],
                remote=remote,
            )

    def _source_of(self, req_id: str) -> RequestSource | None:
        request = self.requests.get(req_id)
        return self._source(request) if request is not None else None

    def _source(self, request: Request) -> RequestSource:
        src = self._sources.get(request.request_id)
        if src is None:
            src = self._sources[request.request_id] = RequestSource(request)
        return src

    def _planned(self, req_id: str, first: int, keys: Sequence[Key]) -> None:
        request = self.requests.get(req_id)
        if request is not None:  # the manager's list is the store's own: kept as it is
            kept = keys if isinstance(keys, list) else list(keys)
            self.log.learn(self._source(request), first, kept)

    def looked_up(self, request: Request) -> None:
        """A request was looked up: announce what restored tiers hold of its prefix (a
        no-op, O(1), unless some restored chunk was never announced)."""
        if self.log.unknown > 0:
            keys = self.manager.requests.chain_keys(request.request_id)
            self.log.announce_held(self._source(request), keys)
        if self.states is not None and self.states.log.unknown > 0:
            keys = self.manager.requests.chain_keys(request.request_id)
            self.states.looked_up(self._source(request), keys)

    def finished(self, req_id: str) -> None:
        """The request is gone (its chunks' identities keep what they need of it)."""
        self._sources.pop(req_id, None)

    def pending(self) -> bool:
        return self.log.pending() or (self.states is not None and self.states.log.pending())

    def take(self) -> list[KVCacheEvent]:
        """vLLM events for the log's runs since the last call (bounded per call)."""
        out: list[KVCacheEvent] = []
        for run in self.log.take():
            try:
                ev = self._stored(run) if run.stored else self._removed(run)
            except Exception:  # an event must never fail the engine's step
                log.exception("kvtier: could not build a KV event; dropped")
                ev = None
            if ev is None:
                self.dropped_runs += 1
            else:
                out.append(ev)
        if self.states is not None:
            try:
                evs, dropped = self.states.take()
            except Exception:  # as above
                log.exception("kvtier: could not build a state's KV event; dropped")
                evs, dropped = [], 1
            out += evs
            self.dropped_runs += dropped
        return out

    def _stored(self, run: EventRun) -> BlockStored | None:
        k = self.blocks_per_chunk
        fields = self._fields(run.source, run.first * k, (run.first + run.count) * k)
        if fields is None:
            return None
        medium, locality = self.media[run.tier]
        return BlockStored(
            **fields,
            medium=medium,
            group_idx=self.group,
            kv_cache_spec_kind=self.spec_kind,
            kv_cache_spec_sliding_window=self.sliding_window,
            locality=locality,
        )

    def _fields(self, src: object, b0: int, b1: int) -> dict[str, Any] | None:
        """A ``BlockStored``'s description of engine blocks ``b0 .. b1 - 1`` of ``src``
        (hashes, parent, tokens, LoRA, extra keys); None if the engine computed no hashes
        for them."""
        assert isinstance(src, RequestSource)
        if len(src.hashes) < b1:
            return None
        bs, convert = self.block_size, self.convert
        return {
            "block_hashes": [convert(h) for h in src.hashes[b0:b1]],
            "parent_block_hash": convert(src.hashes[b0 - 1]) if b0 > 0 else None,
            "token_ids": list(src.tokens[b0 * bs : b1 * bs]),
            "block_size": bs,
            "lora_id": src.lora_id,
            "lora_name": src.lora_name,
            "extra_keys": self._extra_keys(src, b0, b1),
        }

    def _extra_keys(self, src: RequestSource, b0: int, b1: int) -> list[Any] | None:
        if src.request is None:
            return None
        bs, mm_idx, keys = self.block_size, 0, []
        for b in range(b0, b1):
            extra, mm_idx = generate_block_hash_extra_keys(
                src.request, b * bs, (b + 1) * bs, mm_idx
            )
            keys.append(extra)
        return to_event_extra_keys(keys)

    def _removed(self, run: EventRun) -> BlockRemoved | None:
        k, convert = self.blocks_per_chunk, self.convert
        hashes = []
        for src, i in run.removals:
            assert isinstance(src, RequestSource)
            if len(src.hashes) < (i + 1) * k:
                return None
            hashes += [convert(h) for h in src.hashes[i * k : (i + 1) * k]]
        medium, locality = self.media[run.tier]
        return BlockRemoved(
            block_hashes=hashes, medium=medium, group_idx=self.group, locality=locality
        )
