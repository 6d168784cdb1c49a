"""Movement between neighbouring tiers, by the rules of each edge.

- ``on_store: through``: chunks that reached tier t are copied to tier t+1 (a chain
  continuing what t+1 already holds), off the engine's path, once their store ended.
- ``on_evict: demote``: chunks tier t evicts go to tier t+1, each evicted chain tail with the
  ancestors t+1 lacks (so t+1 stays prefix-closed); their slots in t are free already, so
  jobs writing those slots wait for the demotion (``TransferJob.after``).
Either may cascade: a copy into t+1 can make t+1 evict (demote to t+2) and, once it ends,
copy on through t+2. Copies read tier slots only, never engine blocks; a copy's source
chunks are held (the deepest key) until it ends. A tier that has no room (full of held
chunks) drops the chain, as eviction without demotion would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtier.jobs import TransferJob
from kvtier.keys import Key
from kvtier.metrics import Metrics
from kvtier.stack.job_table import JobTable
from kvtier.stack.stack import TierStack

CopyHook = Callable[[Sequence[Key], int], None]
"""Told ``(keys, start)`` before ``keys[start:]``, the rest of a finished transfer of chain
``keys``, are copied on to the tier below (:meth:`kvtier.tier_events.TierEvents.copying`)."""


def _no_copy_hook(keys: Sequence[Key], start: int) -> None:
    return None


def _no_copied_hook(job: TransferJob) -> None:
    return None


class Movement:
    """Plans the copy jobs of every edge; owns the slots being demoted."""

    def __init__(self, stack: TierStack, jobs: JobTable, metrics: Metrics) -> None:
        self.stack = stack
        self.jobs = jobs
        self.metrics = metrics
        self.demoting: dict[tuple[int, int], int] = {}
        """(tier position, slot) freed by eviction whose bytes a demotion still reads ->
        that copy job's id. Empty unless some edge demotes."""
        self.pending: list[TransferJob] = []
        """Copies planned as jobs ended; they go into the next step's plan."""
        self.on_copy_planned: CopyHook = _no_copy_hook  # tier events name copies there
        self.on_copied: Callable[[TransferJob], None] = _no_copied_hook
        """Told of every copy that ended, after its chunks were committed (prefetch)."""

    def reserve(
        self, t: int, keys: Sequence[Key], parent: Key | None, req_id: str
    ) -> tuple[list[int], list[TransferJob]]:
        """Room in tier ``t`` for ``keys`` (a chain continuing ``parent``): the slots of the
        prefix that fits, and the demotions of what that evicted (issue them first)."""
        tier = self.stack[t]
        before = tier.index.evictions
        slots = tier.index.reserve(keys, parent)
        if tier.index.evictions != before:
            self.metrics.inc("evictions", tier.index.evictions - before, tier.name)
        if self.stack.has_below(t) and self.stack.edge(t).on_evict == "demote":
            return slots, self._demote(t, req_id)
        return slots, []

    def after(self, t: int, slots: Sequence[int]) -> list[int]:
        """Demotions a job writing ``slots`` of tier ``t`` must wait for."""
        d = self.demoting
        if not d:
            return []  # no per-slot work unless a demotion is in flight
        return sorted({d[(t, s)] for s in slots if (t, s) in d})

    def _demote(self, t: int, req_id: str) -> list[TransferJob]:
        src, dst = self.stack[t].index, self.stack[t + 1].index
        evicted = src.take_evicted()
        gone = {key: (slot, parent) for key, slot, parent in evicted}
        inner = {parent for _, _, parent in evicted if parent is not None}
        jobs: list[TransferJob] = []
        for key, _, _ in evicted:
            if key in inner:
                continue  # demoted with its deepest evicted descendant
            chain: list[tuple[Key, int, Key | None]] = []
            cur: Key | None = key
            while cur is not None and not dst.has(cur):
                if cur in gone:
                    slot, parent = gone[cur]
                elif src.has(cur):
                    slot, parent = src.slot_of(cur), src.parent_of(cur)
                else:
                    break  # an ancestor is in neither tier: the chain cannot be kept
                chain.append((cur, slot, parent))
                cur = parent
            else:
                if not chain:
                    continue  # already in the tier below: eviction lost nothing
                chain.reverse()
                ancestors = [k for k, _, _ in chain if k not in gone]
                copies = self._copy(
                    t,
                    [k for k, _, _ in chain],
                    [s for _, s, _ in chain],
                    [p for _, _, p in chain],
                    cur,
                    ancestors[-1] if ancestors else None,
                    req_id,
                )
                if copies and copies[-1].tier == self.stack[t].name:
                    copy = copies[-1]
                    for k, s in zip(copy.keys, copy.slots, strict=True):
                        if k in gone:
                            self.demoting[(t, s)] = copy.job_id
                jobs += copies
        return jobs

    def _copy(
        self,
        t: int,
        keys: list[Key],
        slots: list[int],
        parents: list[Key | None],
        anchor: Key | None,
        pin: Key | None,
        req_id: str,
    ) -> list[TransferJob]:
        """The copy of tier-``t`` chunks (a chain continuing ``anchor``) into room it
        reserves in tier t+1, preceded by the demotions that reservation caused; [] when
        t+1 has no room. ``pin``, a tier-t key, is held until the copy ends."""
        src, dst = self.stack[t], self.stack[t + 1]
        dst_slots, inner = self.reserve(t + 1, keys, anchor, req_id)
        if not dst_slots:
            return inner
        m = len(dst_slots)
        if pin is not None and pin not in keys[:m]:
            pin = keys[m - 1] if src.index.has(keys[m - 1]) else None
        holds = self.jobs.hold(src.index, pin) if pin is not None else []
        copy = TransferJob(
            job_id=0,
            req_id=req_id,
            kind="copy",
            tier=src.name,
            sync=False,
            keys=keys[:m],
            slots=slots[:m],
            block_ids=[],
            dst_tier=dst.name,
            dst_slots=dst_slots,
            parents=parents[:m],
            after=self.after(t + 1, dst_slots),
        )
        self.jobs.add(copy, holds)
        return [*inner, copy]

    def through(
        self,
        t: int,
        keys: Sequence[Key],
        slots: Sequence[int],
        parents: Sequence[Key | None],
        ok: Sequence[bool],
        req_id: str,
    ) -> None:
        """Chunks ended their store into tier ``t``: copy them on if the edge below says
        through. Only chunks that reached ``t`` go, as a chain continuing what the tier
        below already holds."""
        if not self.stack.has_below(t) or self.stack.edge(t).on_store != "through":
            return
        src, dst = self.stack[t].index, self.stack[t + 1].index
        n = 0
        while n < len(keys) and ok[n] and src.is_ready(keys[n]):
            n += 1
        if n == 0:
            return
        present = dst.stored_len(keys[:n])
        if present >= n:
            return
        anchor = keys[present - 1] if present else parents[0]
        if present:
            self.on_copy_planned(keys, present)
        self.pending += self._copy(
            t,
            list(keys[present:n]),
            list(slots[present:n]),
            list(parents[present:n]),
            anchor,
            keys[n - 1],
            req_id,
        )

    def copied(self, job: TransferJob, ok: Sequence[bool]) -> None:
        """A copy ended: its chunks become readable in the destination (the good ones),
        its demoted source slots may be reused, and it may move on through."""
        src_t, dst_t = self.stack.position[job.tier], self.stack.position[job.dst_tier]
        if self.demoting:
            for slot in job.slots:
                if self.demoting.get((src_t, slot)) == job.job_id:
                    del self.demoting[(src_t, slot)]
        self.stack[dst_t].index.commit(job.keys, ok)
        self.through(dst_t, job.keys, job.dst_slots, job.parents, ok, job.req_id)
        self.on_copied(job)
