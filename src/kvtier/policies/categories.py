"""Reuse learned per request category: is a new chain of this kind worth a slot?

Production KV reuse is skewed but predictable per request category (KVCache in the Wild,
ATC'25). Here a request's *category* is what its lookup shows at once, with no hint from
the application: whether it continues a prefix the tier holds, and how many new chunks it
brings (log2 buckets). A chat turn continues its conversation with a few new chunks, which
the next turn reuses; a one-off document brings hundreds behind a shared system prompt,
which nobody asks for again; a new conversation brings its whole prompt. The tracker
learns, online and per category, the share of new chunks that a later request asks for
again, and :meth:`CategoryReuse.worth_storing` says whether a category's chunks are worth
a slot in a full tier.

Each request's new chunks are *marked* with its category when it is observed (stored or
not). A mark is credited when a later request's lookup walks over the chunk: a reuse of its
category. Marks live in a FIFO of ``memory`` x capacity keys, so a chunk that no request
asks for while that many newer chunks arrive counts as not reused. Counts are halved every
``window`` x capacity new chunks, so rates follow the traffic. A category starts trusted
(rate 1): nothing is refused before the traffic has shown that its kind does not come
back, and a refused chunk asked for again is a reuse like any other, which reopens its
category.

Cost: ``observe`` is one C-level pass over the request's keys plus O(1) per new key
(amortised: the halving pass is over the categories, the FIFO pops what it pushed);
``worth_storing`` is O(1). Memory: at most ``memory`` x capacity marks (about 100 bytes
each: 40 MB for a tier of 200k chunks).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from itertools import repeat

from kvtier.keys import Key

SIZE_BUCKETS = 12
"""New-chunk counts are bucketed by bit length: 1, 2-3, 4-7, ..., 1024-2047, >= 2048."""
CONTINUES = SIZE_BUCKETS
"""Added to the size bucket when the request continues a prefix the tier holds."""
CATEGORIES = 2 * SIZE_BUCKETS


def category(held: int, new: int) -> int:
    """The category of a request that holds ``held`` leading chunks and brings ``new``."""
    bucket = min(new.bit_length(), SIZE_BUCKETS) - 1
    return bucket + (CONTINUES if held else 0)


class CategoryReuse:
    """Per-category reuse rates of new chunks, learned from the requests that follow."""

    def __init__(
        self, capacity: int, threshold: float = 1 / 32, memory: int = 2, window: int = 8
    ) -> None:
        self.capacity = max(1, capacity)
        self.threshold = threshold
        """A category whose chunks come back less often than this is refused in a full
        tier: a slot holding a chunk of it would rather hold anything else."""
        self.memory = memory
        """Marks kept, in multiples of the capacity: a chunk not asked for while this many
        newer chunks arrived counts as not reused."""
        self.window = window
        """Counts halve every ``window`` x capacity new chunks."""
        self.marks: OrderedDict[Key, int] = OrderedDict()
        """Chunks not asked for again since their request marked them: key -> category."""
        self.reused = [0.0] * CATEGORIES
        self.born = [0.0] * CATEGORIES
        self._since_halving = 0

    def rate(self, cat: int) -> float:
        """Share of this category's new chunks asked for again (1.0 while unknown)."""
        return (self.reused[cat] + 1.0) / (self.born[cat] + 1.0)

    def observe(self, keys: Sequence[Key], held: int) -> None:
        """One request's chain ``keys`` (root first), of which the tier holds ``held``:
        credit the marks it walks over, then mark its new chunks with its category."""
        marks = self.marks
        if marks:
            credited = [c for c in map(marks.pop, keys, repeat(None)) if c is not None]
            if credited:
                reused = self.reused
                for cat, n in Counter(credited).items():
                    reused[cat] += n
        new = len(keys) - held
        if new <= 0:
            return
        cat = category(held, new)
        marks.update(zip(keys[held:], repeat(cat)))
        self.born[cat] += new
        limit = self.memory * self.capacity
        while len(marks) > limit:
            marks.popitem(last=False)
        self._since_halving += new
        if self._since_halving > self.window * self.capacity:
            self._since_halving = 0
            self.reused = [x / 2 for x in self.reused]
            self.born = [x / 2 for x in self.born]

    def worth_storing(self, keys: Sequence[Key]) -> int:
        """How many leading ``keys`` (chunks a full tier lacks) are worth a slot: up to the
        first one marked with a category whose reuse rate is below the threshold. Chunks
        no request marked (a request's output, a restored chain) are worth it."""
        marks = self.marks
        for i, key in enumerate(keys):
            cat = marks.get(key)
            if cat is not None:
                # A request's new chunks carry one category: its first mark decides.
                return i if self.rate(cat) < self.threshold else len(keys)
        return len(keys)
