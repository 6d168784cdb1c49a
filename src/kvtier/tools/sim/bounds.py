"""Offline bounds of the cache simulator: Belady's MIN, an infinite cache, and the
admission-oracle bound (the reference lines of :mod:`kvtier.tools.sim.simulator`).

The admission-oracle bound: LRU that is told, offline, which chunks are worth storing.

An online policy that keeps LRU's order and only decides *what to store* can at best store
exactly the chunks that will be hit before LRU evicts them. ``lru-oracle`` estimates that
best from above by search, since the exact optimum is a hard combinatorial question:

1. pass 1 stores a chunk iff some later request uses it (never-reused chunks are refused);
2. each next pass stores only the chunks (by request and depth) that were hit before their
   eviction in the previous pass, which frees their slots for the useful ones;

and reports the best of ``passes`` passes. Every pass is an LRU cache with an admission
rule, so each is reachable by *some* admission policy: the figure is a lower estimate of the
admission-only optimum, and what an online admission rule can hope to reach next to LRU's
order. Stores are cut at the first refused chunk (a tier holds prefixes), and the order is
LRU's with ancestors refreshed after their descendants, as kvtier's ``lru`` tier does, so
the pass that stores everything equals ``lru`` (checked in the tests).

``lru-reuse`` is pass 1 alone: LRU that stores exactly the chunks some later request uses,
an admission rule that predicts reuse perfectly; no online rule predicts it better. What
the oracle reaches beyond it comes from refusing chunks that *are* used again but would be
evicted first (keeping a part of a working set larger than the tier), which a rule must
guess without knowing which part the future favours.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Container

from kvtier.keys import Key
from kvtier.tools.sim.counts import TICK_EVERY, ReplayCounts, Tick
from kvtier.tools.sim.trace import Trace

ORACLE_PASSES = 3
"""Passes of :func:`replay_lru_oracle` (its progress ticks count each)."""

Admit = Callable[[int, int], bool]
"""Whether block ``j`` of request ``i`` may be stored."""


def present_prefix(keys: list[Key], cache: Container[Key]) -> int:
    """How many of ``keys``, from the first, are in ``cache`` (a request's hit blocks)."""
    n = 0
    while n < len(keys) and keys[n] in cache:
        n += 1
    return n


def lru_pass(
    trace: Trace, slots: int, admit: Admit | None
) -> tuple[ReplayCounts, set[tuple[int, int]]]:
    """One LRU replay with admission ``admit`` (None: store everything). Returns its hits
    and the stored blocks (request, depth) that were hit before they were evicted."""
    cache: OrderedDict[Key, tuple[int, int]] = OrderedDict()
    useful: set[tuple[int, int]] = set()
    block = trace.block_tokens
    hit_blocks = hit_tokens = evictions = 0
    move = cache.move_to_end
    for i, keys in enumerate(trace.keys):
        n = present_prefix(keys, cache)
        hit_blocks += n
        hit_tokens += min(n * block, trace.tokens[i])
        for k in keys[n - 1 :: -1] if n else ():
            useful.add(cache[k])
            move(k)
        m = n
        room = slots - n
        while m < len(keys) and m - n < room and (admit is None or admit(i, m)):
            m += 1
        if m == n:
            continue
        while len(cache) + m - n > slots:
            cache.popitem(last=False)
            evictions += 1
        # Deepest first, so ancestors are the more recent (the victim is always a leaf).
        for j in range(m - 1, n - 1, -1):
            cache[keys[j]] = (i, j)
        for k in keys[n - 1 :: -1] if n else ():
            move(k)
    return ReplayCounts([hit_blocks], [hit_tokens], [evictions]), useful


def _member(blocks: set[tuple[int, int]]) -> Admit:
    return lambda i, j: (i, j) in blocks


def replay_lru_reuse(
    trace: Trace, slots: int, future: list[list[int]], *, tick: Tick | None = None
) -> ReplayCounts:
    """LRU storing exactly the chunks a later request uses (pass 1 of the oracle, module
    docstring); ``future`` comes from :func:`next_uses`."""
    never = len(trace.keys)
    got, _ = lru_pass(trace, slots, lambda i, j: future[i][j] < never)
    if tick is not None:
        tick(len(trace.keys))
    return got


def replay_lru_oracle(
    trace: Trace,
    slots: int,
    future: list[list[int]],
    *,
    passes: int = ORACLE_PASSES,
    tick: Tick | None = None,
) -> ReplayCounts:
    """The best of ``passes`` LRU replays with offline admission (module docstring);
    ``future`` comes from :func:`next_uses`."""
    never = len(trace.keys)

    def reused(i: int, j: int) -> bool:
        return future[i][j] < never

    best, useful = lru_pass(trace, slots, reused)
    for _ in range(passes - 1):
        if tick is not None:
            tick(len(trace.keys))
        got, useful = lru_pass(trace, slots, _member(useful))
        if got.hit_tokens[0] > best.hit_tokens[0]:
            best = got
    if tick is not None:
        tick(len(trace.keys))
    return best


def next_uses(trace: Trace) -> list[list[int]]:
    """``out[i][j]``: the index of the next request after i that uses block j of request i,
    or ``len(trace.keys)`` when none does (one backward pass over the trace)."""
    never = len(trace.keys)
    last: dict[Key, int] = {}
    out: list[list[int]] = [[] for _ in trace.keys]
    for i in range(len(trace.keys) - 1, -1, -1):
        keys = trace.keys[i]
        get = last.get
        out[i] = [get(k, never) for k in keys]
        for k in keys:
            last[k] = i
    return out


def replay_belady(
    trace: Trace,
    slots: int,
    future: list[list[int]],
    *,
    tick: Tick | None = None,
    check: bool = False,
) -> ReplayCounts:
    """Offline MIN with bypass on one tier of ``slots`` blocks (see
    :mod:`kvtier.tools.sim.simulator`).

    ``future`` comes from :func:`next_uses`. ``check`` asserts the cache stays prefix-closed
    (every present block of a request lies in its hit prefix).
    """
    cache: dict[Key, int] = {}  # key -> its current next use
    heap: list[tuple[int, int, Key]] = []  # (-next use, -depth, key); stale entries skipped
    push, pop = heapq.heappush, heapq.heappop
    block = trace.block_tokens
    hit_blocks = hit_tokens = evictions = 0
    for i, keys in enumerate(trace.keys):
        n = present_prefix(keys, cache)
        if check:
            assert sum(k in cache for k in keys) == n, f"request {i}: cache not prefix-closed"
        hit_blocks += n
        hit_tokens += min(n * block, trace.tokens[i])
        for j, (k, nu) in enumerate(zip(keys, future[i], strict=True)):
            cache[k] = nu
            push(heap, (-nu, -j, k))
        while len(cache) > slots:
            neg_nu, _, k = pop(heap)
            if cache.get(k) == -neg_nu:
                del cache[k]
                evictions += 1
        if tick is not None and (i + 1) % TICK_EVERY == 0:
            tick(TICK_EVERY)
    if tick is not None:
        tick(len(trace.keys) % TICK_EVERY)
    return ReplayCounts([hit_blocks], [hit_tokens], [evictions])


def replay_infinite(trace: Trace, *, tick: Tick | None = None) -> ReplayCounts:
    """Unbounded cache: a block hits iff its prefix (its key) was seen before."""
    seen: set[Key] = set()
    block = trace.block_tokens
    hit_blocks = hit_tokens = 0
    for i, keys in enumerate(trace.keys):
        n = present_prefix(keys, seen)
        hit_blocks += n
        hit_tokens += min(n * block, trace.tokens[i])
        seen.update(keys[n:])
    if tick is not None:
        tick(len(trace.keys))
    return ReplayCounts([hit_blocks], [hit_tokens], [0])
