"""Which of vLLM's KV-cache layouts kvtier serves, read from the KV-cache spec vLLM gives.

vLLM describes a model's KV cache as *groups* of layers that share a block table, each
with a spec (``vllm.v1.kv_cache_interface``). kvtier serves:

- ``FullAttentionSpec`` (dense MHA/GQA/MQA, and sliding-window layers vLLM allocates at
  full length when its hybrid KV-cache manager, HMA, is off), including
  ``MLAAttentionSpec`` (one latent per token: no separate V);
- ``SlidingWindowSpec`` groups (the engine frees blocks that left the window;
  kvtier stores a chunk only while all its blocks are held, and loads only the blocks the
  engine allocated, i.e. those the window of the hit still needs);
- several such groups at once (gpt-oss, Gemma 3 with HMA on).

Hybrid recurrent-state models (Mamba / linear-attention groups, ``MambaSpec``, next to
attention groups: Qwen3-Next, Granite 4.0-H, Falcon-H1, Jamba, Bamba): the attention
groups go the chunk path, the recurrent groups (:attr:`GroupKinds.state_groups`) the state
path (:mod:`kvtier.vllm.hybrid`): a hit restores a request only with the recurrent state
at exactly the hit's boundary. Where kvtier cannot store or restore those states (vLLM's
Mamba cache mode is not "align", i.e. prefix caching off; speculative Mamba blocks;
tensor parallel) the model starts with offload off (:attr:`GroupKinds.recurrent`, one
``kvtier:`` line): kvtier neither stores nor loads (every request is unkeyable, reason
:data:`RECURRENT`), and vLLM's own prefix cache serves the model as without kvtier.

Everything else is refused at engine start with one ``kvtier:`` line naming the layout
and what to do (:class:`UnsupportedLayout`): recurrent-state models without attention,
chunked-local, cross/encoder-only attention, per-token quantised KV, packed states; and on
vLLM's CPU backend MLA and sliding-window layers with attention sinks allocated at full
length (gpt-oss with HMA off), where vLLM itself gives wrong tokens.
A refusal is preferred over serving a layout kvtier has not been checked against: an
unchecked layout risks wrong tokens, a refusal costs only the offload.

Geometry comes from the spec (heads, head sizes, dtype, window), never from tensor shapes;
the worker checks the engine's actual block bytes against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.errors import ConfigError
from kvtier.layout import AttentionKind, KVGroup, KVLayout

_OFF = "remove kvtier (--kv-transfer-config) to serve this model without offload"
RECURRENT = "recurrent-state"
"""The ``unkeyable`` reason of every request of a hybrid recurrent-state model (the
``input`` label of ``kvtier_unkeyable_requests_total``)."""


class UnsupportedLayout(ConfigError):
    """A KV-cache layout kvtier does not serve; the message is the operator's one line."""


@dataclass(frozen=True)
class GroupKinds:
    """kvtier's reading of a KV-cache config."""

    layout: KVLayout
    """Geometry of every layer (several KVGroups per vLLM group where its specs differ)."""
    num_groups: int
    """vLLM's KV-cache groups (1: a block id addresses every layer)."""
    frees_blocks: bool
    """Some group frees blocks while its request runs (sliding window with HMA on): the
    worker must finish a step's stores before the engine may reuse those blocks."""
    recurrent: str = ""
    """Non-empty (the operator's ``kvtier:`` line) when the model has recurrent-state
    groups that kvtier cannot serve: it offloads nothing for it (see the module
    docstring)."""
    state_groups: tuple[int, ...] = ()
    """vLLM's recurrent-state (``MambaSpec``) KV-cache groups, served by the state path
    (:mod:`kvtier.vllm.hybrid`) unless ``recurrent`` says why not."""

    @property
    def attention_groups(self) -> int:
        """vLLM's KV-cache groups holding attention KV (what the chunk path copies)."""
        return self.num_groups - len(self.state_groups)


def _name(spec: Any) -> str:
    return type(spec).__name__


def _refuse(what: str, advice: str = _OFF) -> UnsupportedLayout:
    return UnsupportedLayout(f"kvtier: {what} is not supported; {advice}")


def _attention_group(spec: Any, layers: int) -> KVGroup:
    """One attention spec as a KVGroup, or UnsupportedLayout."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVQuantMode,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    name = _name(spec)
    mode = getattr(spec, "kv_quant_mode", KVQuantMode.NONE)
    if mode not in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR):
        raise _refuse(f"quantised KV cache ({KVQuantMode(mode).name}, {name})")
    if getattr(spec, "tokens_per_state", 1) != 1 or getattr(spec, "state_content_bytes", None):
        raise _refuse(f"packed KV states ({name})")
    value_dim = getattr(spec, "head_size_v", spec.head_size)
    common = {
        "num_kv_heads": spec.num_heads,
        "head_dim": spec.head_size,
        "dtype": str(spec.dtype),
        "value_dim": None if value_dim == spec.head_size else value_dim,
    }
    # Exact types: subclasses (RSWA, sink, hidden-state, sliding MLA...) change what a
    # block holds or when it is freed, and kvtier has not been checked against them.
    if type(spec) in (FullAttentionSpec, MLAAttentionSpec):
        if getattr(spec, "non_causal", False):
            raise _refuse(f"non-causal attention ({name})")
        # A sliding/chunked window on a full spec: HMA is off and vLLM keeps every
        # token's KV, so the blocks are full-attention blocks as far as kvtier goes.
        return KVGroup(AttentionKind.FULL, layers, **common)
    if type(spec) is SlidingWindowSpec:
        if getattr(spec, "extra_retained_tokens", 0):
            raise _refuse(f"sliding window with retained extra tokens ({name}, spec decoding)")
        return KVGroup(
            AttentionKind.SLIDING,
            layers,
            window=spec.sliding_window,
            block_tokens=spec.block_size,
            **common,
        )
    raise _refuse(f"KV-cache layout {name}")


def sink_layers(vllm_config: Any) -> frozenset[str]:
    """Names of the attention layers with attention sinks (vLLM's ``Attention.has_sink``).

    Read from the layers registered in ``vllm_config``'s static forward context, which is
    filled in the process that loaded the model (a worker; the scheduler too when it shares
    that process). Empty where no layer is registered: a process without the model cannot
    tell, and the worker, which always has it, decides then.
    """
    context = getattr(vllm_config.compilation_config, "static_forward_context", None) or {}
    return frozenset(n for n, layer in context.items() if getattr(layer, "has_sink", False))


def read_groups(
    kv_cache_config: Any,
    cpu: bool = False,
    sinks: frozenset[str] = frozenset(),
    world: int = 1,
) -> GroupKinds:
    """kvtier's view of ``kv_cache_config`` or UnsupportedLayout (see the module docstring).

    ``cpu``: the engine runs on vLLM's CPU platform, where

    - MLA cannot prefill over cached context (vLLM turns its own prefix caching off for
      MLA there): a hit would give wrong tokens, so MLA is refused;
    - sliding-window layers with attention sinks (``sinks``: their layer names, see
      :func:`sink_layers`) allocated as full attention, i.e. with vLLM's hybrid KV-cache
      manager (HMA) off, give wrong and run-to-run different tokens with or without
      kvtier (gpt-oss), so that layout is refused; with HMA on, kvtier serves it.

    On GPU both are accepted (untested there). ``world``: ranks (tensor x pipeline
    parallel) sharing the model; recurrent states are served only with one.
    """
    from vllm.v1.kv_cache_interface import (
        AttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        UniformTypeKVCacheSpecs,
    )

    groups: list[KVGroup] = []
    recurrent: list[str] = []
    state_groups: list[int] = []
    off: list[str] = []
    frees = False
    cfg_groups = list(kv_cache_config.kv_cache_groups)
    if not cfg_groups:
        raise _refuse("a model without KV cache (attention-free)")
    for i, g in enumerate(cfg_groups):
        spec = g.kv_cache_spec
        if not getattr(g, "enable_kv_transfer", True):
            raise _refuse(f"KV-cache group {i} that vLLM marks not transferable")
        if isinstance(spec, MambaSpec):
            groups.append(_recurrent_group(spec, len(g.layer_names)))
            kind = getattr(spec.mamba_type, "name", spec.mamba_type)
            recurrent.append(f"group {i}: {_name(spec)} {kind}")
            state_groups.append(i)
            off += _state_limits(spec, i)
            continue
        if isinstance(spec, UniformTypeKVCacheSpecs):
            named = list(spec.kv_cache_specs.items())
        else:
            named = [(n, spec) for n in g.layer_names]
        per_layer = [s for _, s in named]
        for s in per_layer:
            if not isinstance(s, AttentionSpec):
                raise _refuse(f"KV-cache layout {_name(s)} (group {i})")
        if cpu and any(isinstance(s, MLAAttentionSpec) for s in per_layer):
            raise _refuse(
                "MLA on vLLM's CPU backend",
                "vLLM's CPU MLA cannot prefill over cached KV (vLLM disables its own prefix "
                f"caching for it), so a hit would give wrong tokens; {_OFF}",
            )
        # A sliding window on a full spec is a sliding layer vLLM keeps at full length:
        # HMA is off (with it on, the layer has a SlidingWindowSpec).
        promoted = [n for n, s in named if isinstance(s, FullAttentionSpec) and s.sliding_window]
        if cpu and sinks.intersection(promoted):
            raise _refuse(
                "sliding window with attention sinks and HMA off (vLLM's hybrid KV-cache "
                f"manager; group {i} keeps sliding layers at full length) on vLLM's CPU "
                "backend",
                "vLLM gives wrong tokens for it there, with or without kvtier: drop "
                "--disable-hybrid-kv-cache-manager (disable_hybrid_kv_cache_manager=True) "
                "so that HMA stays on, which kvtier serves",
            )
        for s in _distinct(per_layer):
            kv = _attention_group(s, sum(1 for x in per_layer if x == s))
            frees = frees or kv.kind is AttentionKind.SLIDING
            groups.append(kv)
    if recurrent and all(x.kind is AttentionKind.MAMBA for x in groups):
        raise _refuse(f"recurrent-state model without attention layers ({'; '.join(recurrent)})")
    if recurrent and world > 1:
        off.append(
            f"tensor parallel size {world} (each rank's shard of the recurrent state is not "
            "checked against kvtier's per-rank keys yet)"
        )
    note = ""
    if off:
        note = (
            f"kvtier: hybrid recurrent-state model ({'; '.join(recurrent)}, Mamba/linear "
            f"attention layers) with {'; '.join(dict.fromkeys(off))}: offload is off for "
            "it, kvtier stores and loads nothing (a hit needs the recurrent state at exactly "
            "its boundary); vLLM's own prefix cache still serves it"
        )
    return GroupKinds(KVLayout(tuple(groups)), len(cfg_groups), frees, note, tuple(state_groups))


def _state_limits(spec: Any, i: int) -> list[str]:
    """Why kvtier cannot store or restore the states of recurrent group ``i`` (empty: it
    can). vLLM keeps states at block boundaries only in its "align" cache mode (prefix
    caching on); speculative blocks (MTP/EAGLE) hold states past the boundary."""
    out = []
    mode = getattr(spec, "mamba_cache_mode", "none")
    if mode != "align":
        out.append(
            f"Mamba cache mode {mode!r} (group {i}; vLLM keeps boundary states only in "
            "'align' mode, with prefix caching on: enable_prefix_caching=True)"
        )
    if getattr(spec, "num_speculative_blocks", 0):
        out.append(f"speculative Mamba blocks (group {i}, MTP/EAGLE speculative decoding)")
    return out


def _recurrent_group(spec: Any, layers: int) -> KVGroup:
    """A Mamba / linear-attention group as kvtier describes it (never copied: its state
    bytes enter the layout digest only)."""
    return KVGroup(
        AttentionKind.MAMBA,
        layers,
        dtype=str(spec.dtypes[0]),
        state_bytes=int(spec.real_page_size_bytes),
    )


def _distinct(specs: list[Any]) -> list[Any]:
    out: list[Any] = []
    for s in specs:
        if s not in out:
            out.append(s)
    return out
