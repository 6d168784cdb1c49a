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

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvtier.errors import ConfigError
from kvtier.jobs import StepPlan
from kvtier.transfer.states import StateMover


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


class HybridWorker:
    """The worker role's state path: the state mover, and which requests' loads are
    whole (attention and state) or failed."""

    def __init__(self, mover: StateMover) -> None:
        self.mover = mover
        self._parts: dict[str, int] = {}
        """Request -> sides (attention, states) whose async loads it still waits for."""
        self._failed: set[str] = set()

    def begin_step(self, plan: StepPlan, states: StepPlan | None) -> None:
        sides = [plan.loads, states.loads if states is not None else []]
        for loads in sides:
            for req_id in {j.req_id for j in loads if not j.sync}:
                self._parts[req_id] = self._parts.get(req_id, 0) + 1
        self.mover.begin_step(states or StepPlan())

    def results(self, attn_recving: set[str], attn_failed: set[str]) -> tuple[set[str], set[str]]:
        """``(finished receiving, failed receiving)``: a request is finished once both
        sides are; it failed if either side did (it is then in both sets, as vLLM wants:
        a failed receive also ends the wait)."""
        s_recving, s_failed = self.mover.transfer_results()
        self._failed |= attn_failed | s_failed
        done: set[str] = set()
        for req_id in [*attn_recving, *s_recving]:
            left = self._parts.get(req_id, 1) - 1
            if left > 0:
                self._parts[req_id] = left
                continue
            self._parts.pop(req_id, None)
            done.add(req_id)
        failed = done & self._failed
        self._failed -= done
        return done, failed
