"""Brute-force oracles for the trace simulator (kvtier.tools.sim): a prefix-closed LRU cache
of whole blocks, and the reuse bound of an infinite one, over (hash ids, input tokens)."""

from __future__ import annotations

from collections import OrderedDict

from kvtier.tools.sim.trace import Trace

BLOCK = 512


def brute_force_lru(requests: list[tuple[tuple[int, ...], int]], slots: int) -> tuple[int, int]:
    """(hit blocks, hit tokens) of a prefix-closed LRU cache of ``slots`` blocks.

    ``requests``: (hash ids, input tokens). Blocks are identified by their prefix tuple.
    """
    order: OrderedDict[tuple[int, ...], None] = OrderedDict()  # least recent first
    n_children: dict[tuple[int, ...], int] = {}
    hit_blocks = hit_tokens = 0

    for ids, input_tokens in requests:
        prefixes = [ids[: j + 1] for j in range(len(ids))]
        n = 0
        while n < len(prefixes) and prefixes[n] in order:
            n += 1
        hit_blocks += n
        hit_tokens += min(n * BLOCK, input_tokens)
        for b in reversed(prefixes[:n]):
            order.move_to_end(b)
        parent = prefixes[n - 1] if n else None
        todo = prefixes[n:]
        if not todo:
            continue
        for _ in range(len(todo) - (slots - len(order))):
            victim = next((b for b in order if b != parent and n_children.get(b, 0) == 0), None)
            if victim is None:
                break
            del order[victim]
            if len(victim) > 1:
                n_children[victim[:-1]] -= 1
        fit = todo[: max(0, slots - len(order))]
        for b in fit:
            if len(b) > 1:
                n_children[b[:-1]] = n_children.get(b[:-1], 0) + 1
        for b in reversed(fit):
            order[b] = None
        if fit:
            for b in reversed(prefixes[:n]):
                order.move_to_end(b)
    return hit_blocks, hit_tokens


def reuse_bound(requests: list[tuple[tuple[int, ...], int]]) -> tuple[int, int]:
    """(hit blocks, hit tokens) with infinite capacity: a block hits iff its prefix was seen
    in an earlier request."""
    seen: set[tuple[int, ...]] = set()
    hit_blocks = hit_tokens = 0
    for ids, input_tokens in requests:
        n = 0
        while n < len(ids) and ids[: n + 1] in seen:
            n += 1
        hit_blocks += n
        hit_tokens += min(n * BLOCK, input_tokens)
        seen.update(ids[: j + 1] for j in range(len(ids)))
    return hit_blocks, hit_tokens


def as_requests(trace: Trace) -> list[tuple[tuple[int, ...], int]]:
    return [(r.hash_ids, r.input_tokens) for r in trace.requests]
