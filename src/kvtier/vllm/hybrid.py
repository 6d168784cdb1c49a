"""vLLM glue of the recurrent-state path of hybrid models (see :mod:`kvtier.stack.states`
for what is stored and when it is a hit, :mod:`kvtier.transfer.states` for the copies).

What vLLM 0.32 gives (prefix caching on: Mamba "align" mode, one block size for every
group): block ``i`` of a recurrent group holds the state after ``(i + 1) * B`` tokens
where a step ended there; the scheduler offers the states a connector may store in
``scheduler_output.kv_connector_block_state.boundary_state_offloads`` (request -> (group,
block, boundary tokens)), valid until the end of that step; for an external hit of
``k * B`` tokens a recurrent group's blocks are ``[null] * (k - 1) + [fresh block]``, and
the fresh block must receive the state at exactly the hit. A state cannot load within the
step (``preprocess_mamba`` copies the state block into the running block before the
connector's loads start), so hybrid hits load asynchronously; with several KV-cache groups
vLLM accepts load failures only per request (``failed_recving``).

A registered recurrent layer is an int8 view ``[num_blocks, 1, 1, content]`` of a page
padded to the attention page size: the view is the unpadded content (conv state, then SSM
state), which is all kvtier copies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.contract.spec import TierSpec
from kvtier.errors import ConfigError
from kvtier.jobs import StepPlan, TransferJob, WorkerReport
from kvtier.keys import Namespace
from kvtier.manager import CacheManager
from kvtier.stack.build import build_stack, build_stores
from kvtier.stack.requests import Hit
from kvtier.stack.stack import TierStack
from kvtier.stack.states import StateCache, link_eviction, split_specs
from kvtier.transfer.engine import TransferEngine
from kvtier.transfer.states import StateMover
from kvtier.worker import WorkerSide

log = logging.getLogger("kvtier")


def state_bytes(kv_cache_config: Any, groups: Sequence[int]) -> int:
    """Bytes of one state: every layer of every recurrent group, unpadded."""
    total = 0
    for g in groups:
        group = kv_cache_config.kv_cache_groups[g]
        total += len(group.layer_names) * int(group.kv_cache_spec.real_page_size_bytes)
    return total


def state_pages(
    kv_cache_config: Any, groups: Sequence[int], kv_caches: Mapping[str, torch.Tensor]
) -> list[list[torch.Tensor]]:
    """Per recurrent group, per layer: ``[num_blocks, content bytes]`` uint8 views of the
    engine's state pages (same memory); ConfigError where a page is not what the spec
    says (its content must be dense and ``real_page_size_bytes`` long)."""
    n = kv_cache_config.num_blocks
    out = []
    for g in groups:
        group = kv_cache_config.kv_cache_groups[g]
        want = int(group.kv_cache_spec.real_page_size_bytes)
        pages = []
        for name in group.layer_names:
            t = kv_caches[name]
            if t.shape[0] != n or t[0].numel() * t.element_size() != want:
                raise ConfigError(
                    f"kvtier: recurrent layer {name}: page view {tuple(t.shape)} "
                    f"{t.dtype} is not {n} blocks of {want} bytes"
                )
            v = t.view(n, -1)
            if v.stride(1) != 1:
                raise ConfigError(f"kvtier: recurrent layer {name}: page content not dense")
            pages.append(v.view(torch.uint8))
        out.append(pages)
    return out


def boundary_offers(scheduler_output: Any) -> dict[str, list[tuple[int, int, int]]]:
    """This step's boundary-state offers (request -> [(group, block, boundary tokens)])."""
    state = getattr(scheduler_output, "kv_connector_block_state", None)
    return dict(getattr(state, "boundary_state_offloads", None) or {})


def attention_ids(
    per_group: Sequence[Sequence[int]], state_groups: Sequence[int]
) -> Sequence[Sequence[int]]:
    """The attention groups' block lists of every group's (the chunk path's)."""
    if not state_groups:
        return per_group
    return [ids for g, ids in enumerate(per_group) if g not in state_groups]


@dataclass(frozen=True)
class StateSetup:
    """What both roles derive from the vLLM config for recurrent states."""

    config: KVTierConfig
    groups: tuple[int, ...]
    """vLLM's recurrent KV-cache groups."""
    specs: tuple[TierSpec, ...]
    """The state tiers (their share of every tier, :func:`split_specs`)."""
    state_bytes: int
    """One state: every layer of every recurrent group, unpadded."""
    namespace: Namespace
    world: int
    chunk_tokens: int
    block_tokens: int

    def context(self, rank: int = 0) -> TierContext:
        """The state tiers' context: one state (one block per recurrent group) a slot."""
        return TierContext(self.state_bytes, self.namespace.for_rank(rank), 1, world=self.world)

    def log_line(self) -> str:
        return (
            f"kvtier: hybrid model: recurrent states of {self.state_bytes} bytes per chunk "
            f"boundary, in their own slots (state_share {self.config.state_share:.2f} of "
            "each tier)"
        )


def state_setup(setup: Any, kvc: Any) -> tuple[tuple[TierSpec, ...], StateSetup | None]:
    """``(attention tier specs, state setup)`` of the connector's setup: the config's
    specs and None unless the model has recurrent groups kvtier serves (then each tier's
    capacity is split, :func:`kvtier.stack.states.split_specs`)."""
    groups = setup.groups
    if not groups.state_groups or groups.recurrent:
        return setup.config.tier_specs(), None
    specs, state_specs = split_specs(setup.config)
    return specs, StateSetup(
        setup.config,
        groups.state_groups,
        state_specs,
        state_bytes(kvc, groups.state_groups),
        setup.namespace,
        setup.world_size,
        setup.chunk_tokens,
        setup.block_tokens,
    )


class HybridScheduler:
    """The scheduler role's state path: the vLLM hooks of :class:`StateCache`."""

    def __init__(self, s: StateSetup, manager: CacheManager, attention: TierStack) -> None:
        self.manager = manager
        self.cache = StateCache(
            s.config,
            manager.layout,
            s.namespace,
            build_stack(s.config, s.context(), s.specs),
            s.groups,
            s.chunk_tokens,
            s.block_tokens,
            num_workers=s.world,
            metrics=manager.metrics,
        )
        self._attention = attention

    def link(self) -> None:
        """Tie each state to its attention chunk; after the tier events took their
        listeners (:func:`link_eviction` keeps them)."""
        link_eviction(self._attention, self.cache.stack)

    def trim(self, req_id: str, hit: Hit, num_tokens: int) -> Hit | None:
        """The request's hit cut at the longest stored state (the manager keeps the cut
        hit); None: ask again later."""
        if hit.tokens <= 0:
            return hit
        keys = self.manager.requests.chain_keys(req_id)
        cut = self.cache.trim(req_id, hit, keys, num_tokens)
        if cut is not None:
            self.manager.requests.set_hit(req_id, cut)
        return cut

    def step(self, scheduler_output: Any, requests: Mapping[str, Any]) -> StepPlan:
        """Offer this step's boundary states; the state jobs of the step."""
        for req_id, offers in boundary_offers(scheduler_output).items():
            request = requests.get(req_id)
            if request is None:
                continue
            top = max(b for _, _, b in offers)
            keys = self.manager.requests.chain_keys(req_id, request.all_token_ids[:top])
            for group, block, boundary in offers:
                self.cache.offer(req_id, group, block, boundary, keys)
        return self.cache.build_step()

    def pending(self) -> bool:
        return self.cache.cache.has_pending_jobs()

    def on_report(self, report: WorkerReport) -> None:
        if report.states is not None:
            self.cache.cache.on_report(report.states)


class HybridWorkerSide(WorkerSide):
    """The worker side of a hybrid model: attention chunks as for any model, and the
    recurrent states' jobs (``plan.states``) on a :class:`StateMover`. A request's receive
    is whole once its attention loads and its state load are; it failed if either did."""

    def __init__(
        self,
        engine: TransferEngine,
        mover: StateMover,
        *,
        layers: Sequence[tuple[Sequence[str], Sequence[int]]] = (),
    ) -> None:
        super().__init__(engine, layers=layers)
        self.mover = mover
        self.parts = ReceiveParts()
        self._done_failed: set[str] = set()

    @staticmethod
    def mover_for(
        s: StateSetup, kvc: Any, kv_caches: Mapping[str, torch.Tensor], rank: int
    ) -> StateMover:
        pages = state_pages(kvc, s.groups, kv_caches)
        log.info(
            "kvtier worker: recurrent states of %d bytes (%d layers in %d groups)",
            s.state_bytes,
            sum(len(g) for g in pages),
            len(pages),
        )
        return StateMover(pages, build_stores(s.config, s.context(rank), s.specs))

    def begin_step(self, plan: StepPlan) -> None:
        super().begin_step(plan)
        states = plan.states or StepPlan()
        self.parts.expect(plan.loads)
        self.parts.expect(states.loads)
        self.mover.begin_step(states)

    def start_loads(self) -> None:
        super().start_loads()
        self.mover.start_loads()

    def end_forward(self) -> None:
        super().end_forward()
        self.mover.end_forward()  # offers hold only until the step ends

    def transfer_results(self) -> tuple[set[str], set[str]]:
        sending, recving = super().transfer_results()
        attention = (recving, super().failed_requests(recving))
        done, failed = self.parts.results([attention, self.mover.transfer_results()])
        self._done_failed |= failed
        return sending, done

    def failed_requests(self, finished: set[str]) -> set[str]:
        out = self._done_failed & finished
        self._done_failed -= out
        return out

    def report(self) -> WorkerReport:
        rep = super().report()
        rep.states = self.mover.report()
        return rep

    def close(self) -> None:
        super().close()
        self.mover.close()


class ReceiveParts:
    """Which requests' async loads are whole across several sides (the attention chunks'
    worker, the states' mover), each of which reports its own receives and failures."""

    def __init__(self) -> None:
        self._parts: dict[str, int] = {}
        """Request -> sides whose async loads it still waits for."""
        self._failed: set[str] = set()

    def expect(self, loads: Iterable[TransferJob]) -> None:
        """One side's async loads of a step: their requests wait for that side too."""
        for req_id in {j.req_id for j in loads if not j.sync}:
            self._parts[req_id] = self._parts.get(req_id, 0) + 1

    def results(self, sides: Iterable[tuple[set[str], set[str]]]) -> tuple[set[str], set[str]]:
        """``(finished receiving, failed receiving)`` of the sides' ``(received, failed)``
        since the last call: a request is finished once every side it waited for is; it
        failed if any did (it is then in both sets, as vLLM wants: a failed receive also
        ends the wait)."""
        done: set[str] = set()
        for recving, failed in sides:
            self._failed |= failed
            for req_id in recving:
                left = self._parts.get(req_id, 1) - 1
                if left > 0:
                    self._parts[req_id] = left
                    continue
                self._parts.pop(req_id, None)
                done.add(req_id)
        failed_done = done & self._failed
        self._failed -= done
        return done, failed_done
